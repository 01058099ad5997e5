package draplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

	const mib = 1 << 20
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
