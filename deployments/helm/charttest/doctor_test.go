//go:build charttest

package charttest

import (
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// checkDoctor: the DRA plugin's pod runs kyb-dra-plugin doctor first, with
// the plugin's whole environment, mounts and security context, so that it
// examines what the plugin will use; the shim's pod runs none.
func checkDoctor(t *testing.T, m *manifest, tc chartCase) {
	ds := daemonSet(t, m)
	spec := ds.Spec.Template.Spec
	if tc.deviceMode {
		if len(spec.InitContainers) != 0 {
			t.Errorf("the shim's pod has init containers: %v", spec.InitContainers)
		}
		return
	}
	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != "doctor" {
		t.Fatalf("init containers %v, want the doctor", spec.InitContainers)
	}
	doc, plugin := spec.InitContainers[0], spec.Containers[0]
	if !slices.Equal(doc.Command, []string{"/usr/local/bin/kyb-dra-plugin", "doctor"}) || doc.Image != plugin.Image {
		t.Errorf("doctor runs %v of %s, want kyb-dra-plugin doctor of %s", doc.Command, doc.Image, plugin.Image)
	}
	docEnv := env(doc)
	for name, v := range env(plugin) {
		if !reflect.DeepEqual(docEnv[name], v) {
			t.Errorf("doctor's %s = %+v, the plugin's %+v", name, docEnv[name], v)
		}
	}
	if docEnv["KYB_HOST_ROOT"].Value != "/host" {
		t.Errorf("doctor's KYB_HOST_ROOT = %q, want /host", docEnv["KYB_HOST_ROOT"].Value)
	}
	if docEnv["KYB_CONTAINERD_CONFIG"].Value != "/etc/containerd/config.toml" {
		t.Errorf("doctor's KYB_CONTAINERD_CONFIG = %q, want /etc/containerd/config.toml", docEnv["KYB_CONTAINERD_CONFIG"].Value)
	}
	if _, ok := docEnv["KYB_DOCTOR_REPORT_ONLY"]; ok {
		t.Error("the doctor blocks by default, but KYB_DOCTOR_REPORT_ONLY is set")
	}
	if !reflect.DeepEqual(doc.SecurityContext, plugin.SecurityContext) {
		t.Errorf("doctor's security context %+v, the plugin's %+v", doc.SecurityContext, plugin.SecurityContext)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, vm := range doc.VolumeMounts {
		mounts[vm.Name] = vm
	}
	for _, vm := range plugin.VolumeMounts {
		if !reflect.DeepEqual(mounts[vm.Name], vm) {
			t.Errorf("doctor's mount %s = %+v, the plugin's %+v", vm.Name, mounts[vm.Name], vm)
		}
	}
	runtime, ok := mounts["runtime-config-0"]
	if !ok || runtime.MountPath != "/host/etc/containerd" || !runtime.ReadOnly {
		t.Errorf("doctor's runtime configuration mount: %+v", runtime)
	}
	for _, v := range spec.Volumes {
		if v.Name == "runtime-config-0" && (v.HostPath == nil || v.HostPath.Path != "/etc/containerd") {
			t.Errorf("runtime configuration volume: %+v", v)
		}
	}
}

func TestDoctorValues(t *testing.T) {
	helmBinary(t)
	m := render(t, nil, "doctor.blocking=false", "doctor.runtimeConfigDirs={/etc/crio}")
	spec := daemonSet(t, m).Spec.Template.Spec
	if len(spec.InitContainers) != 1 || env(spec.InitContainers[0])["KYB_DOCTOR_REPORT_ONLY"].Value != "true" {
		t.Errorf("doctor.blocking=false: %+v", spec.InitContainers)
	}
	if vm := spec.InitContainers[0].VolumeMounts; vm[len(vm)-1].MountPath != "/host/etc/crio" {
		t.Errorf("doctor.runtimeConfigDirs={/etc/crio}: mounts %+v", vm)
	}
	// k3s keeps containerd's configuration under its own directory.
	k3s := "/var/lib/rancher/k3s/agent/etc/containerd"
	m = render(t, nil, "doctor.runtimeConfigDirs={"+k3s+"}", "doctor.containerdConfig="+k3s+"/config.toml")
	doc := daemonSet(t, m).Spec.Template.Spec.InitContainers[0]
	if got := env(doc)["KYB_CONTAINERD_CONFIG"].Value; got != k3s+"/config.toml" {
		t.Errorf("doctor.containerdConfig: KYB_CONTAINERD_CONFIG = %q", got)
	}
	if vm := doc.VolumeMounts; vm[len(vm)-1].MountPath != "/host"+k3s {
		t.Errorf("doctor.runtimeConfigDirs={%s}: mounts %+v", k3s, vm)
	}
	m = render(t, nil, "doctor.enabled=false")
	spec = daemonSet(t, m).Spec.Template.Spec
	if len(spec.InitContainers) != 0 {
		t.Errorf("doctor.enabled=false: %+v", spec.InitContainers)
	}
	for _, v := range spec.Volumes {
		if v.Name == "runtime-config-0" {
			t.Error("doctor.enabled=false still mounts the runtime's configuration")
		}
	}
}
