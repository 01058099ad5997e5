package podusage

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
)

// ledger is the one answer the metrics ask of the seat ledger.
type ledger []*checkpoint.Claim

func (l ledger) Prepared() []*checkpoint.Claim { return l }

// Each process's use goes to the seats its container's claims hold on the
// process's GPU, as the ledger records them now; a process outside pods,
// or in a container holding no seat there, goes to the GPU's
// unattributed use with why.
func TestAttributeGivesEachProcessToItsContainersSeats(t *testing.T) {
	held := &checkpoint.Claim{Namespace: "ns", Name: "train", Devices: []checkpoint.Device{{
		Device: "g0-1x", Requests: []string{"gpu"}, SeatStatus: v1alpha1.SeatStatus{Group: "G0", GPUs: []int{0}, Seats: []int{1, 2}},
	}}}
	mine := gpuusage.Container{PodUID: "pod-a", ID: "c1"}
	other := gpuusage.Container{PodUID: "pod-b", ID: "c2"}
	u := &Usage{ledger: ledger{held}, containers: map[gpuusage.Container]*containerInfo{
		mine:  {namespace: "ns", pod: "a", name: "main", uses: []claimUse{{claim: types.NamespacedName{Namespace: "ns", Name: "train"}}}},
		other: {namespace: "ns", pod: "b", name: "main", uses: []claimUse{{claim: types.NamespacedName{Namespace: "ns", Name: "gone"}}}},
	}}
	snap := u.attribute([]gpuusage.Usage{{GPU: gpuusage.GPU{Index: 0}, Processes: []gpuusage.Process{
		{PID: 1, MemoryBytes: 100, SMPercent: 10, Container: mine, InPod: true},
		{PID: 2, MemoryBytes: 50, SMPercent: 5, Container: mine, InPod: true},
		{PID: 3, MemoryBytes: 7, Container: other, InPod: true},
		{PID: 4, MemoryBytes: 3},
	}}})
	key := containerKey{namespace: "ns", pod: "a", container: "main", group: "G0", seat: "1,2", gpu: 0}
	if got := snap.containers[key]; got == nil || got.memory != 150 || got.sm != 15 || got.processes != 2 {
		t.Errorf("the container's use %+v, want 150 bytes, 15%% SM, 2 processes on seats 1,2 of G0", got)
	}
	if len(snap.containers) != 1 {
		t.Errorf("containers %v, want the one holding seats", snap.containers)
	}
	for reason, want := range map[string]uint64{noSeatHere: 7, outsidePods: 3} {
		if got := snap.unattributed[unattributedKey{0, reason}]; got != want {
			t.Errorf("unattributed %s: %d bytes, want %d", reason, got, want)
		}
	}
}
