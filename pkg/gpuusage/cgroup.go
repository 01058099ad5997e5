package gpuusage

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Container is a container as the kubelet names its cgroup: the pod's UID
// and the runtime's container ID.
type Container struct {
	PodUID string
	ID     string
}

// ContainerOf finds the container a process runs in from its
// /proc/PID/cgroup: the kubelet puts every container in a cgroup under its
// pod's, named by the pod's UID (systemd driver:
// kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope;
// cgroupfs driver: kubepods/burstable/pod<uid>/<id>). Both cgroup v2's
// single line and v1's line per hierarchy are read. ok is false for a
// process outside any pod (the MPS daemon, a host process) and for a
// cgroup namespace that hides the path ("0::/").
func ContainerOf(cgroupFile string) (Container, bool) {
	for _, line := range strings.Split(cgroupFile, "\n") {
		// hierarchy-ID:controllers:path; the path may hold colons.
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if c, ok := containerOfPath(parts[2]); ok {
			return c, true
		}
	}
	return Container{}, false
}

func containerOfPath(path string) (Container, bool) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for i := 0; i+1 < len(segs); i++ {
		uid, ok := podUIDOf(segs[i])
		if !ok {
			continue
		}
		id, ok := containerIDOf(segs[i+1])
		if !ok {
			return Container{}, false
		}
		return Container{PodUID: uid, ID: id}, true
	}
	return Container{}, false
}

// podUIDOf reads a pod's UID from its cgroup's name: pod<uid> (cgroupfs)
// or kubepods[-<qos>]-pod<uid with _ for ->.slice (systemd).
func podUIDOf(seg string) (string, bool) {
	name, slice := strings.CutSuffix(seg, ".slice")
	i := strings.LastIndex(name, "pod")
	if i < 0 || (i > 0 && name[i-1] != '-') || (slice != (i > 0)) {
		return "", false
	}
	uid := name[i+len("pod"):]
	if slice {
		uid = strings.ReplaceAll(uid, "_", "-")
	}
	if len(uid) != 36 || strings.Count(uid, "-") != 4 {
		return "", false
	}
	return uid, true
}

// runtimePrefixes are how runtimes name a container's systemd scope.
var runtimePrefixes = []string{"cri-containerd-", "crio-", "docker-", "cri-dockerd-"}

// containerIDOf reads a container's ID from its cgroup's name: <id>
// (containerd, cgroupfs), <runtime>-<id>.scope (systemd) or crio-<id>
// (CRI-O, cgroupfs). CRI-O's conmon (crio-conmon-<id>) is not the
// container.
func containerIDOf(seg string) (string, bool) {
	id, scope := strings.CutSuffix(seg, ".scope")
	found := false
	for _, p := range runtimePrefixes {
		if rest, ok := strings.CutPrefix(id, p); ok {
			id, found = rest, true
			break
		}
	}
	if scope && !found {
		return "", false
	}
	if len(id) != 64 {
		return "", false
	}
	for _, r := range id {
		if (r < '0' || r > '9') && (r < 'a' || r > 'f') {
			return "", false
		}
	}
	return id, true
}

// ProcCgroups reads processes' cgroups from a procfs mount. On a node the
// plugin must see the host's processes: NVML gives host PIDs, so the
// procfs is the host's (the chart mounts it at /host/proc) or the plugin
// runs in the host's PID namespace.
type ProcCgroups struct{ Root string }

// Cgroup returns the content of Root/PID/cgroup.
func (p ProcCgroups) Cgroup(pid uint32) (string, error) {
	data, err := os.ReadFile(filepath.Join(p.Root, strconv.FormatUint(uint64(pid), 10), "cgroup"))
	if err != nil {
		return "", fmt.Errorf("cgroup of process %d: %w", pid, err)
	}
	return string(data), nil
}
