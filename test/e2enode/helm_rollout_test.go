package e2enode

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// overlap is what roll saw of the two plugin pods a seamless rollout runs
// side by side.
type overlap struct {
	old, new v1.Pod
	// sockets are the registration sockets in the kubelet's
	// plugins_registry while both ran.
	sockets []string
	// served says which pod's metrics counted the prepare and the
	// unprepare done meanwhile.
	served string
}

// roll runs helm upgrade and follows the rollout it starts, as the chart
// promises it (kubeletPlugin.seamlessUpgrade): the new plugin pod starts
// beside the old one and gets Ready while the old one still runs, both
// registered with the kubelet; meanwhile runs during, which prepares and
// unprepares claims; then the old pod goes and the new one is the node's
// only plugin.
func (h *helmNode) roll(t *testing.T, tl *timeline, files []string, set []string, during func()) overlap {
	t.Helper()
	old := h.waitForAgent(t, time.Minute)
	tl.note("helm upgrade --set %s", strings.Join(set, " --set "))
	h.install(t, "upgrade", files, set...)
	var ov overlap
	ov.old = old
	err := wait.PollUntilContextTimeout(h.c.Ctx, 100*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods := h.pods(t)
		var oldRuns bool
		for _, p := range pods {
			if p.Name == old.Name {
				oldRuns = p.DeletionTimestamp == nil && podReady(&p)
			}
		}
		if !oldRuns {
			return false, fmt.Errorf("the old plugin pod %s stopped before a new one was Ready beside it:\n%s", old.Name, podTable(pods))
		}
		for _, p := range pods {
			if p.Name != old.Name && podReady(&p) {
				ov.new = p
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no new plugin pod Ready beside %s: %v", old.Name, err)
	}
	tl.note("both plugin pods Ready: %s (old) and %s (new)", old.Name, ov.new.Name)
	t.Logf("during the rollout:\n%s", podTable(h.pods(t)))
	// Each pod registers sockets of its own (POD_UID); the kubelet may
	// call either.
	ov.sockets, _ = filepath.Glob(filepath.Join(h.n.RootDir, "plugins_registry", "gpu.kyb.ai*"))
	if len(ov.sockets) != 2 {
		t.Errorf("registration sockets while both pods run: %v, want one per pod", ov.sockets)
	}
	before := map[string]string{old.Name: scrapeMetrics(t, old), ov.new.Name: scrapeMetrics(t, ov.new)}
	during()
	var served []string
	for _, p := range []v1.Pod{old, ov.new} {
		after := scrapeMetrics(t, p)
		for _, m := range []string{"kyb_dra_prepared_claims_total", "kyb_dra_unprepared_claims_total"} {
			if d := metricSum(after, m) - metricSum(before[p.Name], m); d > 0 {
				served = append(served, fmt.Sprintf("%s +%v %s", p.Name, d, strings.TrimPrefix(m, "kyb_dra_")))
			}
		}
	}
	ov.served = strings.Join(served, "; ")
	tl.note("served meanwhile: %s", ov.served)
	// Both still ran when it was done: what during did happened with
	// two plugin pods on the node.
	if p, err := h.c.Client.CoreV1().Pods(helmNamespace).Get(h.c.Ctx, old.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the old plugin pod %s stopped while the claims were prepared and unprepared (raise kubeletPlugin.minReadySeconds): %v", old.Name, err)
	}
	h.waitForAgent(t, 2*time.Minute, old.Name)
	tl.note("%s alone", ov.new.Name)
	h.waitRolledOut(t, time.Minute)
	tl.note("rolled out (kubectl rollout status)")
	return ov
}
