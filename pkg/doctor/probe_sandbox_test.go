package doctor

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
)

// TestProbeOfAHostileSpecWritesNothingOnTheHost runs the doctor, as root,
// on claim specs that would have it write on the host: container paths
// that climb out of the sandbox's root by name ("/../../../<dir>/planted"),
// and paths through a symlink in a host directory the spec binds. The
// sandbox is built in a new mount namespace by the real probe binary;
// nothing appears outside it, and the report names the offending path.
func TestProbeOfAHostileSpecWritesNothingOnTheHost(t *testing.T) {
	const uid = types.UID("7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d")
	// hostPaths are host directories under a test's base: outside, which
	// nothing may reach, and hostDir, which specs bind, holding a file and
	// a symlink to outside.
	type hostPaths struct{ base, outside, hostDir string }
	tests := []struct {
		name string
		// edits are the hostile device's edits, beside a device that
		// gives the claim GPU 0.
		edits, want func(p hostPaths) string
	}{
		{name: "a file's mount point planted by name",
			edits: func(p hostPaths) string {
				return `"mounts":[{"hostPath":"` + p.hostDir + `/file","containerPath":"` + planted(p.base) + `/file","options":["ro","bind"]}]`
			},
			want: func(p hostPaths) string {
				return `mount of "` + p.hostDir + `/file" at "` + planted(p.base) + `/file": refused: "` + planted(p.base) + `/file" is not a clean path`
			}},
		{name: "a directory's mount point planted by name",
			edits: func(p hostPaths) string {
				return `"mounts":[{"hostPath":"` + p.hostDir + `","containerPath":"` + planted(p.base) + `/dir"}]`
			},
			want: func(p hostPaths) string { return `refused: "` + planted(p.base) + `/dir" is not a clean path` }},
		{name: "a character device node planted by name",
			edits: func(p hostPaths) string {
				return `"deviceNodes":[{"path":"` + planted(p.base) + `/node","type":"c","major":1,"minor":3}]`
			},
			want: func(p hostPaths) string {
				return `device node "` + planted(p.base) + `/node": refused: "` + planted(p.base) + `/node" is not a clean path`
			}},
		{name: "a device node through a symlink of a bound host directory",
			edits: func(p hostPaths) string {
				return `"mounts":[{"hostPath":"` + p.hostDir + `","containerPath":"/a"}],"deviceNodes":[{"path":"/a/link/node","type":"c","major":1,"minor":3}]`
			},
			want: func(p hostPaths) string {
				return `device node /a/link/node: refused: /a/link is a symlink (to "` + p.outside + `")`
			}},
		{name: "a mount point through a symlink of a bound host directory",
			edits: func(p hostPaths) string {
				return `"mounts":[{"hostPath":"` + p.hostDir + `","containerPath":"/a"},{"hostPath":"` + p.hostDir + `/file","containerPath":"/a/link/file"}]`
			},
			want: func(hostPaths) string { return `at /a/link/file: refused: /a/link is a symlink` }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, inv := probeNode(t)
			base := t.TempDir()
			p := hostPaths{base: base, outside: filepath.Join(base, "outside"), hostDir: filepath.Join(base, "hostdir")}
			n.mkdir(p.outside)
			n.write(filepath.Join(p.hostDir, "file"), "x")
			if err := os.Symlink(p.outside, filepath.Join(p.hostDir, "link")); err != nil {
				t.Fatal(err)
			}
			before := files(t, base)
			lib := filepath.Join(n.opts.Node.DriverRoot, "usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05")
			n.write(filepath.Join(n.opts.CDIRoot, cdi.SpecName(uid)+".json"), `{"cdiVersion":"0.6.0","kind":"kyb.ai/gpu","devices":[{"name":"seat","containerEdits":{
				"env":["NVIDIA_VISIBLE_DEVICES=`+inv.GPUs[0].UUID+`"],
				"deviceNodes":[{"path":"/dev/nvidia0"},{"path":"/dev/nvidiactl"}],
				"mounts":[{"hostPath":"`+lib+`","containerPath":"/usr/lib/x86_64-linux-gnu/libcuda.so.1","options":["ro","bind"]}]}},
				{"name":"hostile","containerEdits":{`+tt.edits(p)+`}}]}`)
			n.recordClaim(inv, uid, "G0", []int{0})
			n.opts.Probe.Claim = uid
			c := check(t, n.run(t), "probe")
			want := tt.want(p)
			if c.Status != Fail || !strings.Contains(c.Summary, "the sandbox refuses the spec") || !strings.Contains(c.Summary, want) {
				t.Errorf("probe: %s %q, want fail with %q", c.Status, c.Summary, want)
			}
			if after := files(t, base); !slices.Equal(after, before) {
				t.Errorf("the doctor wrote on the host: %v, was %v", after, before)
			}
		})
	}
}

// planted is a container path that names, climbing out of any root by
// "..", the host's base/planted.
func planted(base string) string {
	return "/" + strings.Repeat("../", 16) + base[1:] + "/planted"
}

// files lists everything under dir, symlinks not followed.
func files(t *testing.T, dir string) []string {
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
