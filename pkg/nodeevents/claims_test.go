package nodeevents

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
)

// Claim events are bounded: the same one on the same claim once per
// claimEventRepeat, and a node's claim events in all at claimEventBurst
// at once.
func TestClaimEventsAreRateLimited(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := fake.NewClientset()
	r := Start(ctx, client, "node-1", "gpu.kyb.ai")
	defer r.Shutdown()
	claim := func(i int) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("c%d", i), UID: types.UID(fmt.Sprintf("uid-%d", i))}}
	}
	for range 10 {
		r.Claim(ctx, claim(0), corev1.EventTypeWarning, ReasonPrepareFailed, "no such device")
	}
	for i := 1; i <= 2*claimEventBurst; i++ {
		r.Claim(ctx, claim(i), corev1.EventTypeWarning, ReasonPrepareFailed, "no such device")
	}
	want := claimEventBurst // 1 for claim 0, then burst-1 of the others, give or take what the limiter refilled
	deadline := time.Now().Add(10 * time.Second)
	var got int
	for time.Now().Before(deadline) {
		evs, err := client.EventsV1().Events("ns").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got = len(evs.Items)
		if got >= want {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	evs, _ := client.EventsV1().Events("ns").List(ctx, metav1.ListOptions{})
	got = len(evs.Items)
	perClaim := map[string]int{}
	for _, ev := range evs.Items {
		perClaim[ev.Regarding.Name]++
	}
	if got < want || got > want+claimEventsPerSecond || perClaim["c0"] != 1 {
		t.Errorf("%d claim events recorded (c0: %d), want about %d and c0 once", got, perClaim["c0"], want)
	}
}
