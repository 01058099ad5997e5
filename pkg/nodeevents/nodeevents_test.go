package nodeevents

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// events waits until the fake API server holds n events and returns them.
func waitForEvents(ctx context.Context, t *testing.T, client *fake.Clientset, n int) []eventsv1.Event {
	t.Helper()
	var got []eventsv1.Event
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := client.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		got = list.Items
		return len(got) >= n, nil
	})
	if err != nil {
		t.Fatalf("%d events, want %d: %v", len(got), n, err)
	}
	return got
}

func TestRecordsOnTheNodeAndWarnsOnce(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "node-uid"}})
	r := Start(ctx, client, "node-1", "gpu.kyb.ai")
	defer r.Shutdown()
	r.WarningOnce(ctx, ReasonInvalidResourceSlice, "the API server refuses the slices")
	r.WarningOnce(ctx, ReasonInvalidResourceSlice, "the API server refuses the slices")
	r.Normal(ctx, ReasonStaleClaimReleased, "released claim default/a")
	waitForEvents(ctx, t, client, 2)
	// Let a wrongly repeated warning arrive, if there is one.
	time.Sleep(100 * time.Millisecond)
	got := waitForEvents(ctx, t, client, 2)
	if len(got) != 2 {
		t.Fatalf("%d events, want 2 (a repeated warning is recorded once): %+v", len(got), got)
	}
	byReason := map[string]eventsv1.Event{}
	for _, e := range got {
		byReason[e.Reason] = e
	}
	for reason, wantType := range map[string]string{ReasonInvalidResourceSlice: corev1.EventTypeWarning, ReasonStaleClaimReleased: corev1.EventTypeNormal} {
		e, ok := byReason[reason]
		if !ok {
			t.Errorf("no %s event: %+v", reason, got)
			continue
		}
		if e.Type != wantType || e.Regarding.Kind != "Node" || e.Regarding.Name != "node-1" || e.Regarding.UID != "node-uid" || e.ReportingController != "gpu.kyb.ai" {
			t.Errorf("%s event: type %s regarding %+v controller %s", reason, e.Type, e.Regarding, e.ReportingController)
		}
	}
}

func TestNilRecorderOnlyLogs(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx := klog.NewContext(context.Background(), logger)
	var r *Recorder
	r.Warning(ctx, ReasonCheckpointLost, "the checkpoint is lost")
	r.Normal(ctx, ReasonGPUHealthy, "GPU 3 is healthy again")
	r.Shutdown()
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	for _, want := range []string{
		`Node event type="Warning" reason="CheckpointLost" warning="the checkpoint is lost"`,
		`Node event type="Normal" reason="GPUHealthy" note="GPU 3 is healthy again"`,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
}
