package productimage

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kyb-ai/kyb-dra-driver/test/ociimage"
)

// The runtime layer stands in for the Dockerfile's base,
// gcr.io/distroless/cc-debian12, with what of it the binaries use:
//
//   - glibc (libc6) and libgcc_s (libgcc-s1), and what Debian says they
//     depend on (gcc-12-base: only its copyright file is left). The
//     binaries link glibc (cgo, and the node's libnvidia-ml needs it);
//     glibc loads libgcc_s when a thread of a C library is cancelled.
//   - The user and group nonroot (65532), which the image runs as, root
//     and nobody, in /etc/passwd and /etc/group: glibc's getpwuid and a
//     runtime's HOME come from there. /home/nonroot (65532, 0700), /root.
//   - /tmp, 1777: Go's os.TempDir, and a read-only root file system gets
//     its emptyDir there.
//   - /etc/nsswitch.conf: glibc's resolver and Go's agree on files, then
//     DNS.
//   - /var/lib/dpkg/status.d/<package>: each package's control file, as
//     distroless keeps them, so that tools listing an image's packages
//     find glibc and its version.
//
// Left out: ca-certificates (the plugin trusts only the cluster's CA, from
// its service account), tzdata (logs are UTC), netbase, libssl3, libgomp1
// and libstdc++6 (nothing links them), /etc/os-release (base-files, which
// the binaries do not read), and of the packages their documentation but
// the copyright files.
//
// The packages come as .deb files from the machine's apt sources, each at
// the version installed on the machine: the glibc the binaries were linked
// against (a newer one would do; an older one might lack symbols they
// use). A version fixes a .deb's bytes, and apt checks them against the
// archive's signed index, so the layer follows from the versions alone.
//
// DefaultPackages are the packages the layer starts from.
var DefaultPackages = []string{"libc6", "libgcc-s1"}

// NonrootUID is the image's user and group.
const NonrootUID = 65532

const (
	passwd = `root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
`
	group = `root:x:0:
nobody:x:65534:
nonroot:x:65532:
`
	nsswitch = `passwd: files
group: files
shadow: files
hosts: files dns
networks: files
protocols: files
services: files
`
)

// Deb is one Debian package file.
type Deb struct {
	Package, Version, Architecture string
	File                           string
}

// FetchDebs finds the .deb files of packages and of what they depend on,
// each at its installed version, in dir, and downloads those missing
// there with apt-get download.
func FetchDebs(ctx context.Context, dir string, packages []string, log io.Writer) ([]Deb, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var debs []Deb
	seen := map[string]bool{}
	todo := slices.Clone(packages)
	for len(todo) > 0 {
		pkg := todo[0]
		todo = todo[1:]
		if seen[pkg] {
			continue
		}
		seen[pkg] = true
		out, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f", "${Version}\t${Architecture}\t${Pre-Depends}, ${Depends}", pkg).Output()
		if err != nil {
			return nil, fmt.Errorf("package %s: dpkg-query: %w (the image takes the machine's installed version: install %s)", pkg, commandError(err), pkg)
		}
		fields := strings.SplitN(string(out), "\t", 3)
		if len(fields) != 3 {
			return nil, fmt.Errorf("package %s: dpkg-query printed %q", pkg, out)
		}
		d := Deb{Package: pkg, Version: fields[0], Architecture: fields[1]}
		todo = append(todo, dependencies(ctx, fields[2])...)
		// apt's file name: an epoch's colon is %3a.
		d.File = filepath.Join(dir, fmt.Sprintf("%s_%s_%s.deb", pkg, strings.ReplaceAll(d.Version, ":", "%3a"), d.Architecture))
		if _, err := os.Stat(d.File); err != nil {
			_, _ = fmt.Fprintf(log, "apt-get download %s=%s\n", pkg, d.Version)
			cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", pkg+"="+d.Version)
			cmd.Dir = dir
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("apt-get download %s=%s (the installed version; if apt no longer has it, upgrade the package first: apt-get update && apt-get install --only-upgrade %s): %w\n%s", pkg, d.Version, pkg, err, out)
			}
		}
		got, err := exec.CommandContext(ctx, "dpkg-deb", "--show", "--showformat", "${Package} ${Version}", d.File).Output()
		if err != nil || string(got) != pkg+" "+d.Version {
			return nil, fmt.Errorf("%s: dpkg-deb says %q (%v); want %s %s", d.File, got, commandError(err), pkg, d.Version)
		}
		debs = append(debs, d)
	}
	slices.SortFunc(debs, func(a, b Deb) int { return strings.Compare(a.Package, b.Package) })
	return debs, nil
}

// dependencies names the installed packages a Depends field asks for: of
// alternatives, the first one installed.
func dependencies(ctx context.Context, field string) []string {
	var out []string
	for _, dep := range strings.Split(field, ",") {
		for _, alt := range strings.Split(dep, "|") {
			name, _, _ := strings.Cut(strings.TrimSpace(alt), " ")
			name, _, _ = strings.Cut(name, ":")
			if name == "" {
				continue
			}
			if err := exec.CommandContext(ctx, "dpkg-query", "-W", name).Run(); err == nil {
				out = append(out, name)
				break
			}
		}
	}
	return out
}

