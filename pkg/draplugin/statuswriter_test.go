package draplugin

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// The status writer on its own, over a ledger kept in a map.

type mapLedger struct {
	mu      sync.Mutex
	claims  map[types.UID]*checkpoint.Claim
	written map[types.UID]bool
}

func (m *mapLedger) StatusOwed(uid types.UID) *checkpoint.Claim {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.written[uid] {
		return nil
	}
	return m.claims[uid]
}

func (m *mapLedger) PreparedClaims() map[types.UID]*checkpoint.Claim {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.claims)
}

func (m *mapLedger) MarkStatusWritten(uid types.UID, _ *checkpoint.Claim) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.written[uid] = true
}

func (m *mapLedger) StatusesOwed() []types.UID {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []types.UID
	for uid := range m.claims {
		if !m.written[uid] {
			out = append(out, uid)
		}
	}
	return out
}

func (m *mapLedger) isWritten(uid types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.written[uid]
}

func TestStatusWriterWritesTheSeatsAndRetries(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := fake.NewClientset(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", UID: "uid-c"}})
	// Server-side apply is answered by a reactor: the fake tracker has
	// none. The first apply fails, as an API server that is away does.
	var mu sync.Mutex
	var applied []byte
	failures := 1
	client.PrependReactor("patch", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if failures > 0 {
			failures--
			return true, nil, errors.New("the server is currently unable to handle the request")
		}
		applied = a.(k8stesting.PatchAction).GetPatch()
		return true, &resourceapi.ResourceClaim{}, nil
	})
	seat := v1alpha1.SeatStatus{Profile: "1x", Group: "G3", GPUs: []int{3}, GPUUUIDs: []string{"GPU-3"}, Seats: []int{2}, Generations: []int64{5}}
	ledger := &mapLedger{written: map[types.UID]bool{}, claims: map[types.UID]*checkpoint.Claim{
		"uid-c": {Namespace: "ns", Name: "c", Phase: checkpoint.PrepareCompleted, Devices: []checkpoint.Device{{
			Pool: "node-1", Device: "g3-1x", ShareID: "s-1", GroupDevice: "g3-1x", SeatStatus: seat,
		}}},
	}}
	w := newStatusWriter(client.ResourceV1(), ledger, noMIG{}, newMetrics(), nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx)
	}()
	w.queueOwed()
	deadline := time.Now().Add(10 * time.Second)
	for !ledger.isWritten("uid-c") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	w.drain()
	<-done
	if !ledger.isWritten("uid-c") {
		t.Fatal("the status was never written")
	}
	var patch struct {
		Status struct {
			Devices []struct {
				Driver, Pool, Device, ShareID string
				Data                          v1alpha1.SeatStatus
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if err := json.Unmarshal(applied, &patch); err != nil {
		t.Fatalf("apply patch %s: %v", applied, err)
	}
	if len(patch.Status.Devices) != 1 {
		t.Fatalf("applied %s", applied)
	}
	got := patch.Status.Devices[0]
	if got.Driver != "gpu.kyb.ai" || got.Pool != "node-1" || got.Device != "g3-1x" || got.ShareID != "s-1" || got.Data.Seats[0] != 2 || got.Data.Generations[0] != 5 || got.Data.Group != "G3" {
		t.Errorf("applied %s", applied)
	}
	if failures != 0 {
		t.Error("the failing apply was not tried")
	}
}
