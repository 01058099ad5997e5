//go:build charttest

package charttest

import (
	"cmp"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func checkPodSecurity(t *testing.T, m *manifest, tc chartCase) {
	ds := daemonSet(t, m)
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	// MPS daemons outlive the pod only outside its PID namespace.
	if pod.HostNetwork || pod.HostPID != tc.mps || pod.HostIPC {
		t.Errorf("host namespaces: network %v, pid %v, ipc %v; want the host's PID namespace only with mps (%v)", pod.HostNetwork, pod.HostPID, pod.HostIPC, tc.mps)
	}
	if pod.PriorityClassName != "system-node-critical" {
		t.Errorf("priority class %q", pod.PriorityClassName)
	}
	if got := *pod.AutomountServiceAccountToken; got != !tc.deviceMode {
		t.Errorf("automountServiceAccountToken %v; only the DRA plugin calls the API", got)
	}
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("no container securityContext")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem is not true")
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("seccompProfile is not RuntimeDefault")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.RunAsNonRoot == nil || *sc.RunAsNonRoot {
		t.Error("want runAsUser 0 and runAsNonRoot false (root-owned host directories)")
	}
	e := env(c)
	if tc.mps {
		wantEnv := map[string]string{"KYB_MPS_CGROUP": "/sys/fs/cgroup/kyb-mps", "KYB_MPS_SHM_SIZE_MIB": cmp.Or(tc.mpsShm, "256")}
		if tc.deviceMode {
			wantEnv["POD_RESOURCES_SOCKET"] = "/var/lib/kubelet/pod-resources/kubelet.sock"
		}
		for k, v := range wantEnv {
			if e[k].Value != v {
				t.Errorf("%s=%q, want %q", k, e[k].Value, v)
			}
		}
		// Unset by default: the plugin's own default, the driver's
		// command, or on a simulated node its built-in simulator.
		if mc, set := e["KYB_MPS_CONTROL"]; set != (tc.mpsControl != "") || mc.Value != tc.mpsControl {
			t.Errorf("KYB_MPS_CONTROL=%q (set %v), want %q", mc.Value, set, tc.mpsControl)
		}
		if tc.deviceMode && (e["POD_NAME"].ValueFrom == nil || e["POD_NAMESPACE"].ValueFrom == nil) {
			t.Error("the shim does not know its own pod, so it would believe a kubelet that has just started and lists no pod")
		}
	} else if _, set := e["KYB_MPS_CGROUP"]; set {
		t.Error("KYB_MPS_CGROUP is set without mps.enabled")
	}
	if tc.mig {
		// The NVIDIA runtime, asked for GPUs, covers the driver's
		// /proc/driver/nvidia, where NVML finds the MIG config
		// capability, with a copy that lacks it.
		if v, set := e["NVIDIA_VISIBLE_DEVICES"]; !set || v.Value != "void" {
			t.Errorf("a MIG profile on real GPUs: NVIDIA_VISIBLE_DEVICES=%q (set %v), want void", v.Value, set)
		}
		if _, set := e["NVIDIA_DRIVER_CAPABILITIES"]; set {
			t.Error("a MIG profile on real GPUs asks the NVIDIA runtime for driver capabilities")
		}
	}
	if tc.privileged {
		if sc.Privileged == nil || !*sc.Privileged {
			t.Error("gpuAccess=privileged, mps or a MIG profile renders no privileged container")
		}
		return
	}
	if sc.Privileged == nil || *sc.Privileged {
		t.Error("privileged is not false")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	if sc.Capabilities == nil || !reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("capabilities %+v, want drop [ALL] and nothing added", sc.Capabilities)
	}
	switch {
	case tc.simulated:
		if e["NVIDIA_VISIBLE_DEVICES"].Value != "void" {
			t.Error("a simulated node must keep the NVIDIA runtime from injecting GPUs")
		}
	default:
		if e["NVIDIA_VISIBLE_DEVICES"].Value != "all" {
			t.Error("gpuAccess=nvidia-runtime must ask for every GPU (NVIDIA_VISIBLE_DEVICES=all)")
		}
	}
}

func checkHostPaths(t *testing.T, m *manifest, tc chartCase) {
	ds := daemonSet(t, m)
	pod := ds.Spec.Template.Spec
	mounts := map[string]corev1.VolumeMount{}
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		for _, vm := range c.VolumeMounts {
			mounts[vm.Name] = vm
		}
	}
	type hostMount struct {
		container string
		readOnly  bool
	}
	got := map[string]hostMount{}
	for _, v := range pod.Volumes {
		if v.HostPath == nil {
			continue
		}
		// The MIG capabilities' directory may not exist before the
		// driver's tools first make a node in it.
		if v.HostPath.Path == "/dev/nvidia-caps" && (v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate) {
			t.Errorf("host path /dev/nvidia-caps has type %v, want DirectoryOrCreate", v.HostPath.Type)
		}
		vm, ok := mounts[v.Name]
		if !ok {
			t.Errorf("host path %s is not mounted", v.HostPath.Path)
			continue
		}
		// Only the driver root's mounts follow the host (a driver
		// container mounting its root after the plugin started),
		// and the plugin's data directory carries the MPS daemons' shm
		// tmpfs mounts to the host (mps.shmSizeMiB, privileged pods only;
		// none where the shm directories are plain ones).
		p := vm.MountPropagation
		shmTmpfs := tc.mps && tc.mpsShm != "unbounded"
		switch {
		case p == nil || *p == corev1.MountPropagationNone:
		case *p == corev1.MountPropagationHostToContainer && strings.HasPrefix(v.Name, "driver-root-"):
		case *p == corev1.MountPropagationBidirectional && v.Name == "plugin-data" && shmTmpfs:
		default:
			t.Errorf("host path %s has mount propagation %s", v.HostPath.Path, *p)
		}
		if shmTmpfs && v.Name == "plugin-data" && (p == nil || *p != corev1.MountPropagationBidirectional) {
			t.Errorf("with mps.shmSizeMiB, the daemons' shm tmpfs never reaches the host: plugin-data propagation %v", p)
		}
		got[v.HostPath.Path] = hostMount{container: vm.MountPath, readOnly: vm.ReadOnly}
	}
	root := cmp.Or(tc.kubeletRoot, "/var/lib/kubelet")
	want := map[string]hostMount{
		root + "/plugins/gpu.kyb.ai": {container: root + "/plugins/gpu.kyb.ai"},
		"/var/run/cdi":               {container: "/var/run/cdi"},
	}
	if tc.deviceMode {
		// Fixed in the kubelet, whatever its root directory.
		want["/var/lib/kubelet/device-plugins"] = hostMount{container: "/var/lib/kubelet/device-plugins"}
		// That no pod holds GPUs of the DRA plugin, which MIG seats and
		// (with MPS) which seats are held.
		want[root+"/pod-resources"] = hostMount{container: root + "/pod-resources", readOnly: true}
	} else {
		want[root+"/plugins_registry"] = hostMount{container: root + "/plugins_registry"}
		// Which claims each container references.
		want[root+"/pod-resources"] = hostMount{container: root + "/pod-resources", readOnly: true}
		// The doctor reads the runtime's configuration.
		want["/etc/containerd"] = hostMount{container: "/host/etc/containerd", readOnly: true}
	}
	if !tc.simulated {
		// No /dev: the device numbers come from /proc/devices.
		want["/etc/cdi"] = hostMount{container: "/etc/cdi", readOnly: true}
		if !tc.deviceMode && !tc.noPodGPU {
			// The per-pod GPU metrics read the host's processes' cgroups
			// and mounts, and ask the runtime whose containers they are.
			want["/proc"] = hostMount{container: "/host/proc", readOnly: true}
			want["/run/containerd"] = hostMount{container: "/host/run/containerd", readOnly: true}
		}
		for host, ctr := range tc.driverMount {
			want[host] = hostMount{container: ctr, readOnly: true}
		}
		// A MIG profile: the MIG capabilities' device nodes, NVML opens
		// the config capability's (the container is privileged, so
		// the device cgroup lets it). Nothing of /proc: the container's
		// own shows the driver's capability files, and runc refuses a
		// mount inside /proc.
		if tc.mig {
			want["/dev/nvidia-caps"] = hostMount{container: "/dev/nvidia-caps", readOnly: true}
		}
	}
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == "/proc" || strings.HasPrefix(vm.MountPath, "/proc/") {
				t.Errorf("container %s mounts %s at %s: runc refuses a mount inside /proc", c.Name, vm.Name, vm.MountPath)
			}
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("host paths:\n got %v\nwant %v", got, want)
	}
	e := env(pod.Containers[0])
	if !tc.simulated {
		if e["NVIDIA_DRIVER_ROOT"].Value != "/driver-root" {
			t.Errorf("NVIDIA_DRIVER_ROOT=%q, want /driver-root", e["NVIDIA_DRIVER_ROOT"].Value)
		}
		if _, set := e["KYB_DEV_ROOT"]; set {
			t.Error("KYB_DEV_ROOT is set, but the host's /dev is not mounted")
		}
		for host := range tc.driverMount {
			if tc.driverMount[host] == "/driver-root" && e["NVIDIA_HOST_DRIVER_ROOT"].Value != host {
				t.Errorf("NVIDIA_HOST_DRIVER_ROOT=%q, want %q", e["NVIDIA_HOST_DRIVER_ROOT"].Value, host)
			}
		}
	}
	wantSockets := map[string]string{}
	if !tc.deviceMode {
		wantSockets["POD_RESOURCES_SOCKET"] = root + "/pod-resources/kubelet.sock"
		wantSockets["KUBELET_REGISTRAR_DIRECTORY_PATH"] = root + "/plugins_registry"
		if !tc.simulated && !tc.noPodGPU {
			wantSockets["KYB_CONTAINER_RUNTIME_SOCKET"] = "/host/run/containerd/containerd.sock"
		}
	} else {
		wantSockets["DEVICE_PLUGIN_DIRECTORY_PATH"] = "/var/lib/kubelet/device-plugins/"
		wantSockets["POD_RESOURCES_SOCKET"] = root + "/pod-resources/kubelet.sock"
	}
	wantSockets["KUBELET_PLUGINS_DIRECTORY_PATH"] = root + "/plugins"
	for _, k := range []string{"POD_RESOURCES_SOCKET", "KYB_CONTAINER_RUNTIME_SOCKET", "KUBELET_REGISTRAR_DIRECTORY_PATH", "KUBELET_PLUGINS_DIRECTORY_PATH", "DEVICE_PLUGIN_DIRECTORY_PATH"} {
		if e[k].Value != wantSockets[k] {
			t.Errorf("%s=%q, want %q", k, e[k].Value, wantSockets[k])
		}
	}
	if e["KYB_CONFIG"].Value != "/etc/kyb-dra-driver/config.yaml" || e["NODE_NAME"].ValueFrom == nil || e["NODE_NAME"].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("KYB_CONFIG %+v, NODE_NAME %+v", e["KYB_CONFIG"], e["NODE_NAME"])
	}
}
