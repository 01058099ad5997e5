package draplugin_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/api/metadata"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// On nvlink-2x4 (80 GiB GPUs): sized seats on single GPUs and on pairs,
// with their default sizes, the node's simulated MPS daemon holding them.
const sizedConfig = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 4
  gpus: [0, 1, 2, 3]
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-2x-sized
  seatsPerGroup: 4
  gpus: [4, 5, 6, 7]
  sharing: {strategy: mps, sized: true}
`

const (
	classSized   = "gpu-1x-sized.kyb.ai"
	classSized2x = "gpu-2x-sized.kyb.ai"
)

func sized(memory, compute string) func(*resourceapi.DeviceRequest) {
	return func(r *resourceapi.DeviceRequest) {
		if memory != "" {
			schedulertest.WithCapacity("memory", memory)(r)
		}
		if compute != "" {
			schedulertest.WithCapacity("compute", compute)(r)
		}
	}
}

// A sized seat's container is an MPS client held to the size its claim
// asked, says so in its environment and metadata, and the group's daemon
// holds the largest memory and compute held there: a container can raise
// its own limits to that and no further.
func TestSizedSeatsHoldTheirSizesOverSockets(t *testing.T) {
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	e := newEnv(t, "nvlink-2x4", sizedConfig, withSharing(root, control))
	dir := filepath.Join(root, "g0-1x-sized")
	pipe := filepath.Join(dir, mps.PipeDir)

	small := e.claim(classSized, sized("16Gi", "30"))
	ids := e.prepareOK(small)
	env, _ := e.container(ids...)
	for k, want := range map[string]string{
		"CUDA_MPS_PIPE_DIRECTORY":           "/tmp/nvidia-mps",
		"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
		"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  "0=16384M",
		"KYB_SEAT_MEMORY":                   "17179869184",
		"KYB_SEAT_COMPUTE":                  "30",
		"KYB_GPU_SEAT":                      "0",
		"CUDA_VISIBLE_DEVICES":              e.uuids(0),
	} {
		if env[k] != want {
			t.Errorf("%s=%q, want %q", k, env[k], want)
		}
	}
	if got := joinMPS(t, control, pipe, env); got != "thread=30 mem=0=16384M" {
		t.Errorf("the seat's container got %q from the daemon", got)
	}
	meta := readMetadata(t, e.metadataMounts(ids...)[metadata.ResourceClaimFilePath(driver.Name, small.Name, "gpu")])
	attrs := meta.Requests[0].Devices[0].Attributes
	for name, want := range map[resourceapi.QualifiedName]int64{"seatMemory": 16 << 30, "seatCompute": 30, "mpsActiveThreadPercentage": 30} {
		if v := attrs[name].IntValue; v == nil || *v != want {
			t.Errorf("metadata %s %v, want %d", name, v, want)
		}
	}

	// A larger claim: the daemon now allows its memory and the first
	// one's compute, each the largest held.
	big := e.claim(classSized, sized("40Gi", "10"))
	if dev := big.Status.Allocation.Devices.Results[0].Device; dev != "g0-1x-sized" {
		t.Fatalf("the second claim is on %s, want g0-1x-sized beside the first", dev)
	}
	envBig, _ := e.container(e.prepareOK(big)...)
	if got := joinMPS(t, control, pipe, envBig); got != "thread=10 mem=0=40960M" {
		t.Errorf("the 40Gi seat's container got %q", got)
	}
	raised := map[string]string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=80G"}
	if got := joinMPS(t, control, pipe, raised); got != "thread=30 mem=0=40960M" {
		t.Errorf("a container raising its limits got %q, want the largest size held (40Gi, 30 %%)", got)
	}
	logs := filepath.Join(dir, mps.LogDir)
	if got := mpstest.LastCommand(t, logs, "set_default_device_pinned_mem_limit"); got != "set_default_device_pinned_mem_limit 0 40960M" {
		t.Errorf("the daemon's memory default %q, want the largest held", got)
	}

	// A claim that asks nothing gets the group's equal share.
	plain := e.claim(classSized)
	envPlain, _ := e.container(e.prepareOK(plain)...)
	if envPlain["KYB_SEAT_MEMORY"] != "21474836480" || envPlain["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "25" || envPlain["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=20480M" {
		t.Errorf("a claim that asked nothing: memory %s, %s %% and %s; want a quarter of 80Gi and of the SMs",
			envPlain["KYB_SEAT_MEMORY"], envPlain["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], envPlain["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	}

	// The large claim's release lowers the daemon to the largest left.
	e.unprepare(big)
	if got := mpstest.LastCommand(t, logs, "set_default_device_pinned_mem_limit"); got != "set_default_device_pinned_mem_limit 0 20480M" {
		t.Errorf("after the 40Gi claim went, the daemon's memory default is %q", got)
	}
	e.unprepare(small, plain)
}

// A sized pair's memory is per GPU: its container may pin the claim's
// memory on each GPU, by the container's own device index.
func TestSizedTwoGPUSeatsGetTheirMemoryOnEachGPU(t *testing.T) {
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	e := newEnv(t, "nvlink-2x4", sizedConfig, withSharing(root, control))
	c := e.claim(classSized2x, sized("30Gi", "50"))
	env, _ := e.container(e.prepareOK(c)...)
	if env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=30720M,1=30720M" || env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] != "50" || env["CUDA_VISIBLE_DEVICES"] != e.uuids(4, 5) {
		t.Errorf("the pair's container: %s, %s %%, GPUs %s", env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_VISIBLE_DEVICES"])
	}
	pipe := filepath.Join(root, "g45-2x-sized", mps.PipeDir)
	if got := joinMPS(t, control, pipe, env); got != "thread=50 mem=0=30720M,1=30720M" {
		t.Errorf("the pair's container got %q from the daemon", got)
	}
}

// Two schedulers that do not see each other's claims can each allocate a
// group's memory; the node refuses the claim that would take more than
// the group publishes, in that claim's prepare, and goes on serving.
func TestSizedClaimsBeyondWhatAGroupPublishesFailTheirPrepareOnly(t *testing.T) {
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	e := newEnv(t, "nvlink-2x4", sizedConfig, withSharing(root, control))
	first := e.claim(classSized, sized("60Gi", "50"))
	// The second scheduler sees the node's slices and none of its claims.
	other := schedulertest.New(schedulertest.SchedulerFeatures())
	other.AddNode(nodeName, draresources.Resources(e.plan, e.inv, nodeName, draresources.LayoutShared), driver.Name)
	other.AddClasses(draresources.DeviceClasses(e.plan.Profiles, draresources.DeviceClassOptions{})...)
	second := schedulertest.Claim("second", classSized, 1, sized("60Gi", "50"))
	second.UID = types.UID("99999999-1111-2222-3333-444444444444")
	alloc, err := other.Allocate(e.ctx, second, nodeName)
	if err != nil || alloc == nil || alloc.Devices.Results[0].Device != "g0-1x-sized" {
		t.Fatalf("the second scheduler's allocation: %+v %v", alloc, err)
	}
	second.Status.Allocation = alloc
	second = e.store(second)

	e.prepareOK(first)
	r := e.prepare(second)[string(second.UID)]
	want := fmt.Sprintf("prepare claim default/second (%s): group G0: 60Gi of memory per GPU and 50 %% of compute, beside the 60Gi and 50 %% held there, are more than the group has (80Gi, 100 %%)", second.UID)
	if r == nil || !strings.Contains(r.Error, want) {
		t.Errorf("the second claim's prepare: %+v, want %q", r, want)
	}
	// The node serves on: the first claim again, and a claim that fits.
	e.prepareOK(first)
	e.prepareOK(e.claim(classSized, sized("20Gi", "50")))
}

// Without consumable capacity a sized profile cannot be published: the
// per-seat fallback leaves it out, and the Node's fallback event says so.
func TestSizedProfilesHaveNoSeatsAfterTheFallback(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", `
profiles:
- {resource: kyb.ai/gpu-1x-sized, seatsPerGroup: 4, gpus: [0, 1, 2, 3], sharing: {strategy: mps, sized: true}}
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2, gpus: [4, 5, 6, 7]}
`, withClient(func(c *fake.Clientset) {
		c.PrependReactor("create", "resourceslices", dropAdvancedFields)
		c.PrependReactor("update", "resourceslices", dropAdvancedFields)
	}))
	want := []string{"g4-1x-seat-0", "g4-1x-seat-1", "g5-1x-seat-0", "g5-1x-seat-1", "g6-1x-seat-0", "g6-1x-seat-1", "g7-1x-seat-0", "g7-1x-seat-1"}
	var devices []string
	var event string
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && (!slices.Equal(devices, want) || event == "") {
		time.Sleep(50 * time.Millisecond)
		devices = publishedDevices(t, e)
		events, err := e.client.EventsV1().Events("").List(e.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events.Items {
			if ev.Reason == "SeatLayoutFallback" && ev.Regarding.Kind == "Node" {
				event = ev.Note
			}
		}
	}
	if !slices.Equal(devices, want) {
		t.Errorf("published after the fallback: %v, want the equal seats only: %v", devices, want)
	}
	if !strings.Contains(event, "sized profile(s) 1x-sized get no seats: a seat without consumable capacity cannot carry the size its claim asks") {
		t.Errorf("fallback event on the Node: %q", event)
	}
}
