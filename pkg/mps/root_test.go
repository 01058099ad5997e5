package mps_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

// The MPS root is refused where someone other than root or the plugin's
// user could point its path elsewhere after the check: a root that is a
// link, or one reached through a directory others may write in (unless
// sticky, as /tmp is) or through an entry another user owns. Run as root,
// which the tests of this package need anyway; user 4242 stands for
// anyone else.
func TestARootOthersCouldRedirectIsRefused(t *testing.T) {
	const other = 4242
	for _, tt := range []struct {
		name string
		// setup makes the root's surroundings in base (mode 0755, the
		// test's) and returns the root to give.
		setup   func(t *testing.T, base string) string
		wantErr string
	}{{
		name: "a link to a directory of the plugin's user",
		setup: func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "real"), 0o755)
			symlink(t, filepath.Join(base, "real"), filepath.Join(base, "mps"))
			return filepath.Join(base, "mps")
		},
		wantErr: "is a symbolic link",
	}, {
		name: "under a directory anyone may write in",
		setup: func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "shared"), 0o777)
			return filepath.Join(base, "shared", "mps")
		},
		wantErr: "shared, on the way to it, is writable by others than its owner (mode 777) and not sticky",
	}, {
		name: "under a directory of another user",
		setup: func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "theirs"), 0o755)
			chown(t, filepath.Join(base, "theirs"), other)
			return filepath.Join(base, "theirs", "mps")
		},
		wantErr: "theirs, on the way to it, belongs to user 4242",
	}, {
		name: "through a link another user owns in a sticky directory",
		setup: func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "tmp"), 0o1777)
			mkdir(t, filepath.Join(base, "real"), 0o755)
			symlink(t, filepath.Join(base, "real"), filepath.Join(base, "tmp", "link"))
			chown(t, filepath.Join(base, "tmp", "link"), other)
			return filepath.Join(base, "tmp", "link", "mps")
		},
		wantErr: "link, on the way to it, belongs to user 4242",
	}, {
		name: "through a directory a link leads to that anyone may write in",
		setup: func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "shared"), 0o777)
			symlink(t, filepath.Join(base, "shared"), filepath.Join(base, "link"))
			return filepath.Join(base, "link", "mps")
		},
		wantErr: "shared, on the way to it, is writable by others than its owner (mode 777) and not sticky",
	}, {
		name: "in a sticky directory anyone may write in, as /tmp",
		setup: func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "tmp"), 0o1777)
			return filepath.Join(base, "tmp", "mps")
		},
	}, {
		name: "through a link of root's to a directory of root's",
		setup: func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "data"), 0o755)
			symlink(t, "data", filepath.Join(base, "kubelet"))
			return filepath.Join(base, "kubelet", "mps")
		},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			base := t.TempDir()
			root := tt.setup(t, base)
			_, err := mps.NewManager(mps.Options{Root: root, Control: []string{"true"}, SetExclusive: (&modes{exclusive: map[string]bool{}}).set, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("NewManager(%s): %v, want it accepted", root, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("NewManager(%s): %v, want a refusal saying %q", root, err, tt.wantErr)
			}
		})
	}
}

// After the check the root is used as the directory opened then: a path
// pointed elsewhere later (by root on the host: no one else can, above)
// leads no removal, record or lock of the plugin's out of it. The group's
// last release stops its daemon and removes its directory in the root
// the plugin opened, and leaves alone the directory the path leads to now.
func TestTheRootIsUsedAsItWasOpened(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	base := mpstest.Root(t)
	root, moved, victim := filepath.Join(base, "mps"), filepath.Join(base, "moved"), filepath.Join(base, "victim")
	mkdir(t, root, 0o755)
	mkdir(t, filepath.Join(victim, "g0-1x"), 0o755)
	precious := filepath.Join(victim, "g0-1x", "precious")
	if err := os.WriteFile(precious, []byte("not the plugin's"), 0o644); err != nil {
		t.Fatal(err)
	}
	md := &modes{exclusive: map[string]bool{}}
	m, err := mps.NewManager(mps.Options{Root: root, Control: []string{control}, SetExclusive: md.set, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB,
		Env:            []string{mpstest.OutliveDirEnv + "=1"},
		ControlTimeout: 500 * time.Millisecond, StopTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	t.Cleanup(func() {
		for pid, pipe := range mpstest.Daemons(t, control) {
			if strings.HasPrefix(pipe, base) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	if err := m.Ensure(ctx, g, mps.Fixed(mps.Share(1, 4, []int64{40960}))); err != nil {
		t.Fatal(err)
	}
	daemons := daemonsOf(t, control, root, g.Name)
	if err := os.Rename(root, moved); err != nil {
		t.Fatal(err)
	}
	symlink(t, victim, root)

	if err := m.Settle(context.Background(), g, mps.Unused()); err != nil {
		t.Fatalf("the group's last release: %v", err)
	}
	if _, err := os.Stat(precious); err != nil {
		t.Errorf("the group's release removed %s, where the root's path leads now: %v", precious, err)
	}
	if _, err := os.Stat(filepath.Join(moved, g.Name)); !os.IsNotExist(err) {
		t.Errorf("the group's directory in the root the plugin opened: %v, want it removed", err)
	}
	if got := daemonsOf(t, control, root, g.Name); len(got) != 0 {
		t.Errorf("the group's daemons %v (started: %v) still run after its release", got, daemons)
	}
	if md.get("GPU-a") {
		t.Error("GPU-a stays EXCLUSIVE_PROCESS after the group's release")
	}
}

// mkdir makes dir with mode, which may have the sticky bit (0o1000).
func mkdir(t *testing.T, dir string, mode uint32) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, path string, uid int) {
	t.Helper()
	if err := os.Lchown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
}
