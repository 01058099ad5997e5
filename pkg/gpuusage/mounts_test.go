package gpuusage

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// Mounts as containerd makes them for a container of a pod that holds a
// claim made from a template (request "gpus") and one request ("a") of a
// standalone claim, with the kubelet's root on the host's root filesystem
// and, for the second, on a filesystem of its own.
const containerMountinfo = `1203 1150 0:312 / / rw,relatime master:530 - overlay overlay rw,lowerdir=/var/lib/containerd/l1
1204 1203 0:315 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
1210 1203 259:2 /var/lib/kubelet/pods/0d1e/etc-hosts /etc/hosts rw,relatime - ext4 /dev/nvme0n1p2 rw
1211 1203 259:2 /var/lib/kubelet/pods/0d1e/containers/train/81e4 /dev/termination-log rw,relatime - ext4 /dev/nvme0n1p2 rw
1212 1203 259:2 /var/lib/kubelet/plugins/gpu.kyb.ai/dra-device-metadata/team-a_trainer-gpu-x7k2p/gpus/metadata.json /var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/gpus/gpu.kyb.ai-metadata.json ro,relatime - ext4 /dev/nvme0n1p2 rw
1213 1203 259:5 /plugins/gpu.kyb.ai/dra-device-metadata/team-a_shared.pair/a/metadata.json /var/run/kubernetes.io/dra-device-attributes/resourceclaims/shared.pair/a/gpu.kyb.ai-metadata.json ro,relatime - xfs /dev/nvme1n1 rw
1214 1203 259:2 /var/lib/kubelet/plugins/nic.example.com/dra-device-metadata/team-a_nic/n/metadata.json /var/run/kubernetes.io/dra-device-attributes/resourceclaims/nic/n/nic.example.com-metadata.json ro,relatime - ext4 /dev/nvme0n1p2 rw
1220 1203 0:320 /null /dev/nvidia0 rw,nosuid - devtmpfs devtmpfs rw
`

// The requests a container uses come from its metadata mounts: the claim
// from the mount's root (also for a claim made from a template), the
// request from both; another driver's mounts are not ours; a mount of
// ours in a layout not understood makes the answer incomplete.
func TestMetadataRequests(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mountinfo string
		want      []ClaimRequest
		ok        bool
	}{
		{"template and standalone claims", containerMountinfo, []ClaimRequest{
			{Namespace: "team-a", Claim: "trainer-gpu-x7k2p", Request: "gpus", Device: "259:2"},
			{Namespace: "team-a", Claim: "shared.pair", Request: "a", Device: "259:5"},
		}, true},
		{"no claim", "1203 1150 0:312 / / rw - overlay overlay rw\n", nil, true},
		{"escaped path", `7 1 8:1 /var/lib/kube\040let/plugins/gpu.kyb.ai/dra-device-metadata/ns_c/r/metadata.json /var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/r/gpu.kyb.ai-metadata.json ro - ext4 /dev/sda1 rw`,
			[]ClaimRequest{{Namespace: "ns", Claim: "c", Request: "r", Device: "8:1"}}, true},
		{"request differs", `7 1 8:1 /p/dra-device-metadata/ns_c/r/metadata.json /var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/other/gpu.kyb.ai-metadata.json ro - ext4 /dev/sda1 rw`, nil, false},
		{"claim differs", `7 1 8:1 /p/dra-device-metadata/ns_c/r/metadata.json /var/run/kubernetes.io/dra-device-attributes/resourceclaims/d/r/gpu.kyb.ai-metadata.json ro - ext4 /dev/sda1 rw`, nil, false},
		{"unknown root", `7 1 8:1 /elsewhere/metadata.json /var/run/kubernetes.io/dra-device-attributes/resourceclaims/c/r/gpu.kyb.ai-metadata.json ro - ext4 /dev/sda1 rw`, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := MetadataRequests(tc.mountinfo, "gpu.kyb.ai")
			if !reflect.DeepEqual(got, tc.want) || ok != tc.ok {
				t.Errorf("MetadataRequests = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// A file's device is written as mountinfo writes it: the device a mount
// of the file's filesystem shows.
func TestDeviceOf(t *testing.T) {
	dir := t.TempDir()
	got, err := DeviceOf(dir)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	// The mount with the longest mount point above dir is dir's.
	var want, longest string
	for _, line := range strings.Split(string(self), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountPath(f[4])
		if (dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(longest) {
			want, longest = f[2], mp
		}
	}
	if got != want {
		t.Errorf("DeviceOf(%s) = %s; mountinfo shows %s for %s", dir, got, want, longest)
	}
	if _, err := DeviceOf(filepath.Join(dir, "gone")); err == nil {
		t.Error("DeviceOf a path that does not exist: no error")
	}
}

func TestProcMounts(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "42"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "42", "mountinfo"), []byte(containerMountinfo), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := (ProcMounts{Root: root}).Mountinfo(42); err != nil || got != containerMountinfo {
		t.Errorf("Mountinfo(42) = %q, %v", got, err)
	}
	if _, err := (ProcMounts{Root: root}).Mountinfo(43); err == nil {
		t.Error("Mountinfo of a process that is gone: no error")
	}
}
