package seatledger

import (
	"testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// TestHeldMIGSeatFencesNothing: a MIG seat's group is its GPU as a group
// of one of the MIG profile, which the plan keeps apart from its groups;
// it is today's definition, not an earlier configuration's.
func TestHeldMIGSeatFencesNothing(t *testing.T) {
	plan := simnodetest.New(t, "dgx-h100", `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0]}
`).Plan
	st := checkpoint.New()
	st.Claims["uid-1"] = &checkpoint.Claim{Namespace: "default", Name: "c1", Phase: checkpoint.PrepareCompleted, Devices: []checkpoint.Device{{
		Requests: []string{"gpu"}, Pool: "node-1", Device: "g0-mig-1g-10gb-6", GroupDevice: "g0-mig-1g-10gb", CDIDevice: "g0-mig-1g-10gb-6",
		SeatStatus: v1alpha1.SeatStatus{Profile: "mig-1g-10gb", Group: "G0", GPUs: []int{0}, GPUUUIDs: []string{"GPU-0"}, Seats: []int{6}, Generations: []int64{1}},
	}}}
	u, fences := usageOf(plan, st)
	if len(u.Fenced) != 0 || len(fences) != 0 {
		t.Errorf("a held MIG seat fences GPUs %v (%v), want none", u.Fenced, fences)
	}
	if got := u.Held["g0-mig-1g-10gb"]; got != 1 {
		t.Errorf("held seats of g0-mig-1g-10gb = %d, want 1", got)
	}
}
