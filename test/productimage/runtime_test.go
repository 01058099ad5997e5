package productimage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/test/ociimage"
)

// buildDeb makes a Debian package with dpkg-deb, the tool the layer reads
// packages with: files maps a path to its contents, "->target" for a
// symlink.
func buildDeb(t *testing.T, pkg string, files map[string]string) Deb {
	t.Helper()
	root := filepath.Join(t.TempDir(), pkg)
	control := fmt.Sprintf("Package: %s\nVersion: 1.0-1\nArchitecture: all\nMaintainer: Test <test@example.com>\nDescription: test package\n", pkg)
	files["DEBIAN/control"] = control
	for p, content := range files {
		f := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "->"); ok {
			if err := os.Symlink(target, f); err != nil {
				t.Fatal(err)
			}
			continue
		}
		mode := os.FileMode(0o644)
		if strings.HasSuffix(p, ".so") {
			mode = 0o755
		}
		if err := os.WriteFile(f, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, mode); err != nil {
			t.Fatal(err)
		}
	}
	deb := root + ".deb"
	if out, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", root, deb).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb --build: %v\n%s", err, out)
	}
	return Deb{Package: pkg, Version: "1.0-1", Architecture: "all", File: deb}
}

// TestRuntimeLayer: the packages' files less their documentation (but for
// the copyright files and a documentation directory that links to
// another package's), their control files for tools that list packages,
// and the user, group and directories the image runs with.
func TestRuntimeLayer(t *testing.T) {
	a := buildDeb(t, "kyb-test-a", map[string]string{
		"lib/x86_64-linux-gnu/liba.so":           "a",
		"lib64/ld-a.so":                          "->/lib/x86_64-linux-gnu/liba.so",
		"etc/ld.so.conf.d/a.conf":                "/lib/a\n",
		"usr/share/doc/kyb-test-a/copyright":     "(c) a",
		"usr/share/doc/kyb-test-a/changelog.gz":  "changes",
		"usr/share/doc/kyb-test-a/examples/x":    "example",
		"usr/share/lintian/overrides/kyb-test-a": "override",
		"usr/share/man/man1/a.1":                 "man",
	})
	b := buildDeb(t, "kyb-test-b", map[string]string{
		"lib/x86_64-linux-gnu/libb.so": "b",
		"usr/share/doc/kyb-test-b":     "->kyb-test-a",
	})
	l, err := RuntimeLayer(context.Background(), []Deb{a, b})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	var control string
	slices.SortFunc(l.Files, func(x, y ociimage.File) int { return strings.Compare(x.Path, y.Path) })
	for _, f := range l.Files {
		switch f.Type {
		case ociimage.Dir:
			got = append(got, fmt.Sprintf("dir %s %04o %d:%d", f.Path, f.Mode, f.UID, f.GID))
		case ociimage.Symlink:
			got = append(got, fmt.Sprintf("symlink %s -> %s", f.Path, f.Link))
		default:
			got = append(got, fmt.Sprintf("file %s %04o %d:%d", f.Path, f.Mode, f.UID, f.GID))
		}
		if f.Path == "var/lib/dpkg/status.d/kyb-test-b" {
			control = string(f.Data)
		}
	}
	want := []string{
		"dir etc 0755 0:0",
		"file etc/group 0644 0:0",
		"dir etc/ld.so.conf.d 0755 0:0",
		"file etc/ld.so.conf.d/a.conf 0644 0:0",
		"file etc/nsswitch.conf 0644 0:0",
		"file etc/passwd 0644 0:0",
		"dir home 0755 0:0",
		"dir home/nonroot 0700 65532:65532",
		"dir lib 0755 0:0",
		"dir lib/x86_64-linux-gnu 0755 0:0",
		"file lib/x86_64-linux-gnu/liba.so 0755 0:0",
		"file lib/x86_64-linux-gnu/libb.so 0755 0:0",
		"dir lib64 0755 0:0",
		"symlink lib64/ld-a.so -> /lib/x86_64-linux-gnu/liba.so",
		"dir root 0700 0:0",
		"dir tmp 1777 0:0",
		"dir usr 0755 0:0",
		"dir usr/share 0755 0:0",
		"dir usr/share/doc 0755 0:0",
		"dir usr/share/doc/kyb-test-a 0755 0:0",
		"file usr/share/doc/kyb-test-a/copyright 0644 0:0",
		"symlink usr/share/doc/kyb-test-b -> kyb-test-a",
		"dir var 0755 0:0",
		"dir var/lib 0755 0:0",
		"dir var/lib/dpkg 0755 0:0",
		"dir var/lib/dpkg/status.d 0755 0:0",
		"file var/lib/dpkg/status.d/kyb-test-a 0644 0:0",
		"file var/lib/dpkg/status.d/kyb-test-b 0644 0:0",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("layer:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !strings.HasPrefix(control, "Package: kyb-test-b\nVersion: 1.0-1\n") {
		t.Errorf("status.d/kyb-test-b is %q; want the package's control file", control)
	}
	if l.CreatedBy != "Debian kyb-test-a 1.0-1, kyb-test-b 1.0-1; user nonroot (65532), /tmp" {
		t.Errorf("created by %q", l.CreatedBy)
	}
}

// TestRuntimeLayerRefusesClashes: two packages, or a package and the base
// files, with one path are an error naming both.
func TestRuntimeLayerRefusesClashes(t *testing.T) {
	a := buildDeb(t, "kyb-test-a", map[string]string{"lib/x.so": "a"})
	b := buildDeb(t, "kyb-test-b", map[string]string{"lib/x.so": "b"})
	c := buildDeb(t, "kyb-test-c", map[string]string{"etc/passwd": "root::0:0::/:/bin/sh\n"})
	for _, tc := range []struct {
		debs []Deb
		want string
	}{
		{[]Deb{a, b}, "lib/x.so: in kyb-test-a and in kyb-test-b"},
		{[]Deb{c}, "etc/passwd: in kyb-test-c and in the base files"},
	} {
		_, err := RuntimeLayer(context.Background(), tc.debs)
		if err == nil || err.Error() != tc.want {
			t.Errorf("error %v; want %q", err, tc.want)
		}
	}
}
