package gpuusage

import "testing"

const (
	uid = "1a2b3c4d-5e6f-4711-8899-aabbccddeeff"
	id  = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func TestContainerOf(t *testing.T) {
	want := Container{PodUID: uid, ID: id}
	for _, tt := range []struct {
		name, cgroup string
		ok           bool
	}{
		{"v2, systemd driver, containerd, burstable", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_5e6f_4711_8899_aabbccddeeff.slice/cri-containerd-" + id + ".scope\n", true},
		{"v2, systemd driver, guaranteed", "0::/kubepods.slice/kubepods-pod1a2b3c4d_5e6f_4711_8899_aabbccddeeff.slice/cri-containerd-" + id + ".scope", true},
		{"v2, systemd driver, CRI-O", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b3c4d_5e6f_4711_8899_aabbccddeeff.slice/crio-" + id + ".scope", true},
		{"v2, cgroupfs driver", "0::/kubepods/burstable/pod" + uid + "/" + id, true},
		{"v2, cgroupfs driver, CRI-O", "0::/kubepods/burstable/pod" + uid + "/crio-" + id, true},
		{"CRI-O's conmon, cgroupfs driver", "0::/kubepods/burstable/pod" + uid + "/crio-conmon-" + id, false},
		{"v2, cgroupfs driver, guaranteed", "0::/kubepods/pod" + uid + "/" + id, true},
		{"v2, kubelet in a slice of its own", "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod1a2b3c4d_5e6f_4711_8899_aabbccddeeff.slice/cri-containerd-" + id + ".scope", true},
		{"v1, one line per hierarchy", "12:pids:/kubepods/besteffort/pod" + uid + "/" + id + "\n11:memory:/kubepods/besteffort/pod" + uid + "/" + id + "\n0::/", true},
		{"CRI-O's conmon is not the container", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1a2b3c4d_5e6f_4711_8899_aabbccddeeff.slice/crio-conmon-" + id + ".scope", false},
		{"the pod's own cgroup (a pause process's parent)", "0::/kubepods/burstable/pod" + uid, false},
		{"a host service", "0::/system.slice/nvidia-mps.service", false},
		{"a cgroup namespace hides the path", "0::/", false},
		{"a short container ID", "0::/kubepods/pod" + uid + "/abc", false},
		{"not a UID", "0::/kubepods/podnotauid/" + id, false},
		{"a slice named pod-something", "0::/user.slice/mypod" + uid + ".slice/cri-containerd-" + id + ".scope", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ContainerOf(tt.cgroup)
			if ok != tt.ok || (ok && got != want) {
				t.Errorf("ContainerOf(%q) = %+v, %v; want %+v, %v", tt.cgroup, got, ok, want, tt.ok)
			}
		})
	}
}
