// Command kyb-image builds the driver's container image without a
// container engine, as an OCI image archive (make image-oci), and shows
// what an image archive holds (hack/image-check.sh compares the archive
// with the Dockerfile's build, and with docker save where Docker runs).
//
//	kyb-image build -image REF -o FILE [-dockerfile F] [-context DIR] [-build-arg K=V]... [-debs DIR]
//	kyb-image inspect [-under DIR] [-extract DIR] ARCHIVE
//
// The image's time, and its files', is SOURCE_DATE_EPOCH (seconds) when
// set, else the epoch: the same sources give the same image digest.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/test/ociimage"
	"github.com/kyb-ai/kyb-dra-driver/test/productimage"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	if err := run(os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "kyb-image %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func run(command string, args []string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch command {
	case "build":
		return build(ctx, args)
	case "inspect":
		return inspect(args, os.Stdout)
	default:
		usage()
		return nil
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: kyb-image build -image REF -o FILE [flags] | kyb-image inspect [flags] ARCHIVE (-h for flags)")
	os.Exit(2)
}

// buildArgs is a repeated -build-arg NAME=VALUE flag.
type buildArgs map[string]string

func (b buildArgs) String() string { return fmt.Sprint(map[string]string(b)) }

func (b buildArgs) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want NAME=VALUE, not %q", s)
	}
	b[k] = v
	return nil
}

func build(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	opts := productimage.Options{BuildArgs: buildArgs{}, Log: os.Stderr}
	fs.StringVar(&opts.Context, "context", ".", "the repository's root, where the Dockerfile's go build runs")
	fs.StringVar(&opts.Dockerfile, "dockerfile", "", "the Dockerfile (default: Dockerfile in -context)")
	fs.StringVar(&opts.Name, "image", "", "the image's reference, IMAGE:VERSION (required)")
	fs.StringVar(&opts.DebDir, "debs", "", "where the runtime's Debian packages are kept once downloaded (default: _output/image/debs in -context)")
	fs.Var(buildArgs(opts.BuildArgs), "build-arg", "NAME=VALUE: a Dockerfile ARG, as docker build --build-arg (repeat for more)")
	out := fs.String("o", "", "the archive to write (required)")
	_ = fs.Parse(args)
	if opts.Name == "" || *out == "" || fs.NArg() > 0 {
		return fmt.Errorf("-image and -o are required, and nothing else: %q", fs.Args())
	}
	if opts.Dockerfile == "" {
		opts.Dockerfile = filepath.Join(opts.Context, "Dockerfile")
	}
	if opts.DebDir == "" {
		opts.DebDir = filepath.Join(opts.Context, "_output", "image", "debs")
	}
	if epoch := os.Getenv("SOURCE_DATE_EPOCH"); epoch != "" {
		secs, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: not seconds: %w", epoch, err)
		}
		opts.Created = time.Unix(secs, 0)
	} else {
		opts.Created = time.Unix(0, 0)
	}
	img, err := productimage.Build(ctx, opts)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	d, err := img.WriteFile(*out)
	if err != nil {
		return err
	}
	info, err := os.Stat(*out)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "kyb-image: wrote %s: %s, digest %s, %d bytes\n", *out, img.Name, d, info.Size())
	return nil
}

func inspect(args []string, w io.Writer) error {
	fs := flag.NewFlagSet("inspect", flag.ExitOnError)
	under := fs.String("under", "", "list only the files under this directory of the image (e.g. usr/local/bin)")
	extract := fs.String("extract", "", "also write the regular files listed into this directory")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("want one archive, not %q", fs.Args())
	}
	a, err := ociimage.Read(fs.Arg(0))
	if err != nil {
		return err
	}
	c := a.Config.Config
	entrypoint, err := json.Marshal(c.Entrypoint)
	if err != nil {
		return err
	}
	_, _ = fmt.Fprintf(w, "name %s\ndigest %s\nplatform %s/%s\nuser %s\nentrypoint %s\n", a.Name, a.Digest, a.Config.OS, a.Config.Architecture, c.User, entrypoint)
	for _, e := range c.Env {
		_, _ = fmt.Fprintf(w, "env %s\n", e)
	}
	for _, k := range slices.Sorted(maps.Keys(c.Labels)) {
		_, _ = fmt.Fprintf(w, "label %s=%s\n", k, c.Labels[k])
	}
	prefix := strings.Trim(path.Clean("/"+*under), "/")
	for _, f := range a.Files {
		rel := f.Path
		if prefix != "" {
			var ok bool
			if rel, ok = strings.CutPrefix(f.Path, prefix+"/"); !ok {
				continue
			}
		}
		switch f.Type {
		case ociimage.Regular:
			_, _ = fmt.Fprintf(w, "file %s %04o %d:%d sha256:%x\n", f.Path, f.Mode, f.UID, f.GID, sha256.Sum256(f.Data))
			if *extract != "" {
				dst := filepath.Join(*extract, filepath.FromSlash(rel))
				if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
					return err
				}
				if err := os.WriteFile(dst, f.Data, os.FileMode(f.Mode&0o777)); err != nil {
					return err
				}
			}
		case ociimage.Dir:
			_, _ = fmt.Fprintf(w, "dir %s %04o %d:%d\n", f.Path, f.Mode, f.UID, f.GID)
		case ociimage.Symlink:
			_, _ = fmt.Fprintf(w, "symlink %s -> %s\n", f.Path, f.Link)
		case ociimage.Hardlink:
			_, _ = fmt.Fprintf(w, "hardlink %s => %s\n", f.Path, f.Link)
		}
	}
	return nil
}
