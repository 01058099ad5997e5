package draplugin_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	eventsv1 "k8s.io/api/events/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drahealth "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
)

// An instance of a held claim destroyed by someone else, as an
// administrator's nvidia-smi mig -dci -dgi would, over the plugin's
// sockets on a simulated node whose GPUs partition themselves as real
// ones do.

// withMIGCheck checks the held claims' MIG instances every interval.
func withMIGCheck(interval time.Duration) envOption {
	return func(e *env) {
		prev := e.opts
		e.opts = func(o *draplugin.Options) {
			if prev != nil {
				prev(o)
			}
			o.MIG.CheckInterval = interval
		}
	}
}

// destroyGPU0Instance destroys GPU 0's instance at start as an
// administrator would: its compute instances, then, unless ciOnly, the
// GPU instance.
func (e *env) destroyGPU0Instance(start uint32, ciOnly bool) {
	e.t.Helper()
	dev, _ := e.sim.NVML().DeviceGetHandleByIndex(0)
	gi, ret := dev.GetGpuInstanceById(int(e.gpu0InstanceID(start)))
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	for index := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		cis, _ := gi.GetComputeInstances(&info)
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != nvml.SUCCESS {
				e.t.Fatal(ret)
			}
		}
	}
	if ciOnly {
		return
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
}

// makeGPU0Instance makes a 1g.10gb instance with its compute instance at
// start on GPU 0, as an administrator would.
func (e *env) makeGPU0Instance(start uint32) {
	e.t.Helper()
	dev, _ := e.sim.NVML().DeviceGetHandleByIndex(0)
	info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: start, Size: 1})
	if ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
	ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		e.t.Fatal(ret)
	}
}

// migDeviceStatus is what the claim's status says of its one device: the
// MIG device's UUID and the MIGInstanceGone condition, if any.
func (e *env) migDeviceStatus(claim *resourceapi.ResourceClaim) (string, *metav1.Condition) {
	e.t.Helper()
	stored, err := e.client.ResourceV1().ResourceClaims(claim.Namespace).Get(e.ctx, claim.Name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if len(stored.Status.Devices) != 1 {
		return "", nil
	}
	d := stored.Status.Devices[0]
	var data struct {
		MIGDeviceUUID string `json:"migDeviceUUID"`
	}
	if d.Data != nil {
		if err := json.Unmarshal(d.Data.Raw, &data); err != nil {
			e.t.Fatal(err)
		}
	}
	for i := range d.Conditions {
		if d.Conditions[i].Type == "MIGInstanceGone" {
			return data.MIGDeviceUUID, &d.Conditions[i]
		}
	}
	return data.MIGDeviceUUID, nil
}

// unhealthyUntil reads the health stream until a device's report says it
// is unhealthy with a message containing text.
func unhealthyUntil(t *testing.T, stream drahealth.DRAResourceHealth_NodeWatchResourcesClient, device, text string) {
	t.Helper()
	for range 200 {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range resp.Devices {
			if d.Device.DeviceName == device && d.Health == drahealth.HealthStatus_UNHEALTHY && strings.Contains(d.Message, text) {
				return
			}
		}
	}
	t.Fatalf("health stream: %s never reported unhealthy with %q", device, text)
}

func TestMIGInstanceDestroyedOutsideThePluginIsReportedOverSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}), withMIGCheck(50*time.Millisecond))
	claim := e.claim(classMIG1g)
	const device = "g0-mig-1g-10gb-6"
	ids := e.prepareOK(claim)
	env, _ := e.container(ids...)
	old := env["CUDA_VISIBLE_DEVICES"]
	e.waitStatus(claim)
	id := e.gpu0InstanceID(6)

	e.destroyGPU0Instance(6, false)
	tainted := []string{device + " gpu.kyb.ai/unhealthy=mig-instance-gone:NoSchedule"}
	waitFor(t, "the device's taint", func() bool { return slices.Equal(taints(t, e), tainted) })
	waitFor(t, "a MIGInstanceGone event", func() bool { return nodeEvent(t, e, "MIGInstanceGone") != "" })
	note := nodeEvent(t, e, "MIGInstanceGone")
	for _, want := range []string{"MIG 1g.10gb instance " + old, fmt.Sprintf("(GPU instance %d)", id), "at {6}:1 of GPU 0", "of claim default/" + claim.Name, "(device " + device + ") is gone",
		"tainted gpu.kyb.ai/unhealthy=mig-instance-gone:NoSchedule until the claim is released", "next prepare makes the instance again"} {
		if !strings.Contains(note, want) {
			t.Errorf("event %q does not say %q", note, want)
		}
	}
	if evs := claimEvents(t, e, claim, 2); !slices.ContainsFunc(evs, func(ev eventsv1.Event) bool {
		return ev.Reason == "MIGInstanceGone" && ev.Type == "Warning" && ev.Note == note
	}) {
		t.Errorf("events on the claim: %+v, want the MIGInstanceGone warning", evs)
	}
	waitFor(t, "the claim's status condition", func() bool { _, c := e.migDeviceStatus(claim); return c != nil })
	if uuid, c := e.migDeviceStatus(claim); uuid != "" || c.Status != metav1.ConditionTrue || c.Reason != "MIGInstanceGone" || c.Message != note {
		t.Errorf("status: migDeviceUUID %q, condition %+v; want no UUID and the condition True saying %q", uuid, c, note)
	}

	// A restart forgets nothing: the record of the gone instance is
	// forgotten by the start's reconcile, and the claim's spec is there.
	e.restart()
	stream, err := drahealth.NewDRAResourceHealthClient(e.conn).NodeWatchResources(e.ctx, &drahealth.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	unhealthyUntil(t, stream, device, "(device "+device+") is gone")
	waitFor(t, "the device's taint after the restart", func() bool { return slices.Equal(taints(t, e), tainted) })

	// The claim's next prepare makes it again, with a new MIG device that
	// the container gets.
	again := e.prepareOK(claim)
	if !slices.Equal(again, ids) {
		t.Errorf("CDI IDs %v, were %v", again, ids)
	}
	env, _ = e.container(again...)
	remade := env["CUDA_VISIBLE_DEVICES"]
	if _, err := e.sim.MIGDeviceNodes(remade); err != nil || remade == old {
		t.Errorf("the container's MIG device %q (was %q): %v; want the live one made again", remade, old, err)
	}
	if got, want := e.gpu0Instances(), []string{"19@{6}:1"}; !slices.Equal(got, want) {
		t.Errorf("instances %v, want %v", got, want)
	}
	waitFor(t, "the taint to go", func() bool { return len(taints(t, e)) == 0 })
	waitFor(t, "a MIGInstanceMadeAgain event", func() bool { return nodeEvent(t, e, "MIGInstanceMadeAgain") != "" })
	waitFor(t, "the status to name the new MIG device", func() bool { uuid, c := e.migDeviceStatus(claim); return uuid == remade && c == nil })

	if r := e.unprepare(claim)[string(claim.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	if got := e.gpu0Instances(); len(got) != 0 {
		t.Errorf("after the unprepare: instances %v, want none", got)
	}
}

// The taint stays until the claim is released, and goes with it.
func TestMIGInstanceGoneTaintGoesWithTheClaimOverSockets(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ciOnly bool
	}{{"compute and GPU instance destroyed", false}, {"compute instance destroyed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}), withMIGCheck(50*time.Millisecond))
			claim := e.claim(classMIG1g)
			e.prepareOK(claim)
			e.destroyGPU0Instance(6, tc.ciOnly)
			waitFor(t, "the device's taint", func() bool {
				return slices.Equal(taints(t, e), []string{"g0-mig-1g-10gb-6 gpu.kyb.ai/unhealthy=mig-instance-gone:NoSchedule"})
			})
			if r := e.unprepare(claim)[string(claim.UID)]; r == nil || r.Error != "" {
				t.Fatalf("unprepare: %+v", r)
			}
			waitFor(t, "the taint to go", func() bool { return len(taints(t, e)) == 0 })
			if got := e.gpu0Instances(); len(got) != 0 {
				t.Errorf("after the unprepare: instances %v, want none", got)
			}
		})
	}
}

