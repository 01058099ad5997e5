package app

import (
	"context"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/util/assumecache"
	"k8s.io/utils/ptr"
)

// TestInFlightShareCountedOnce drives kyb-scheduler's claim tracker (the
// DRA plugin's, with patches/kubernetes applied) through the steps of
// PreBind that stock kube-scheduler 1.37 counts a share twice in
// (test/upstream TestInFlightShareCountedTwice pins that): the claim in
// flight, then written and stored in the assume cache while still in
// flight, then no longer in flight. Each step must count the share's seat
// once; the log says what each step counted, for the pin to show.
func TestInFlightShareCountedOnce(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "seat", UID: "claim-uid", ResourceVersion: "1"}}
	client := fake.NewClientset(claim)
	factory := informers.NewSharedInformerFactory(client, 0)
	claimsCache := assumecache.NewAssumeCache(klog.FromContext(ctx), factory.Resource().V1().ResourceClaims().Informer(), "ResourceClaim", "", nil)
	manager := dynamicresources.NewDRAManager(ctx, claimsCache, nil, factory)
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	claims := manager.ResourceClaims()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := claims.Get("default", "seat"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the claim never reached the assume cache: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	device := structured.MakeDeviceID("gpu.kyb.ai", "node-a", "g1x-0")
	allocated := claim.DeepCopy()
	allocated.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: "gpu.kyb.ai", Pool: "node-a", Device: "g1x-0",
		ShareID:          ptr.To(types.UID("share-1")),
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"seats": resource.MustParse("1")},
	}}}}
	seats := func(step string) {
		t.Helper()
		state, err := claims.GatherAllocatedState()
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		var got int64
		if consumed := state.AggregatedCapacity[device]["seats"]; consumed != nil {
			got = consumed.Value()
		}
		t.Logf("%s: the share consumes %d seat(s)", step, got)
		if got != 1 {
			t.Errorf("%s: the share consumes %d seats, want 1", step, got)
		}
	}

	// Reserve: the allocation is in flight.
	if err := claims.SignalClaimPendingAllocation(claim.UID, allocated); err != nil {
		t.Fatal(err)
	}
	seats("in flight")
	// PreBind: the API server took the allocation; the written claim goes
	// into the assume cache before the in-flight entry goes.
	written := allocated.DeepCopy()
	written.ResourceVersion = "2"
	if err := claims.AssumeClaimAfterAPICall(written); err != nil {
		t.Fatal(err)
	}
	seats("written, still in flight")
	claims.MaybeRemoveClaimPendingAllocation(claim.UID, true)
	seats("written")
}
