package draplugin_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// waitStatus polls the claim until the driver's status entries are in it.
func (e *env) waitStatus(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		stored, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Get(e.ctx, c.Name, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		if len(stored.Status.Devices) > 0 {
			return stored
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("claim %s: no seat status written", c.Name)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// refuseStatus fails every write of a claim's status while refuse is set.
func refuseStatus(refuse *atomic.Bool, tries *atomic.Int64) envOption {
	return withClient(func(c *fake.Clientset) {
		c.PrependReactor("patch", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetSubresource() != "status" || !refuse.Load() {
				return false, nil, nil
			}
			tries.Add(1)
			return true, nil, errors.New("etcdserver: request timed out")
		})
	})
}

// A status write that fails does not fail the pod's prepare; it is retried
// until it lands.
func TestStatusWriteFailureDoesNotFailPrepare(t *testing.T) {
	var refuse atomic.Bool
	var tries atomic.Int64
	refuse.Store(true)
	e := newEnv(t, "nvlink-2x4", seed, refuseStatus(&refuse, &tries))
	c := e.claim(class1x)
	e.prepareOK(c)
	deadline := time.Now().Add(10 * time.Second)
	for tries.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("status write tried %d times, want retries", tries.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v := e.metric("kyb_dra_claim_statuses_written_total", nil); v != 0 {
		t.Errorf("statuses written %v while every write is refused", v)
	}
	refuse.Store(false)
	e.waitStatus(c)
	// The counter follows the write that waitStatus saw.
	deadline = time.Now().Add(10 * time.Second)
	for e.metric("kyb_dra_claim_statuses_written_total", nil) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("statuses written %v, want 1", e.metric("kyb_dra_claim_statuses_written_total", nil))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v := e.metric("kyb_dra_errors_total", map[string]string{"operation": "prepare", "kind": "status"}); v < 2 {
		t.Errorf("status errors %v, want the refused tries counted", v)
	}
}

// A status the plugin could not write before it stopped (or crashed: the
// checkpoint says the same) is written by the next start.
func TestStatusWrittenAfterARestart(t *testing.T) {
	var refuse atomic.Bool
	var tries atomic.Int64
	refuse.Store(true)
	e := newEnv(t, "nvlink-2x4", seed, refuseStatus(&refuse, &tries))
	c := e.claim(class2x)
	e.prepareOK(c)
	e.stop()
	if tries.Load() == 0 {
		t.Fatal("no status write was tried before the stop")
	}
	stored, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Get(e.ctx, c.Name, metav1.GetOptions{})
	if err != nil || len(stored.Status.Devices) != 0 {
		t.Fatalf("status written while refused: %v %+v", err, stored.Status.Devices)
	}
	refuse.Store(false)
	e.start()
	e.waitStatus(c)
}