// Where someone made an instance of their own at the placement, the
// claim's next prepare fails naming it and the device stays tainted;
// the release removes the taint and leaves their instance.
func TestMIGInstanceGoneWhosePlacementIsTakenOverSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}), withMIGCheck(50*time.Millisecond))
	claim := e.claim(classMIG1g)
	e.prepareOK(claim)
	e.destroyGPU0Instance(6, false)
	e.makeGPU0Instance(6)
	tainted := []string{"g0-mig-1g-10gb-6 gpu.kyb.ai/unhealthy=mig-instance-gone:NoSchedule"}
	waitFor(t, "the device's taint", func() bool { return slices.Equal(taints(t, e), tainted) })
	r := e.prepare(claim)[string(claim.UID)]
	if r == nil || !strings.Contains(r.Error, "the MIG instance of g0-mig-1g-10gb-6 is gone and cannot be made again") || !strings.Contains(r.Error, "that is not this claim's is at {6}:1 already") {
		t.Fatalf("prepare again: %+v, want a failure saying the instance is gone and its placement taken", r)
	}
	if got := taints(t, e); !slices.Equal(got, tainted) {
		t.Errorf("after the failed prepare: taints %v, want %v", got, tainted)
	}
	if r := e.unprepare(claim)[string(claim.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare: %+v", r)
	}
	waitFor(t, "the taint to go", func() bool { return len(taints(t, e)) == 0 })
	if got, want := e.gpu0Instances(), []string{"19@{6}:1"}; !slices.Equal(got, want) {
		t.Errorf("after the unprepare: instances %v, want the administrator's %v", got, want)
	}
}

// A repeated prepare (the kubelet's after its restart) of a claim whose
// instance went while the plugin was down makes the instance again and
// hands the container the new MIG device, not the one that went.
func TestMIGInstanceGoneIsMadeAgainByTheNextPrepareOverSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}))
	claim := e.claim(classMIG1g)
	ids := e.prepareOK(claim)
	env, _ := e.container(ids...)
	old := env["CUDA_VISIBLE_DEVICES"]
	e.stop()
	e.destroyGPU0Instance(6, false)
	e.start()
	env, _ = e.container(e.prepareOK(claim)...)
	if got := env["CUDA_VISIBLE_DEVICES"]; got == old {
		t.Fatalf("the container is given %s again, the MIG device that went", old)
	} else if _, err := e.sim.MIGDeviceNodes(got); err != nil {
		t.Fatalf("the container's MIG device %q is not live: %v", got, err)
	}
	if got, want := e.gpu0Instances(), []string{"19@{6}:1"}; !slices.Equal(got, want) {
		t.Errorf("instances %v, want %v", got, want)
	}
	waitFor(t, "a MIGInstanceMadeAgain event", func() bool { return nodeEvent(t, e, "MIGInstanceMadeAgain") != "" })
}
