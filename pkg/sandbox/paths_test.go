package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestCheckPathTakesOnlyCleanAbsolutePaths(t *testing.T) {
	for _, tt := range []struct {
		path string
		want string // "" for a path that is taken
	}{
		{"/dev/nvidia0", ""},
		{"/usr/lib/x86_64-linux-gnu/libcuda.so.1", ""},
		{"/a..b/..c", ""},
		{"/../../../tmp/x/planted", `"/../../../tmp/x/planted" is not a clean path`},
		{"/dev/../etc/passwd", "is not a clean path"},
		{"/dev/./nvidia0", "is not a clean path"},
		{"/dev//nvidia0", "is not a clean path"},
		{"/dev/", "is not a clean path"},
		{"dev/nvidia0", `"dev/nvidia0" is not an absolute path`},
		{"", "is not an absolute path"},
		{"/", "is the sandbox's root itself"},
		{"/dev/nvidia0\x00x", "holds a NUL byte"},
	} {
		err := CheckPath(tt.path)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("CheckPath(%q): %v, want it taken", tt.path, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrRefused)):
			t.Errorf("CheckPath(%q): %v, want refused with %q", tt.path, err, tt.want)
		}
	}
}

// TestOpenResolvesInTheRootWithoutSymlinks resolves paths from a
// directory's descriptor as the sandbox does (the mount-namespace half is
// in enter_test.go): missing directories are made, a symlink on the way or
// at the end is refused whatever it points at, a file is no directory.
func TestOpenResolvesInTheRootWithoutSymlinks(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	rootPath := filepath.Join(dir, "root")
	for _, d := range []string{"root/etc", "root/usr"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(rootPath, "etc/file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, to := range map[string]string{"root/usr/abs": outside, "root/usr/rel": "../../..", "root/usr/self": "."} {
		if err := os.Symlink(to, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	root, err := openRoot(rootPath)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = root.Close() }()
	for _, tt := range []struct {
		path string
		mk   maker
		want string // "" for success
	}{
		{"/etc/file", nil, ""},
		{"/new/a/b", makeDir, ""},
		{"/new/a/file", makeFile, ""},
		{"/missing/file", nil, "/missing: no such file or directory"},
		{"/usr/abs/x", makeFile, `/usr/abs is a symlink (to "` + outside + `")`},
		{"/usr/rel/x", makeDir, `/usr/rel is a symlink (to "../../..")`},
		{"/usr/self", nil, "/usr/self is a symlink"},
		{"/etc/file/x", makeFile, "/etc/file: not a directory"},
		{"/etc/../x", makeFile, "is not a clean path"},
	} {
		fd, err := root.open(tt.path, tt.mk)
		if err == nil {
			_ = unix.Close(fd)
		}
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("open %s: %v", tt.path, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("open %s: %v, want %q", tt.path, err, tt.want)
		}
	}
	for _, made := range []string{"new/a/b", "new/a/file"} {
		if _, err := os.Lstat(filepath.Join(rootPath, made)); err != nil {
			t.Errorf("%s was not made: %v", made, err)
		}
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 0 {
		t.Errorf("made outside the root: %v", entries)
	}
	if err := root.mknod("/usr/abs", 1, 3); !errors.Is(err, unix.EEXIST) {
		t.Errorf("mknod over a symlink: %v, want EEXIST", err)
	}
	if err := root.mknod("/dev/null", -1, 3); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("mknod with a negative major: %v", err)
	}
}
