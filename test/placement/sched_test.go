package placement

import (
	"testing"
)

// TestRealSchedulersPlaceConsistently drives a short overloaded stream
// through the real schedulers: a control plane (etcd, kube-apiserver, the
// in-process kube-scheduler) and the kyb-scheduler binary ($KYB_SCHEDULER,
// as make e2e sets it, else built here). Simulate fails if a bound claim's
// group has a GPU the mirror holds busy; every request must end placed or
// rejected, no multi-GPU request split, and no reject made while the
// mirror had a whole free group of the request's size. The -defrag rows
// must evict, and place every moved pod again.
func TestRealSchedulersPlaceConsistently(t *testing.T) {
	mix, err := ParseMix("1x:0.5,2x:0.3,4x:0.2")
	if err != nil {
		t.Fatal(err)
	}
	specs, err := ParseNodes("dgx-h100:1,nvlink-2x4:1,pcie-8gpu:1")
	if err != nil {
		t.Fatal(err)
	}
	const requests = 30
	opts := Options{
		Nodes:    specs,
		Workload: Workload{Seed: 5, Requests: requests, Mix: mix, Arrival: "exp", Duration: "exp", MeanDuration: 1, Load: 1.5},
		Policies: SchedPolicies,
		Sched:    DefaultSchedEnv(t),
	}
	st, err := Run(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	rejected, evictions := 0, 0
	for _, r := range st.Results {
		t.Logf("%s: placed %d, rejected %d (with room %d), stale rejects retried %d, evictions %d", r.Policy, r.Placed, r.Rejected, r.RejectedWithRoom, r.StaleRejects, r.Evictions)
		if r.Lost != 0 {
			t.Errorf("%s: %d moved pods placed nowhere again: defragmentation evicted a pod with nowhere to go", r.Policy, r.Lost)
		}
		if r.Placed+r.Rejected != requests {
			t.Errorf("%s: placed %d + rejected %d, want %d requests", r.Policy, r.Placed, r.Rejected, requests)
		}
		if r.Placed == 0 || r.Misaligned != 0 || r.RejectedWithRoom != 0 {
			t.Errorf("%s: %+v: want placements, none split, no reject while a group of the size was free", r.Policy, r)
		}
		rejected += r.Rejected
		if isDefrag(r.Policy) {
			evictions += r.Evictions
		}
	}
	if evictions == 0 {
		t.Error("no -defrag row evicted a pod: the defragmentation path went untested")
	}
	if rejected == 0 {
		t.Error("no row rejected a request at 150 % offered load: the reject path went untested")
	}
}
