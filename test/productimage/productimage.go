// Package productimage builds the driver's container image without a
// container engine: the image the Dockerfile describes, as an OCI image
// archive (package ociimage) that `ctr images import` and `podman load`
// read. make image-oci runs it (test/cmd/kyb-image) where `make image` has
// no Docker engine to build with.
//
// The Dockerfile stays the one recipe: the binaries come from its build
// stage's RUN ... go build line, run as written with its ARGs; the labels,
// user, entrypoint and the binaries' directory come from its runtime stage,
// which may hold nothing this package does not reproduce. Only the base
// image is replaced: Debian's packages in place of distroless (see
// runtime.go for what and why). hack/image-check.sh checks that both
// builds give the same binaries and configuration.
package productimage

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kyb-ai/kyb-dra-driver/test/ociimage"
)

// BasePath is the PATH of the Dockerfile's base image, which the image
// keeps.
const BasePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Options say what to build.
type Options struct {
	// Dockerfile is the recipe; Context the directory it builds in (the
	// repository's root).
	Dockerfile, Context string
	// BuildArgs are the recipe's arguments, as docker build --build-arg.
	BuildArgs map[string]string
	// Name is the image's reference, IMAGE:VERSION.
	Name string
	// DebDir holds the Debian packages, downloaded once.
	DebDir string
	// Packages are the runtime's Debian packages; DefaultPackages if empty.
	Packages []string
	// Created is the image's time and its files'.
	Created time.Time
	// Log receives what the build runs and prints.
	Log io.Writer
}

// Build builds the image: the Dockerfile's go build, then the runtime and
// the binaries as two layers.
func Build(ctx context.Context, opts Options) (ociimage.Image, error) {
	recipe, err := ReadDockerfile(opts.Dockerfile, opts.BuildArgs)
	if err != nil {
		return ociimage.Image{}, err
	}
	out, err := os.MkdirTemp("", "kyb-image-out-")
	if err != nil {
		return ociimage.Image{}, err
	}
	defer func() { _ = os.RemoveAll(out) }()
	if err := recipe.BuildBinaries(ctx, opts.Context, out, opts.Log); err != nil {
		return ociimage.Image{}, err
	}
	bins, err := recipe.BinariesLayer(out)
	if err != nil {
		return ociimage.Image{}, err
	}
	packages := opts.Packages
	if len(packages) == 0 {
		packages = DefaultPackages
	}
	debs, err := FetchDebs(ctx, opts.DebDir, packages, opts.Log)
	if err != nil {
		return ociimage.Image{}, err
	}
	base, err := RuntimeLayer(ctx, debs)
	if err != nil {
		return ociimage.Image{}, err
	}
	base.CreatedBy += " (in place of " + recipe.Base + ")"
	return ociimage.Image{
		Name:     opts.Name,
		Platform: v1.Platform{OS: runtime.GOOS, Architecture: runtime.GOARCH},
		Created:  opts.Created,
		Config: v1.ImageConfig{
			User:       recipe.User,
			Entrypoint: recipe.Entrypoint,
			Env:        append([]string{BasePath}, recipe.Env...),
			Labels:     recipe.Labels,
		},
		Layers: []ociimage.Layer{base, bins},
	}, nil
}

// BuildBinaries runs the build stage's go build in dir, writing into out
// what the Dockerfile's build writes into its OutDir. The shell is as a
// RUN's: the stage's ARGs as environment variables, as Docker gives them,
// no GOFLAGS (the golang image sets none), and umask 022, which makes the
// binaries' modes 0755 whatever the caller's umask.
func (r Recipe) BuildBinaries(ctx context.Context, dir, out string, log io.Writer) error {
	command := strings.ReplaceAll(r.BuildCommand, r.OutDir, strings.TrimSuffix(out, "/")+"/")
	_, _ = fmt.Fprintf(log, "(cd %s && %s)\n", dir, command)
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", "umask 022 && "+command)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOFLAGS=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(r.BuildEnv)) {
		cmd.Env = append(cmd.Env, k+"="+r.BuildEnv[k])
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("the Dockerfile's go build (line %d): %w", r.BuildLine, err)
	}
	return nil
}

// BinariesLayer is the runtime stage's COPY: the files the build wrote
// into out, in BinDir, owned by root with the build's modes, as COPY
// without --chown/--chmod gives them. It reads the files: out may go.
func (r Recipe) BinariesLayer(out string) (ociimage.Layer, error) {
	entries, err := os.ReadDir(out)
	if err != nil {
		return ociimage.Layer{}, err
	}
	if len(entries) == 0 {
		return ociimage.Layer{}, fmt.Errorf("the Dockerfile's go build (line %d) wrote nothing into %s", r.BuildLine, r.OutDir)
	}
	dir := strings.Trim(path.Clean(r.BinDir), "/")
	l := ociimage.Layer{CreatedBy: fmt.Sprintf("COPY --from=build %s %s", r.OutDir, r.BinDir)}
	for p := dir; p != "."; p = path.Dir(p) {
		l.Files = append(l.Files, ociimage.File{Path: p, Type: ociimage.Dir, Mode: 0o755})
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			return ociimage.Layer{}, err
		}
		if !info.Mode().IsRegular() {
			return ociimage.Layer{}, fmt.Errorf("the go build wrote %s, which is not a regular file", e.Name())
		}
		data, err := os.ReadFile(filepath.Join(out, e.Name()))
		if err != nil {
			return ociimage.Layer{}, err
		}
		l.Files = append(l.Files, ociimage.File{Path: path.Join(dir, e.Name()), Data: data, Mode: int64(info.Mode().Perm())})
	}
	return l, nil
}
