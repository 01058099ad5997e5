package sandbox

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// TestMain removes the lister built once for every test.
func TestMain(m *testing.M) {
	code := m.Run()
	if listerBin != "" {
		_ = os.RemoveAll(filepath.Dir(listerBin))
	}
	os.Exit(code)
}

// The lister is built once for every test: a static program that enters
// the sandbox as kyb-cuda-probe does and prints what it finds there.
var (
	listerOnce sync.Once
	listerBin  string
	listerErr  error
)

func buildLister(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the sandbox needs a mount namespace: run the tests as root (CI does)")
	}
	listerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kyb-sandbox-lister-")
		if err != nil {
			listerErr = err
			return
		}
		listerBin = filepath.Join(dir, "lister")
		cmd := exec.Command("go", "build", "-o", listerBin, "./testdata/lister")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			listerErr = &exec.ExitError{Stderr: out}
		}
	})
	if listerErr != nil {
		t.Fatalf("build the lister: %v", listerErr)
	}
	return listerBin
}

// enter runs the lister's first stage in new mount and PID namespaces, as
// cdisandbox.Run starts the probe, in the Container of the lister with
// binds and nodes after its own; it returns what the lister printed, or
// what the first stage said when it failed.
func enter(t *testing.T, root string, binds []Bind, nodes []Node) (string, error) {
	t.Helper()
	cfg, err := Container(buildLister(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Binds = append(cfg.Binds, binds...)
	cfg.Nodes = append(cfg.Nodes, nodes...)
	return enterConfig(t, root, cfg, syscall.CLONE_NEWNS|syscall.CLONE_NEWPID)
}

// enterConfig runs the lister's first stage with cfg in the namespaces
// cloneflags make.
func enterConfig(t *testing.T, root string, cfg *Config, cloneflags uintptr) (string, error) {
	t.Helper()
	lister := buildLister(t)
	cfg.Root = root
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgFile := root + ".json"
	if err := os.WriteFile(cfgFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(lister, EnterArg, cfgFile)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: cloneflags}
	if err := cmd.Run(); err != nil {
		return stdout.String(), &exec.ExitError{ProcessState: cmd.ProcessState, Stderr: stderr.Bytes()}
	}
	return stdout.String(), nil
}

// tree lists everything under dir, symlinks not followed: what the test
// compares before and after.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		out = append(out, strings.TrimPrefix(path, dir)+" "+d.Type().String())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSandboxBuildsNothingOutsideItsRoot runs the real first stage as root
// in a new mount namespace with the paths a hostile CDI spec could give:
// paths that climb out of the root by name, paths through a symlink that
// a bound host directory holds (to a host directory, absolute or by
// "../"), new files in a bound host directory. Each is refused with the
// path named, and nothing appears on the host; a spec with none of them
// is built as it says.
func TestSandboxBuildsNothingOutsideItsRoot(t *testing.T) {
	base := t.TempDir()
	outside, host := filepath.Join(base, "outside"), filepath.Join(base, "hostdir")
	for _, d := range []string{outside, filepath.Join(host, "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	lib := filepath.Join(host, "lib.so")
	for _, f := range []string{lib, filepath.Join(host, "sub/existing")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(host, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(strings.Repeat("../", 16)+outside[1:], filepath.Join(host, "rel")); err != nil {
		t.Fatal(err)
	}
	planted := "/" + strings.Repeat("../", 16) + base[1:] + "/planted"
	hostBefore := tree(t, host)
	hostDir := Bind{Source: host, Target: "/a"}

	tests := []struct {
		name  string
		binds []Bind
		nodes []Node
		want  string
	}{
		{name: "a file's mount point planted by name", binds: []Bind{{Source: lib, Target: planted + "/file"}},
			want: `bind ` + lib + ` at ` + planted + `/file: refused: "` + planted + `/file" is not a clean path`},
		{name: "a directory's mount point planted by name", binds: []Bind{{Source: filepath.Join(host, "sub"), Target: planted + "/dir"}},
			want: `"` + planted + `/dir" is not a clean path`},
		{name: "a device node planted by name", nodes: []Node{{Path: planted + "/node", Major: 1, Minor: 3}},
			want: `device node ` + planted + `/node: refused: "` + planted + `/node" is not a clean path`},
		{name: "a device node through a bound directory's symlink", binds: []Bind{hostDir}, nodes: []Node{{Path: "/a/link/node", Major: 1, Minor: 3}},
			want: `device node /a/link/node: refused: /a/link is a symlink (to "` + outside + `")`},
		{name: "a file's mount point through a bound directory's relative symlink", binds: []Bind{hostDir, {Source: lib, Target: "/a/rel/file"}},
			want: `bind ` + lib + ` at /a/rel/file: refused: /a/rel is a symlink`},
		{name: "a directory's mount point through a bound directory's symlink", binds: []Bind{hostDir, {Source: filepath.Join(host, "sub"), Target: "/a/link/dir/below"}},
			want: `/a/link is a symlink`},
		{name: "a device node in a bound host directory", binds: []Bind{hostDir}, nodes: []Node{{Path: "/a/sub/node", Major: 1, Minor: 3}},
			want: `/a/sub/node does not exist, and its directory was bound from the host`},
		{name: "a mount point in a bound host directory", binds: []Bind{hostDir, {Source: lib, Target: "/a/new/file"}},
			want: `/a/new does not exist, and its directory was bound from the host`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := filepath.Join(t.TempDir(), "root")
			if err := os.Mkdir(root, 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := enter(t, root, tt.binds, tt.nodes)
			var stderr string
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				stderr, code = string(ee.Stderr), ee.ExitCode()
			}
			if code != ExitRefused || !strings.Contains(stderr, tt.want) {
				t.Errorf("sandbox: %v %s, want it refused (exit %d) with %q; it showed:\n%s", err, stderr, ExitRefused, tt.want, out)
			}
			if made := tree(t, outside); len(made) != 1 {
				t.Errorf("made outside the sandbox's root, through a symlink: %v", made[1:])
			}
			if _, err := os.Lstat(filepath.Join(base, "planted")); err == nil {
				t.Errorf("made outside the sandbox's root, by name: %v", tree(t, filepath.Join(base, "planted")))
			}
			if after := tree(t, host); !slices.Equal(after, hostBefore) {
				t.Errorf("the bound host directory changed: %v, was %v", after, hostBefore)
			}
		})
	}

	t.Run("a spec with none of them", func(t *testing.T) {
		root := filepath.Join(t.TempDir(), "root")
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := enter(t, root, []Bind{
			hostDir,
			{Source: lib, Target: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", ReadOnly: true},
			// Over a file the bound directory has: nothing is made.
			{Source: lib, Target: "/a/sub/existing", ReadOnly: true},
		}, []Node{{Path: "/dev/nvidia9", Major: 195, Minor: 9}})
		if err != nil {
			t.Fatalf("sandbox: %v %s", err, err.(*exec.ExitError).Stderr)
		}
		for _, want := range []string{
			"f ro /probe\n",
			"d rw /a\n",
			"l /a/link\n",
			"f ro /a/sub/existing\n",
			"f rw /a/lib.so\n",
			"f ro /usr/lib/x86_64-linux-gnu/libcuda.so.1\n",
			"c 195:9 /dev/nvidia9\n",
			"d rw /tmp\n",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("the sandbox lacks %q; it showed:\n%s", want, out)
			}
		}
		if after := tree(t, host); !slices.Equal(after, hostBefore) {
			t.Errorf("the bound host directory changed: %v, was %v", after, hostBefore)
		}
	})
}
