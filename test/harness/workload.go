package harness

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// GPUUse says what a container's workload uses of each GPU its seats give
// it: memory in MiB and a share of the SM time in percent. ok false: the
// container runs nothing on its GPUs.
type GPUUse func(pod *v1.Pod, container string) (memoryMiB uint64, smPercent uint32, ok bool)

// containerID is the runtime ID a container of this node gets: 64 hex
// digits, as containerd's.
func containerID(pod types.UID, container string) string {
	sum := sha256.Sum256([]byte(string(pod) + "/" + container))
	return hex.EncodeToString(sum[:])
}

// cgroupOf is the container's cgroup as the kubelet's systemd driver and
// containerd name it, as /proc/PID/cgroup shows it under cgroup v2.
func cgroupOf(pod types.UID, container string) string {
	uid := strings.ReplaceAll(string(pod), "-", "_")
	return fmt.Sprintf("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice/cri-containerd-%s.scope", uid, containerID(pod, container))
}

// procKey is one process: a container's on one GPU.
type procKey struct {
	pod       types.UID
	container string
	gpu       int
}

// processTable is the simulated processes of the node's running
// containers: the plugin's processes file (NodeFiles.ProcessesFile) and
// each process's mountinfo under NodeFiles.HostProc. Node.mu guards it.
type processTable struct {
	file, hostProc string
	use            GPUUse
	// gpuUUID is the UUID of the node's GPU i.
	gpuUUID func(i int) string
	pids    map[procKey]uint32
	nextPID uint32
}

// write writes the processes the running containers have on their GPUs:
// one per container and GPU of its seats, with the use GPUUse gives.
func (t *processTable) write(pods map[types.UID]*v1.Pod, containers map[types.UID]map[string]*Container) error {
	if t.use == nil {
		return nil
	}
	var procs []simnode.Process
	live := map[procKey]bool{}
	for _, uid := range slices.Sorted(maps.Keys(containers)) {
		pod := pods[uid]
		ctrs := containers[uid]
		for _, name := range slices.Sorted(maps.Keys(ctrs)) {
			mem, sm, ok := t.use(pod, name)
			if !ok {
				continue
			}
			for _, gpu := range t.gpusOf(ctrs[name]) {
				key := procKey{uid, name, gpu}
				live[key] = true
				pid, ok := t.pids[key]
				if !ok {
					t.nextPID++
					pid = t.nextPID
					t.pids[key] = pid
				}
				procs = append(procs, simnode.Process{GPU: gpu, PID: pid, MemoryMiB: mem, SMPercent: sm, Cgroup: cgroupOf(uid, name)})
			}
		}
	}
	for key, pid := range t.pids {
		if !live[key] {
			delete(t.pids, key)
			_ = os.RemoveAll(filepath.Join(t.hostProc, strconv.FormatUint(uint64(pid), 10)))
		}
	}
	for key := range live {
		if err := t.writeMountinfo(t.pids[key], containers[key.pod][key.container]); err != nil {
			return err
		}
	}
	tmp := t.file + ".tmp"
	if err := os.WriteFile(tmp, simnode.FormatProcesses(procs), 0o644); err != nil {
		return fmt.Errorf("write the simulated processes: %w", err)
	}
	return os.Rename(tmp, t.file)
}

// gpusOf reads the GPUs a container sees from NVIDIA_VISIBLE_DEVICES
// (this node's GPU UUIDs), else from CUDA_VISIBLE_DEVICES. The latter may
// name every GPU of the node by index where a container holds combined
// claims: CUDA then finds only those whose device nodes the container has.
func (t *processTable) gpusOf(c *Container) []int {
	list := c.Env["NVIDIA_VISIBLE_DEVICES"]
	if list == "" {
		list = c.Env["CUDA_VISIBLE_DEVICES"]
	}
	var out []int
	for _, v := range strings.Split(list, ",") {
		if v == "" {
			continue
		}
		if i, err := strconv.Atoi(v); err == nil {
			out = append(out, i)
			continue
		}
		for i := range 256 {
			if t.gpuUUID(i) == v {
				out = append(out, i)
				break
			}
		}
	}
	return out
}

// freeAddress is a loopback address with a port nothing listens on.
func freeAddress() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// writeMountinfo writes a process's /proc/PID/mountinfo under hostProc:
// its container's root and the mounts its CDI devices gave it (the
// device metadata files among them), bind mounts from the filesystem each
// source is on, taken to be mounted at /, as the kernel lists them.
func (t *processTable) writeMountinfo(pid uint32, c *Container) error {
	var b strings.Builder
	b.WriteString("1203 1150 0:312 / / rw,relatime - overlay overlay rw\n")
	for i, m := range c.Mounts {
		dev, err := gpuusage.DeviceOf(m.Source)
		if err != nil {
			dev = "259:2"
		}
		fmt.Fprintf(&b, "%d 1203 %s %s %s ro,relatime - ext4 /dev/root rw\n", 1300+i, dev, escapeMountPath(m.Source), escapeMountPath(m.Destination))
	}
	dir := filepath.Join(t.hostProc, strconv.FormatUint(uint64(pid), 10))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write the simulated mounts: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "mountinfo"), []byte(b.String()), 0o644)
}

// escapeMountPath escapes a path as mountinfo does (space, tab, newline,
// backslash in octal).
func escapeMountPath(p string) string {
	return strings.NewReplacer(" ", `\040`, "\t", `\011`, "\n", `\012`, `\`, `\134`).Replace(p)
}
