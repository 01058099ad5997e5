package draplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// claimOnGPUs is a pod's claim with one 1x request per entry of gpus, on
// that GPU, allocated by the scheduler's allocator.
func (e *env) claimOnGPUs(requests []string, gpus []int) *resourceapi.ResourceClaim {
	e.t.Helper()
	e.claimN++
	c := schedulertest.Claim(fmt.Sprintf("claim-%d", e.claimN), class1x, 1)
	c.UID = types.UID(fmt.Sprintf("0000000%d-1111-2222-3333-444444444444", e.claimN))
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "pod", UID: "pod-uid", Controller: new(true)}}
	c.Spec.Devices.Requests = nil
	for i, r := range requests {
		req := resourceapi.DeviceRequest{Name: r, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class1x, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}
		schedulertest.WithSelector(fmt.Sprintf(`device.attributes["gpu.kyb.ai"].gpuIndices == "%d"`, gpus[i]))(&req)
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, req)
	}
	alloc, err := e.cluster.Allocate(e.ctx, c, nodeName)
	if err != nil || alloc == nil {
		e.t.Fatalf("allocate %v on GPUs %v: %v %v", requests, gpus, alloc, err)
	}
	for i := range alloc.Devices.Results {
		alloc.Devices.Results[i].Pool = nodeName
	}
	c.Status.Allocation = alloc
	return e.store(c)
}

const mib = 1 << 20

// A container that uses one request of a claim with several is counted
// on that request's seats only: two seats of one GPU, one for the request
// it uses, one for a request another container uses, and a third request
// on another GPU. Its process on that other GPU is no seat's. The
// requests come from the container's device metadata mounts, which the
// kubelet gives a container for the requests it references and no other.
func TestPerPodUsageCountsTheRequestsAContainerUses(t *testing.T) {
	var e *env
	var u usageNode
	file := filepath.Join(t.TempDir(), "processes")
	e = newEnv(t, "nvlink-2x4", seed, func(x *env) {
		e = x
		withUsage(x, file, &u)(x)
		usage := x.opts
		x.opts = func(o *draplugin.Options) { usage(o); o.DeviceMetadata = true }
	})
	claim := e.claimOnGPUs([]string{"mine", "theirs", "far"}, []int{0, 0, 1})
	res := e.prepare(claim)[string(claim.UID)]
	if res == nil || res.Error != "" {
		t.Fatalf("prepare: %+v", res)
	}
	// The CDI devices of one request, as the kubelet passes them to the
	// runtime for a container that references it alone.
	idsOf := func(request string) []string {
		var ids []string
		for _, d := range res.Devices {
			if slices.Contains(d.RequestNames, request) {
				ids = append(ids, d.CdiDeviceIds...)
			}
		}
		return ids
	}
	mineEnv, _ := e.container(idsOf("mine")...)
	theirsEnv, _ := e.container(idsOf("theirs")...)
	group, mySeat := mineEnv["KYB_GPU_GROUP"], mineEnv["KYB_GPU_SEAT"]
	if theirsEnv["KYB_GPU_GROUP"] != group || theirsEnv["KYB_GPU_SEAT"] == mySeat {
		t.Fatalf("requests mine (%s seat %s) and theirs (%s seat %s): the test wants two seats of one group", group, mySeat, theirsEnv["KYB_GPU_GROUP"], theirsEnv["KYB_GPU_SEAT"])
	}

	const podUID = "cccccccc-0000-4000-8000-00000000000c"
	id := strings.Repeat("c", 64)
	u.run(t, podUID, claim.Namespace, "split", "uses-mine", id, claim)
	cg := "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice/cri-containerd-" + id + ".scope"
	procs := []simnode.Process{
		{GPU: 0, PID: 401, MemoryMiB: 1024, SMPercent: 10, Cgroup: cg},
		{GPU: 1, PID: 401, MemoryMiB: 256, SMPercent: 5, Cgroup: cg},
	}
	u.mount(t, 401, e.inject(idsOf("mine")...).Mounts)
	if err := os.WriteFile(file, simnode.FormatProcesses(procs), 0o644); err != nil {
		t.Fatal(err)
	}

	mine := map[string]string{"namespace": claim.Namespace, "pod": "split", "container": "uses-mine", "group": group, "seat": mySeat, "gpu": "0"}
	err := wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		got, ok := e.gathered("kyb_container_gpu_memory_used_bytes", mine)
		return ok && got == 1024*mib, nil
	})
	if err != nil {
		got, ok := e.gathered("kyb_container_gpu_memory_used_bytes", map[string]string{"pod": "split", "gpu": "0"})
		t.Fatalf("the container's process on GPU 0 is not on its request's seat %v alone: %v (present %v) on other labels", mine, got, ok)
	}
	if got, ok := e.gathered("kyb_container_gpu_memory_used_bytes", map[string]string{"pod": "split", "gpu": "1"}); ok {
		t.Errorf("the container's process on GPU 1, which only a request it does not use holds, is given to a seat (%v)", got)
	}
	if got, ok := e.gathered("kyb_gpu_unattributed_memory_used_bytes", map[string]string{"gpu": "1", "reason": "no-seat-here"}); !ok || got != 256*mib {
		t.Errorf("no-seat-here on GPU 1 = %v (present %v), want %v", got, ok, 256*mib)
	}
}

