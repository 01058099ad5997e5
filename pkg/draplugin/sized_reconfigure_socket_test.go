package draplugin_test

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// The 1x profile of sharingConfig as sized seats, under the same name: an
// operator who turns `sized` on (or off) for a profile keeps its groups'
// device names, and the claims that hold them keep them.
const sharingConfigSized1x = `
profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-2x-seat
  seatsPerGroup: 2
  sharing: {timeSlicing: {interval: Long}}
`

// pinnedMiB is the memory a container may pin on its first GPU, as its
// MPS environment says.
func pinnedMiB(t *testing.T, env map[string]string) int64 {
	t.Helper()
	limits, err := mps.ParseMemLimit(env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	if err != nil {
		t.Fatal(err)
	}
	return limits[0]
}

// reconfigure restarts the plugin with config, the scheduler seeing the
// node's new slices beside the allocations it made before.
func (e *env) reconfigure(config string) {
	e.t.Helper()
	e.plan = simnodetest.New(e.t, "nvlink-2x4", config).Plan
	e.cluster.SetNode(nodeName, draresources.Resources(e.plan, e.inv, nodeName, draresources.LayoutShared), driver.Name)
	e.cluster.AddClasses(draresources.DeviceClasses(e.plan.Profiles, draresources.DeviceClassOptions{})...)
	e.restart()
}

// A seat's promise holds across a configuration change: the node never
// hands out more of a GPU's memory than it has. Equal MPS seats held on
// a group that becomes sized each hold their share (their MPS limit); a
// sized seat held on a group that is no longer sized holds its size. The
// claims prepared after the change must fit beside them.
func TestSizedReconfigurationDoesNotHandOutMoreMemoryThanTheGPUHas(t *testing.T) {
	const gpuMiB = 80 << 10 // nvlink-2x4
	for _, tc := range []struct {
		name          string
		before, after string
		held          []func(*resourceapi.DeviceRequest)
		then          []func(*resourceapi.DeviceRequest)
	}{{
		name:   "equal MPS seats, then sized",
		before: sharingConfig, after: sharingConfigSized1x,
		held: []func(*resourceapi.DeviceRequest){nil, nil, nil},
		then: []func(*resourceapi.DeviceRequest){sized("60Gi", "25")},
	}, {
		name:   "sized seats, then equal MPS seats",
		before: sharingConfigSized1x, after: sharingConfig,
		held: []func(*resourceapi.DeviceRequest){sized("70Gi", "70")},
		then: []func(*resourceapi.DeviceRequest){nil, nil, nil},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "nvlink-2x4", tc.before, withSharing(mpstest.Root(t), mpstest.Build(t)))
			var handedOut int64
			var log []string
			prepare := func(mutate func(*resourceapi.DeviceRequest)) bool {
				var ms []func(*resourceapi.DeviceRequest)
				if mutate != nil {
					ms = append(ms, mutate)
				}
				c := e.claim(class1x, ms...)
				if dev := c.Status.Allocation.Devices.Results[0].Device; dev != "g0-1x" {
					t.Fatalf("%s allocated on %s, want g0-1x", c.Name, dev)
				}
				r := e.prepare(c)[string(c.UID)]
				if r == nil || r.Error != "" {
					if r == nil || !strings.Contains(r.Error, "seat of its earlier configuration") {
						t.Errorf("prepare of %s after the change: %+v, want a refusal naming the earlier configuration's seat", c.Name, r)
					}
					log = append(log, c.Name+" refused")
					return false
				}
				var ids []string
				for _, d := range r.Devices {
					ids = append(ids, d.CdiDeviceIds...)
				}
				env, _ := e.container(ids...)
				handedOut += pinnedMiB(t, env)
				log = append(log, c.Name+" "+env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
				return true
			}
			for _, m := range tc.held {
				if !prepare(m) {
					t.Fatalf("before the change: %v", log)
				}
			}
			e.reconfigure(tc.after)
			for _, m := range tc.then {
				prepare(m)
			}
			if handedOut > gpuMiB {
				t.Errorf("the containers on GPU 0 may pin %d MiB, more than its %d MiB: %s", handedOut, gpuMiB, strings.Join(log, "; "))
			}
		})
	}
}