// RuntimeLayer is the layer in place of the Dockerfile's base: the
// packages' files, less their documentation, and the base files.
func RuntimeLayer(ctx context.Context, debs []Deb) (ociimage.Layer, error) {
	files := map[string]ociimage.File{}
	owner := map[string]string{}
	add := func(f ociimage.File, from string) error {
		prev, ok := files[f.Path]
		switch {
		case !ok:
		case prev.Type == ociimage.Dir && f.Type == ociimage.Dir && prev.Mode == f.Mode && prev.UID == f.UID && prev.GID == f.GID:
			return nil
		default:
			return fmt.Errorf("%s: in %s and in %s", f.Path, owner[f.Path], from)
		}
		files[f.Path], owner[f.Path] = f, from
		return nil
	}
	var names []string
	for _, d := range debs {
		contents, err := debFiles(ctx, d.File)
		if err != nil {
			return ociimage.Layer{}, err
		}
		for _, f := range contents {
			if err := add(f, d.Package); err != nil {
				return ociimage.Layer{}, err
			}
		}
		control, err := debControl(ctx, d.File)
		if err != nil {
			return ociimage.Layer{}, err
		}
		if err := add(ociimage.File{Path: "var/lib/dpkg/status.d/" + d.Package, Data: control, Mode: 0o644}, d.Package); err != nil {
			return ociimage.Layer{}, err
		}
		names = append(names, d.Package+" "+d.Version)
	}
	for _, f := range []ociimage.File{
		{Path: "etc", Type: ociimage.Dir, Mode: 0o755},
		{Path: "etc/passwd", Data: []byte(passwd), Mode: 0o644},
		{Path: "etc/group", Data: []byte(group), Mode: 0o644},
		{Path: "etc/nsswitch.conf", Data: []byte(nsswitch), Mode: 0o644},
		{Path: "home", Type: ociimage.Dir, Mode: 0o755},
		{Path: "home/nonroot", Type: ociimage.Dir, Mode: 0o700, UID: NonrootUID, GID: NonrootUID},
		{Path: "root", Type: ociimage.Dir, Mode: 0o700},
		{Path: "tmp", Type: ociimage.Dir, Mode: 0o1777},
		{Path: "var", Type: ociimage.Dir, Mode: 0o755},
		{Path: "var/lib", Type: ociimage.Dir, Mode: 0o755},
		{Path: "var/lib/dpkg", Type: ociimage.Dir, Mode: 0o755},
		{Path: "var/lib/dpkg/status.d", Type: ociimage.Dir, Mode: 0o755},
	} {
		if err := add(f, "the base files"); err != nil {
			return ociimage.Layer{}, err
		}
	}
	l := ociimage.Layer{CreatedBy: "Debian " + strings.Join(names, ", ") + "; user nonroot (65532), /tmp"}
	for _, f := range files {
		l.Files = append(l.Files, f)
	}
	return l, nil
}

// debFiles reads a package's files from its data archive, less its
// documentation: of /usr/share/doc only the copyright files stay.
func debFiles(ctx context.Context, file string) ([]ociimage.File, error) {
	data, err := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", file).Output()
	if err != nil {
		return nil, fmt.Errorf("%s: dpkg-deb --fsys-tarfile: %w", file, commandError(err))
	}
	var out []ociimage.File
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		p := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if p == "" || !keep(p, h.Typeflag) {
			continue
		}
		f := ociimage.File{Path: p, Mode: h.Mode & 0o7777, UID: h.Uid, GID: h.Gid}
		switch h.Typeflag {
		case tar.TypeDir:
			f.Type = ociimage.Dir
		case tar.TypeSymlink:
			f.Type, f.Link = ociimage.Symlink, h.Linkname
		case tar.TypeLink:
			f.Type, f.Link = ociimage.Hardlink, strings.TrimPrefix(path.Clean("/"+h.Linkname), "/")
		case tar.TypeReg:
			if f.Data, err = io.ReadAll(tr); err != nil {
				return nil, fmt.Errorf("%s: %s: %w", file, p, err)
			}
		default:
			return nil, fmt.Errorf("%s: %s: entry type %q", file, p, h.Typeflag)
		}
		out = append(out, f)
	}
}

// keep says whether a package's file goes into the image: documentation
// does not, but for each package's copyright (and the link a package's
// documentation directory may be to another's).
func keep(p string, typ byte) bool {
	for _, dir := range []string{"usr/share/lintian", "usr/share/man", "usr/share/info"} {
		if p == dir || strings.HasPrefix(p, dir+"/") {
			return false
		}
	}
	rest, ok := strings.CutPrefix(p, "usr/share/doc/")
	if !ok {
		return true
	}
	pkg, file, nested := strings.Cut(rest, "/")
	switch {
	case !nested:
		return pkg != "" && (typ == tar.TypeDir || typ == tar.TypeSymlink)
	default:
		return file == "copyright"
	}
}

// debControl returns a package's control file.
func debControl(ctx context.Context, file string) ([]byte, error) {
	data, err := exec.CommandContext(ctx, "dpkg-deb", "--ctrl-tarfile", file).Output()
	if err != nil {
		return nil, fmt.Errorf("%s: dpkg-deb --ctrl-tarfile: %w", file, commandError(err))
	}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err != nil {
			return nil, fmt.Errorf("%s: no control file: %w", file, err)
		}
		if path.Clean(h.Name) == "control" {
			return io.ReadAll(tr)
		}
	}
}

// commandError adds what a command printed on stderr to its error.
func commandError(err error) error {
	var exit *exec.ExitError
	if errors.As(err, &exit) && len(exit.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(exit.Stderr))
	}
	return err
}
