package podusage

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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

// A container's sized seats on a group give it their size beside its use:
// two seats of one request add up, compute to at most all of the SMs, as
// their MPS limits do. A container of equal seats has no size, and no
// size series.
func TestASizedSeatsContainerIsServedItsSizeBesideItsUse(t *testing.T) {
	const gi = int64(1) << 30
	sized := &checkpoint.Claim{Namespace: "ns", Name: "infer", Devices: []checkpoint.Device{
		{Device: "g0-1x-sized", Requests: []string{"gpu"}, SeatStatus: v1alpha1.SeatStatus{Group: "G0", GPUs: []int{0}, Seats: []int{0}, Size: &v1alpha1.SeatSize{MemoryBytes: 20 * gi, ComputePercent: 60}}},
		{Device: "g0-1x-sized", Requests: []string{"gpu"}, SeatStatus: v1alpha1.SeatStatus{Group: "G0", GPUs: []int{0}, Seats: []int{3}, Size: &v1alpha1.SeatSize{MemoryBytes: 10 * gi, ComputePercent: 50}}},
	}}
	equal := &checkpoint.Claim{Namespace: "ns", Name: "train", Devices: []checkpoint.Device{{
		Device: "g1-1x", Requests: []string{"gpu"}, SeatStatus: v1alpha1.SeatStatus{Group: "G1", GPUs: []int{1}, Seats: []int{1}},
	}}}
	a, b := gpuusage.Container{PodUID: "pod-a", ID: "c1"}, gpuusage.Container{PodUID: "pod-b", ID: "c2"}
	u := &Usage{ledger: ledger{sized, equal}, containers: map[gpuusage.Container]*containerInfo{
		a: {namespace: "ns", pod: "a", name: "main", uses: []claimUse{{claim: types.NamespacedName{Namespace: "ns", Name: "infer"}}}},
		b: {namespace: "ns", pod: "b", name: "main", uses: []claimUse{{claim: types.NamespacedName{Namespace: "ns", Name: "train"}}}},
	}}
	u.last = u.attribute([]gpuusage.Usage{
		{GPU: gpuusage.GPU{Index: 0}, Processes: []gpuusage.Process{{PID: 1, MemoryBytes: 12 * uint64(gi), SMPercent: 40, Container: a, InPod: true}}},
		{GPU: gpuusage.GPU{Index: 1}, Processes: []gpuusage.Process{{PID: 2, MemoryBytes: uint64(gi), SMPercent: 5, Container: b, InPod: true}}},
	})

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(u.Collector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range families {
		for _, m := range f.Metric {
			labels := map[string]string{}
			for _, l := range m.Label {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["pod"] != "" {
				got[f.GetName()+" "+labels["pod"]+" seat "+labels["seat"]] = fmt.Sprint(m.GetGauge().GetValue())
			}
		}
	}
	want := map[string]string{
		"kyb_container_gpu_memory_used_bytes a seat 0,3":    fmt.Sprint(float64(12 * gi)),
		"kyb_container_gpu_memory_size_bytes a seat 0,3":    fmt.Sprint(float64(30 * gi)),
		"kyb_container_gpu_sm_utilization_ratio a seat 0,3": "0.4",
		"kyb_container_gpu_compute_size_ratio a seat 0,3":   "1",
		"kyb_container_gpu_processes a seat 0,3":            "1",
		"kyb_container_gpu_memory_used_bytes b seat 1":      fmt.Sprint(float64(gi)),
		"kyb_container_gpu_sm_utilization_ratio b seat 1":   "0.05",
		"kyb_container_gpu_processes b seat 1":              "1",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %s", k, got[k], v)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected series %s = %s", k, got[k])
		}
	}
}