// usageEnv is a node with per-pod GPU metrics, device metadata on or off
// as *metadataOn says at each start.
func usageEnv(t *testing.T, metadataOn *bool) (*env, *usageNode, string) {
	var e *env
	u := &usageNode{}
	file := filepath.Join(t.TempDir(), "processes")
	e = newEnv(t, "nvlink-2x4", seed, func(x *env) {
		e = x
		withUsage(x, file, u)(x)
		usage := x.opts
		x.opts = func(o *draplugin.Options) { usage(o); o.DeviceMetadata = *metadataOn }
	})
	return e, u, file
}

// containerCgroup is the cgroup of a container of a pod, as the systemd
// cgroup driver and containerd name it.
func containerCgroup(podUID, id string) string {
	return "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + strings.ReplaceAll(podUID, "-", "_") + ".slice/cri-containerd-" + id + ".scope"
}

// waitForMemory waits until a container's series reports want bytes.
func (e *env) waitForMemory(labels map[string]string, want float64) error {
	return wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		got, ok := e.gathered("kyb_container_gpu_memory_used_bytes", labels)
		return ok && got == want, nil
	})
}

// A container holds claim A, prepared while device metadata was off (it
// has no metadata mount), and claim B, prepared after the plugin restarted
// with it on (it has one). Its process on A's GPU is counted on A's seat:
// a claim with no mount comes from PodResources, beside the mounted ones.
func TestPerPodUsageCountsAClaimPreparedBeforeDeviceMetadata(t *testing.T) {
	metadataOn := false
	e, u, file := usageEnv(t, &metadataOn)
	a := e.claimOnGPU("default", 0)
	idsA := e.prepareOK(a)
	metadataOn = true
	e.restart()
	b := e.claimOnGPU("default", 1)
	idsB := e.prepareOK(b)
	envA, _ := e.container(idsA...)

	const podUID = "dddddddd-0000-4000-8000-00000000000d"
	id := strings.Repeat("d", 64)
	u.run(t, podUID, "default", "both", "app", id, a, b)
	u.mount(t, 601, e.inject(slices.Concat(idsA, idsB)...).Mounts)
	procs := []simnode.Process{{GPU: 0, PID: 601, MemoryMiB: 1024, SMPercent: 10, Cgroup: containerCgroup(podUID, id)}}
	if err := os.WriteFile(file, simnode.FormatProcesses(procs), 0o644); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"namespace": "default", "pod": "both", "container": "app", "group": envA["KYB_GPU_GROUP"], "seat": envA["KYB_GPU_SEAT"], "gpu": "0"}
	if err := e.waitForMemory(want, 1024*mib); err != nil {
		nsh, _ := e.gathered("kyb_gpu_unattributed_memory_used_bytes", map[string]string{"gpu": "0", "reason": "no-seat-here"})
		t.Errorf("the process on claim A's GPU is not counted on A's seat %v (no-seat-here on GPU 0: %v bytes)", want, nsh)
	}
}

