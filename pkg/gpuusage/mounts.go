package gpuusage

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A container's claims, and which of their requests it uses, are in its
// mounts. With device metadata on, the kubelet bind-mounts one read-only
// file per request the container uses (only those: a container that
// references one request of a claim gets that request's file alone) at
//
//	/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json
//	/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/<pod claim name>/<request>/<driver>-metadata.json
//
// from the driver's data directory, where the kubelet plugin helper keeps
// it as dra-device-metadata/<namespace>_<claim>/<request>/metadata.json.
// /proc/PID/mountinfo gives both paths: the mount point, and the mount's
// root, the source path within its filesystem. The root names the claim
// itself, also for a claim made from a template; the mount point confirms
// the driver and the request. The kernel writes the file: the container
// cannot change what it says of its mounts. It can add mounts, though,
// given a user and mount namespace of its own: a bind mount of a file it
// made at such a path would name any claim. So a caller takes a mount
// only from the filesystem of its data directory (Device against
// DeviceOf), and only for a claim its container is known to hold.

// metadataDir is where the kubelet mounts the device metadata in a
// container (k8s.io/dynamic-resource-allocation/api/metadata.ContainerDir).
const metadataDir = "/var/run/kubernetes.io/dra-device-attributes/"

// hostMetadataDir is the kubelet plugin helper's directory of metadata
// files within a driver's data directory.
const hostMetadataDir = "/dra-device-metadata/"

// ClaimRequest is one request of a claim whose device metadata a
// container has mounted.
type ClaimRequest struct {
	Namespace, Claim, Request string
	// Device is the major:minor of the filesystem the mounted file is on.
	Device string
}

// MetadataRequests reads from a process's /proc/PID/mountinfo the requests
// of driver's claims its container uses. ok is false when a mount of
// driver's metadata could not be read (a layout this code does not know):
// the caller must not take the list as complete then.
func MetadataRequests(mountinfo, driver string) (reqs []ClaimRequest, ok bool) {
	file := "/" + driver + "-metadata.json"
	ok = true
	for _, line := range strings.Split(mountinfo, "\n") {
		// ID parent major:minor root mountpoint options ... - fstype source superoptions
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		root, mountPoint := unescapeMountPath(fields[3]), unescapeMountPath(fields[4])
		if !strings.HasPrefix(mountPoint, metadataDir) || !strings.HasSuffix(mountPoint, file) {
			continue
		}
		r, good := metadataRequest(root, mountPoint, file)
		if !good {
			ok = false
			continue
		}
		r.Device = fields[2]
		reqs = append(reqs, r)
	}
	return reqs, ok
}

// metadataRequest reads one metadata mount: the claim from its root
// (…/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json), the
// request from both.
func metadataRequest(root, mountPoint, file string) (ClaimRequest, bool) {
	// <kind>/<name>/<request>
	inContainer := strings.Split(strings.TrimSuffix(strings.TrimPrefix(mountPoint, metadataDir), file), "/")
	i := strings.LastIndex(root, hostMetadataDir)
	if len(inContainer) != 3 || i < 0 {
		return ClaimRequest{}, false
	}
	onHost := strings.Split(root[i+len(hostMetadataDir):], "/")
	if len(onHost) != 3 || onHost[2] != "metadata.json" || onHost[1] != inContainer[2] {
		return ClaimRequest{}, false
	}
	// Namespaces and claim names are DNS names: no "_".
	ns, claim, found := strings.Cut(onHost[0], "_")
	if !found || ns == "" || claim == "" || strings.Contains(claim, "_") {
		return ClaimRequest{}, false
	}
	switch inContainer[0] {
	case "resourceclaims":
		if inContainer[1] != claim {
			return ClaimRequest{}, false
		}
	case "resourceclaimtemplates":
	default:
		return ClaimRequest{}, false
	}
	return ClaimRequest{Namespace: ns, Claim: claim, Request: inContainer[2]}, true
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space,
// \011, \012, \134).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// DeviceOf is the major:minor of the filesystem path is on, as mountinfo
// writes it. (On btrfs a subvolume's files report a device of their own,
// which mountinfo does not show: no mount matches then.)
func DeviceOf(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", fmt.Errorf("the device of %s: %w", path, err)
	}
	return fmt.Sprintf("%d:%d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev))), nil
}

// ProcMounts reads processes' mountinfo from a procfs mount, the host's
// (see ProcCgroups).
type ProcMounts struct{ Root string }

// Mountinfo returns the content of Root/PID/mountinfo.
func (p ProcMounts) Mountinfo(pid uint32) (string, error) {
	data, err := os.ReadFile(filepath.Join(p.Root, strconv.FormatUint(uint64(pid), 10), "mountinfo"))
	if err != nil {
		return "", fmt.Errorf("mounts of process %d: %w", pid, err)
	}
	return string(data), nil
}
