package migseats

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatkind"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

const migConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0]}
`

// Without NVML to make instances, a claim's MIG device fails its prepare
// and its spec, saying why, as a MIG failure; a whole-GPU device is not
// the MIG seats' to prepare or edit.
func TestMIGSeatsWithoutNVMLRefuseMIGDevicesOnly(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	sn := simnodetest.New(t, "dgx-h100", migConfig)
	s, err := Open(ctx, Options{Node: draresources.NewNode("node-1", sn.Plan, sn.Inv), Dir: t.TempDir(), BootID: "boot-1", Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	whole := checkpoint.Device{Device: "g1-1x", GroupDevice: "g1-1x", Requests: []string{"gpu"}}
	if err := s.Prepare(ctx, "uid", &checkpoint.Claim{Devices: []checkpoint.Device{whole}}); err != nil {
		t.Errorf("a whole-GPU claim: %v", err)
	}
	req := seatkind.Request{Devices: []checkpoint.Device{whole}, Seats: make([]containeredits.Seat, 1)}
	if err := s.Edit("uid", req); err != nil || req.Seats[0].MIG != nil {
		t.Errorf("a whole-GPU device's edit: %+v, %v", req.Seats[0].MIG, err)
	}
	mig := checkpoint.Device{Device: "g0-mig-1g-10gb-0", Requests: []string{"gpu"}}
	err = s.Prepare(ctx, "uid", &checkpoint.Claim{Devices: []checkpoint.Device{mig}})
	if err == nil || !errors.Is(err, seatkind.ErrMIG) || !strings.Contains(err.Error(), "started without NVML") {
		t.Errorf("a MIG claim without NVML: %v, want a MIG failure saying so", err)
	}
	if err := s.Edit("uid", seatkind.Request{Devices: []checkpoint.Device{mig}, Seats: make([]containeredits.Seat, 1)}); err == nil {
		t.Error("a MIG device's spec was planned with no instance")
	}
}

// The changes the plugin follows are kept until it takes them, each claim
// once, and signal it without blocking those that note them.
func TestChangesAreTakenOnce(t *testing.T) {
	l := newLostInstances()
	c := l.changed
	c.note("a")
	c.note("b", "a")
	c.note()
	select {
	case <-c.C():
	default:
		t.Fatal("no signal after a change")
	}
	if got := c.Take(); !slices.Equal(got, []types.UID{"a", "b"}) {
		t.Errorf("took %v, want a, b", got)
	}
	if got := c.Take(); got != nil {
		t.Errorf("took %v again", got)
	}
}