// A container that can make mounts of its own (a user and mount namespace
// of its own) may add a metadata mount naming a claim it does not hold.
// Such a mount does not move its use: only a file on the plugin's data
// directory's filesystem counts, of a claim of the pod's namespace that
// the kubelet lists for the container. The tenant's process on a GPU where
// another claim holds a seat stays on its own seat.
func TestPerPodUsageIgnoresMountsOfClaimsTheContainerDoesNotHold(t *testing.T) {
	metadataOn := true
	e, u, file := usageEnv(t, &metadataOn)
	victim := e.claimOnGPU("default", 0)
	e.prepareOK(victim)
	neighbour := e.claimOnGPU("tenant", 0)
	e.prepareOK(neighbour)
	tenant := e.claimOnGPU("tenant", 0)
	idsT := e.prepareOK(tenant)
	envT, _ := e.container(idsT...)
	dataDev := mountDevice(e.dirs.plugin)
	forge := func(dev, root string, c *resourceapi.ResourceClaim) string {
		return fmt.Sprintf("1400 1203 %s %s /var/run/kubernetes.io/dra-device-attributes/resourceclaims/%s/gpu/gpu.kyb.ai-metadata.json ro,relatime - ext4 /dev/x rw", dev, root, c.Name)
	}
	inData := func(c *resourceapi.ResourceClaim) string {
		return filepath.Join(e.dirs.plugin, "dra-device-metadata", c.Namespace+"_"+c.Name, "gpu", "metadata.json")
	}
	for i, tc := range []struct{ name, forged string }{
		{"another namespace's claim, from the container's own filesystem",
			forge("0:312", fmt.Sprintf("/tmp/x/dra-device-metadata/default_%s/gpu/metadata.json", victim.Name), victim)},
		{"another namespace's claim, from the data directory's filesystem", forge(dataDev, inData(victim), victim)},
		{"a claim of its namespace it does not hold", forge(dataDev, inData(neighbour), neighbour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			podUID := fmt.Sprintf("eeeeeeee-0000-4000-8000-00000000000%d", i)
			id := strings.Repeat(strconv.Itoa(i), 64)
			pod := fmt.Sprintf("sneaky-%d", i)
			pid := uint32(700 + i)
			u.run(t, podUID, "tenant", pod, "app", id, tenant)
			u.mount(t, pid, e.inject(idsT...).Mounts, tc.forged)
			procs := []simnode.Process{{GPU: 0, PID: pid, MemoryMiB: 2048, SMPercent: 10, Cgroup: containerCgroup(podUID, id)}}
			if err := os.WriteFile(file, simnode.FormatProcesses(procs), 0o644); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"namespace": "tenant", "pod": pod, "container": "app", "group": envT["KYB_GPU_GROUP"], "seat": envT["KYB_GPU_SEAT"], "gpu": "0"}
			if err := e.waitForMemory(want, 2048*mib); err != nil {
				t.Errorf("the tenant's process is not counted on its own seat %v alone; series: %v", want, e.series("kyb_container_gpu_memory_used_bytes"))
			}
		})
	}
}

// A container's first GPU process may have exited when its mounts are
// read (a short-lived CUDA process: a probe, a launcher). Its mounts are
// read from a process that still runs, and the container is counted on
// the seat of the request it uses, not on its claim's every seat.
func TestPerPodUsageReadsTheMountsOfAProcessThatRuns(t *testing.T) {
	metadataOn := true
	e, u, file := usageEnv(t, &metadataOn)
	claim := e.claimOnGPUs([]string{"mine", "theirs"}, []int{0, 0})
	res := e.prepare(claim)
	if r := res[string(claim.UID)]; r == nil || r.Error != "" {
		t.Fatalf("prepare: %+v", r)
	}
	mine := requestIDs(res, string(claim.UID), "mine")
	env, _ := e.container(mine...)

	const podUID = "ffffffff-0000-4000-8000-00000000000f"
	id := strings.Repeat("f", 64)
	u.run(t, podUID, claim.Namespace, "split", "uses-mine", id, claim)
	// PID 801 is gone: no /proc/801/mountinfo. PID 802 runs.
	u.mount(t, 802, e.inject(mine...).Mounts)
	cg := containerCgroup(podUID, id)
	procs := []simnode.Process{
		{GPU: 0, PID: 801, MemoryMiB: 512, SMPercent: 1, Cgroup: cg},
		{GPU: 0, PID: 802, MemoryMiB: 1024, SMPercent: 10, Cgroup: cg},
	}
	if err := os.WriteFile(file, simnode.FormatProcesses(procs), 0o644); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"namespace": claim.Namespace, "pod": "split", "container": "uses-mine", "group": env["KYB_GPU_GROUP"], "seat": env["KYB_GPU_SEAT"], "gpu": "0"}
	if err := e.waitForMemory(want, 1536*mib); err != nil {
		t.Errorf("the container's processes are not on the seat of the request it uses %v; series: %v", want, e.series("kyb_container_gpu_memory_used_bytes"))
	}
}

// series lists a metric family's series, for failure messages.
func (e *env) series(name string) []string {
	families, _ := e.driver.Registry().Gather()
	var out []string
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.Metric {
				out = append(out, m.String())
			}
		}
	}
	return out
}
