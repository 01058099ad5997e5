package doctor

// The probe sees the GPUs CUDA enumerates: CUDA scans /dev for
// nvidia<N> and keeps those CUDA_VISIBLE_DEVICES names. A container can
// open every GPU device node its spec gives it, whatever its path and
// whatever the variable says: a process in it can unset the variable, and
// root in it can link a node given at /dev/nvidia-spare to /dev/nvidia1.
// So the spec's GPU device nodes are checked as well, by what they are on
// the host: each must be one of the GPUs the seat (or the claim) holds.

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdisandbox"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// The NVIDIA driver's fixed major (gpuhost.NVIDIAMajor): minor N is the
// GPU of /dev/nvidia<N>, and the minors from controlMinors on are its
// control nodes (254 nvidia-modeset, 255 nvidiactl).
const (
	nvidiaMajor   = gpuhost.NVIDIAMajor
	controlMinors = 254
)

// gpuNodeName is a GPU device node's name, in /dev or in a driver root's
// dev directory.
var gpuNodeName = regexp.MustCompile(`^nvidia([0-9]+)$`)

// gpuNode is a GPU device node a spec gives a container.
type gpuNode struct {
	minor int
	// entry names the spec entry that gives it.
	entry string
}

// gpuNodes tells which GPUs the device nodes a spec gives are, on the
// host: inv says which GPU has which minor (nil where NVML did not list
// the GPUs), seen where the doctor sees a host path.
type gpuNodes struct {
	inv  *inventory.Inventory
	seen func(host string) string
}

// foreign says which GPUs the target's specs give a device node of, as a
// device node or a bind mount, that are not among the GPUs the target
// must see: each by index and UUID (or by minor, where no GPU has it),
// once, and a line per spec entry that gives one.
func (gn gpuNodes) foreign(t probeTarget) (gpus, entries []string, err error) {
	edits, err := cdisandbox.DeviceEdits(t.specs, t.devices)
	if err != nil {
		return nil, nil, err
	}
	nodes := gn.of(edits)
	if len(nodes) > 0 && gn.inv == nil {
		return nil, nil, fmt.Errorf("the spec gives GPU device nodes, and which GPUs they are is not known: NVML did not list the GPUs")
	}
	for _, n := range nodes {
		var gpu string
		switch g := gpuByMinor(gn.inv, n.minor); {
		case g == nil:
			gpu = fmt.Sprintf("minor %d, which no GPU of this node has", n.minor)
		case !slices.Contains(t.want, g.UUID):
			gpu = fmt.Sprintf("GPU %d %s", g.Index, g.UUID)
		default:
			continue
		}
		if !slices.Contains(gpus, gpu) {
			gpus = append(gpus, gpu)
		}
		entries = append(entries, fmt.Sprintf("the device node of %s: %s", gpu, n.entry))
	}
	return gpus, slices.Compact(entries), nil
}

func gpuByMinor(inv *inventory.Inventory, minor int) *inventory.GPU {
	for i := range inv.GPUs {
		if inv.GPUs[i].Minor == minor {
			return &inv.GPUs[i]
		}
	}
	return nil
}

// of are the GPU device nodes the edits give: device nodes by their host
// path and by the numbers the runtime makes them with (the spec's, or the
// host node's where the spec gives none), and bind mounts of a GPU node by
// their host path.
func (gn gpuNodes) of(edits []cdisandbox.Edits) []gpuNode {
	var out []gpuNode
	for _, ed := range edits {
		for _, d := range ed.DeviceNodes {
			host := d.HostPath
			if host == "" {
				host = d.Path
			}
			entry := fmt.Sprintf("device node %s, host %s, of %s", d.Path, host, ed.From)
			minors := gn.hostMinors(host)
			if d.Major == nvidiaMajor && d.Minor < controlMinors {
				minors = append(minors, int(d.Minor))
			}
			for _, m := range minors {
				out = append(out, gpuNode{minor: m, entry: entry})
			}
		}
		for _, m := range ed.Mounts {
			for _, minor := range gn.hostMinors(m.HostPath) {
				out = append(out, gpuNode{minor: minor, entry: fmt.Sprintf("mount of %s at %s, of %s", m.HostPath, m.ContainerPath, ed.From)})
			}
		}
	}
	return out
}

// hostMinors are the GPUs a host path is the device node of: by its name
// (nvidia<N> in /dev, or in a driver root's dev directory) and by its
// numbers, where the doctor sees a character device there.
func (gn gpuNodes) hostMinors(host string) []int {
	var out []int
	host = filepath.Clean(host)
	if m := gpuNodeName.FindStringSubmatch(filepath.Base(host)); m != nil && filepath.Base(filepath.Dir(host)) == "dev" {
		if n, err := strconv.Atoi(m[1]); err == nil {
			out = append(out, n)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(gn.seen(host), &st); err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR {
		if major, minor := unix.Major(st.Rdev), unix.Minor(st.Rdev); major == nvidiaMajor && minor < controlMinors {
			out = append(out, int(minor))
		}
	}
	return out
}
