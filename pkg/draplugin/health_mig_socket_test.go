package draplugin_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// gpu0InstanceID is the GPU instance ID NVML gives GPU 0's instance at a
// memory slice.
func (e *env) gpu0InstanceID(start uint32) uint32 {
	e.t.Helper()
	dev, ret := e.sim.NVML().DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	for index := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(index)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, _ := dev.GetGpuInstances(&info)
		for _, gi := range gis {
			if g, _ := gi.GetInfo(); g.Placement.Start == start {
				return g.Id
			}
		}
	}
	e.t.Fatalf("GPU 0 has no instance at memory slice %d", start)
	return 0
}

// An XID of one MIG instance, as NVML reports it (on the GPU's handle,
// with the GPU instance's ID), taints the devices of that instance only,
// reports them unhealthy on the kubelet's health stream, and recovers; an
// XID of the whole GPU taints all its devices, MIG or not.
func TestMIGInstanceFaultTaintsItsDevicesOnlyOverSockets(t *testing.T) {
	fc := testingclock.NewFakeClock(time.Now())
	var mon *health.Monitor
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}), withMonitor(fc, &mon))
	stream, err := drahealth.NewDRAResourceHealthClient(e.conn).NodeWatchResources(e.ctx, &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	streamUntil(t, stream, nil)
	claim := e.claim(classMIG1g)
	if got := claim.Status.Allocation.Devices.Results[0].Device; got != "g0-mig-1g-10gb-6" {
		t.Fatalf("allocated %s, want g0-mig-1g-10gb-6", got)
	}
	e.prepareOK(claim)
	id := e.gpu0InstanceID(6)

	if err := e.sim.Inject(simnode.Event{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 79, Instance: &simnode.EventInstance{GPUInstance: id, ComputeInstance: 0}}); err != nil {
		t.Fatal(err)
	}
	want := []string{"g0-mig-1g-10gb-6 gpu.kyb.ai/unhealthy=xid-79:NoSchedule"}
	waitFor(t, "the taint of the instance's device", func() bool { return slices.Equal(taints(t, e), want) })
	streamUntil(t, stream, []string{
		fmt.Sprintf("g0-mig-1g-10gb-6 UNHEALTHY: GPU 0 MIG instance at {6}:1: XID 79 (GPU has fallen off the bus) (GPU instance %d)", id),
	})
	waitFor(t, "a GPUUnhealthy event", func() bool { return nodeEvent(t, e, "GPUUnhealthy") != "" })
	if got, want := nodeEvent(t, e, "GPUUnhealthy"), fmt.Sprintf("MIG instance at {6}:1 of GPU 0 (%s) is unhealthy: XID 79 (GPU has fallen off the bus) (GPU instance %d). Its devices g0-mig-1g-10gb-6 are tainted gpu.kyb.ai/unhealthy=xid-79:NoSchedule; the GPU's other instances are not", e.inv.GPUs[0].UUID, id); got != want {
		t.Errorf("event:\n got %q\nwant %q", got, want)
	}
	if n := healthEvents(t, e, "0", "xid"); n != 1 {
		t.Errorf("kyb_gpu_health_events_total{gpu=0,kind=xid} = %v, want 1", n)
	}

	waitFor(t, "the taint to go", func() bool {
		if len(taints(t, e)) == 0 {
			return true
		}
		if fc.HasWaiters() {
			fc.Step(mon.RecoveryPeriod())
		}
		return false
	})
	streamUntil(t, stream, nil)
	waitFor(t, "a GPUHealthy event", func() bool { return nodeEvent(t, e, "GPUHealthy") != "" })
	if got, want := nodeEvent(t, e, "GPUHealthy"), fmt.Sprintf("MIG instance at {6}:1 of GPU 0 (%s) is healthy again after xid-79; the taint is removed from its devices g0-mig-1g-10gb-6", e.inv.GPUs[0].UUID); got != want {
		t.Errorf("event:\n got %q\nwant %q", got, want)
	}

	if err := e.sim.Inject(simnode.Event{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 74}); err != nil {
		t.Fatal(err)
	}
	want = []string{"g0-1x gpu.kyb.ai/unhealthy=xid-74:NoSchedule"}
	for _, d := range []string{"1g-10gb-0", "1g-10gb-1", "1g-10gb-2", "1g-10gb-3", "1g-10gb-4", "1g-10gb-5", "1g-10gb-6", "2g-20gb-0", "2g-20gb-2", "2g-20gb-4"} {
		want = append(want, "g0-mig-"+d+" gpu.kyb.ai/unhealthy=xid-74:NoSchedule")
	}
	slices.Sort(want)
	waitFor(t, "the taints of every device of GPU 0", func() bool { return slices.Equal(taints(t, e), want) })
	var unhealthy []string
	for _, w := range want {
		unhealthy = append(unhealthy, strings.Fields(w)[0]+" UNHEALTHY: GPU 0: XID 74 (NVLink error)")
	}
	streamUntil(t, stream, unhealthy)
}

// published is what the plugin published last, as the scheduler's
// allocator reads it: a cluster of the node's slices and the plan's
// device classes, nothing allocated.
func (e *env) published() *schedulertest.Cluster {
	e.t.Helper()
	list, err := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var pool resourceslice.Pool
	for _, s := range list.Items {
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: s.Spec.Devices, SharedCounters: s.Spec.SharedCounters})
	}
	c := schedulertest.New(schedulertest.SchedulerFeatures())
	c.AddNode(nodeName, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{nodeName: pool}}, driver.Name)
	c.AddClasses(draresources.DeviceClasses(e.plan.Profiles, draresources.DeviceClassOptions{})...)
	return c
}

// An ECC error of the 1g instance at memory slice 4 taints the devices of
// every placement that shares that slice (the 2g at 4-5 too) and the
// group holding GPU 0 whole, keeps them tainted after the instance's claim
// is released, and the scheduler's allocator places the next 2g claim
// elsewhere.
func TestMIGInstanceMemoryFaultTaintsOverlappingPlacementsOverSockets(t *testing.T) {
	fc := testingclock.NewFakeClock(time.Now())
	var mon *health.Monitor
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}), withMonitor(fc, &mon))
	stream, err := drahealth.NewDRAResourceHealthClient(e.conn).NodeWatchResources(e.ctx, &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	streamUntil(t, stream, nil)
	claim := e.migClaimOn(classMIG1g, "g0-mig-1g-10gb-4")
	e.prepareOK(claim)
	id := e.gpu0InstanceID(4)

	if err := e.sim.Inject(simnode.Event{GPU: 0, Type: nvml.EventTypeDoubleBitEccError, Instance: &simnode.EventInstance{GPUInstance: id, ComputeInstance: 0}}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"g0-1x gpu.kyb.ai/unhealthy=double-bit-ecc:NoSchedule",
		"g0-mig-1g-10gb-4 gpu.kyb.ai/unhealthy=double-bit-ecc:NoSchedule",
		"g0-mig-2g-20gb-4 gpu.kyb.ai/unhealthy=double-bit-ecc:NoSchedule",
	}
	waitFor(t, "the taints of the placements that share memory slice 4 and of GPU 0's group", func() bool { return slices.Equal(taints(t, e), want) })
	msg := fmt.Sprintf("GPU 0 MIG instance at {4}:1: double-bit (uncorrectable) ECC error (GPU instance %d)", id)
	streamUntil(t, stream, []string{"g0-1x UNHEALTHY: " + msg, "g0-mig-1g-10gb-4 UNHEALTHY: " + msg, "g0-mig-2g-20gb-4 UNHEALTHY: " + msg})
	waitFor(t, "a GPUUnhealthy event", func() bool { return nodeEvent(t, e, "GPUUnhealthy") != "" })
	if got := nodeEvent(t, e, "GPUUnhealthy"); !strings.Contains(got, "Its devices g0-mig-1g-10gb-4 g0-mig-2g-20gb-4 and the groups G0 holding GPU 0 whole are tainted gpu.kyb.ai/unhealthy=double-bit-ecc:NoSchedule; a memory fault reaches") {
		t.Errorf("event %q, want it to name the devices and the group and say why", got)
	}

	// The claim goes, its instance with it; the memory slice stays bad
	// until the recovery period passes.
	if r := e.unprepare(claim)[string(claim.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	if got := taints(t, e); !slices.Equal(got, want) {
		t.Fatalf("after the unprepare: taints %v, want %v", got, want)
	}
	cluster := e.published()
	next := schedulertest.Claim("next-2g", classMIG2g, 1)
	alloc, err := cluster.Allocate(e.ctx, next, nodeName)
	if err != nil || alloc == nil {
		t.Fatalf("allocate a 2g claim: %v %v", alloc, err)
	}
	if got := alloc.Devices.Results[0].Device; got == "g0-mig-2g-20gb-4" {
		t.Errorf("the allocator gave the next 2g claim %s, whose memory slice 4 had the ECC error", got)
	}
}

// A GPU may serve MIG profiles and whole-GPU groups at once: once its
// instances are released, a group of it is allocated and the GPU is
// handed out whole, every memory slice of it. A memory fault of one of its
// instances is in memory that group holds too, so the group is tainted
// like every placement that shares the faulty slice, and the allocator
// does not give the next one-GPU claim that GPU while the fault stands.
func TestMIGInstanceMemoryFaultTaintsTheGPUsWholeGroupsOverSockets(t *testing.T) {
	fc := testingclock.NewFakeClock(time.Now())
	var mon *health.Monitor
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}), withMonitor(fc, &mon))
	claim := e.migClaimOn(classMIG1g, "g0-mig-1g-10gb-4")
	e.prepareOK(claim)
	id := e.gpu0InstanceID(4)
	if err := e.sim.Inject(simnode.Event{GPU: 0, Type: nvml.EventTypeDoubleBitEccError, Instance: &simnode.EventInstance{GPUInstance: id, ComputeInstance: 0}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the taints of the placements that share memory slice 4", func() bool { return len(taints(t, e)) >= 2 })
	if r := e.unprepare(claim)[string(claim.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	cluster := e.published()
	next := schedulertest.Claim("next-1x", class1x, 1, schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "0"`))
	alloc, err := cluster.Allocate(e.ctx, next, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	if alloc != nil {
		t.Errorf("the allocator gave a one-GPU claim GPU 0 whole (%s) while the ECC error of its memory slice 4 stands; taints %v", alloc.Devices.Results[0].Device, taints(t, e))
	}

	// Once the fault recovers, so does the group.
	waitFor(t, "the taints to go", func() bool {
		if len(taints(t, e)) == 0 {
			return true
		}
		if fc.HasWaiters() {
			fc.Step(mon.RecoveryPeriod())
		}
		return false
	})
	if alloc, err := e.published().Allocate(e.ctx, next, nodeName); err != nil || alloc == nil {
		t.Errorf("after the fault recovered: allocate a one-GPU claim of GPU 0: %v %v", alloc, err)
	}
	waitFor(t, "a GPUHealthy event", func() bool { return nodeEvent(t, e, "GPUHealthy") != "" })
	if got := nodeEvent(t, e, "GPUHealthy"); !strings.HasSuffix(got, "the taint is removed from its devices g0-mig-1g-10gb-4 g0-mig-2g-20gb-4 and the groups G0 holding GPU 0 whole") {
		t.Errorf("event %q, want it to name the group", got)
	}
}
