package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// healthConfig is the seed's configuration with a short recovery period,
// so that a recovery fits in a test.
const healthConfig = seedConfig + `health:
  recoveryPeriod: 2s
`

// taintedDevices lists a node's published devices that carry a taint, as
// "device key=value:effect".
func taintedDevices(ctx context.Context, c *harness.Cluster, node string) ([]string, error) {
	// resourceVersion 0 reads the API server's watch cache, as informers
	// (the scheduler's) see it; a consistent list would add up to 100 ms
	// waiting for the cache to be fresh, which the timeline should not.
	list, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node, ResourceVersion: "0"})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			for _, tn := range d.Taints {
				out = append(out, fmt.Sprintf("%s %s=%s:%s", d.Name, tn.Key, tn.Value, tn.Effect))
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// nodeEventTime is when the latest event with a reason was recorded on a
// node, zero if there is none.
func nodeEventTime(ctx context.Context, c *harness.Cluster, node, reason string) (time.Time, string) {
	evs, err := c.Client.EventsV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return time.Time{}, ""
	}
	var at time.Time
	var note string
	for _, ev := range evs.Items {
		if ev.Reason == reason && ev.Regarding.Kind == "Node" && ev.Regarding.Name == node && ev.EventTime.After(at) {
			at, note = ev.EventTime.Time, ev.Note
		}
	}
	return at, note
}

func podHealth(ctx context.Context, c *harness.Cluster, name string) []string {
	p, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{ResourceVersion: "0"})
	if err != nil {
		return nil
	}
	return harness.ResourceHealth(p)
}

func tolerateUnhealthy(r *resourceapi.ExactDeviceRequest) {
	r.Tolerations = append(r.Tolerations, resourceapi.DeviceToleration{Key: "gpu.kyb.ai/unhealthy", Operator: resourceapi.DeviceTolerationOpExists})
}

// TestGPUHealth injects faults through each node's fault-injection file,
// so the plugin's real NVML event handling, monitor, taints and health
// stream run, and watches what the API server, the scheduler and the
// kubelet's DRA manager make of them.
func TestGPUHealth(t *testing.T) {
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{{Name: "node-a", Preset: "dgx-h100", Config: healthConfig}}})
	installClasses(t, c)
	node := c.Node("node-a")

	t.Run("an XID taints exactly the groups of its GPU until the GPU recovers", func(t *testing.T) {
		createTemplate(t, c, "gpu2", class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "2"`))
		// A pod already on GPU 2 when it fails: it keeps running (the
		// taint is NoSchedule) and its status shows the device's health.
		createPod(t, c, podSpec{name: "victim", claims: fromTemplate("gpu2")})
		c.WaitForPodRunning(t, "default", "victim", timeout)
		healthy := []string{"app claim:gpu Healthy"}
		unhealthy := []string{"app claim:gpu Unhealthy (GPU 2: XID 79 (GPU has fallen off the bus))"}
		waitUntil(t, c, "the victim's device reported healthy", func(ctx context.Context) bool { return slices.Equal(podHealth(ctx, c, "victim"), healthy) })

		written := time.Now()
		node.InjectFault("xid 2 79")
		// Both of GPU 2's groups are tainted, G23 too although the victim's
		// seat of G2 blocks it: every group is published.
		wantTaints := []string{
			"g2-1x gpu.kyb.ai/unhealthy=xid-79:NoSchedule",
			"g23-2x gpu.kyb.ai/unhealthy=xid-79:NoSchedule",
		}
		var tTaint, tPodUnhealthy time.Duration
		waitUntil(t, c, "the taints of GPU 2's groups", func(ctx context.Context) bool {
			got, err := taintedDevices(ctx, c, "node-a")
			if err != nil || len(got) == 0 {
				return false
			}
			if !slices.Equal(got, wantTaints) {
				t.Fatalf("tainted devices %q, want exactly %q", got, wantTaints)
			}
			tTaint = time.Since(written)
			return true
		})
		// The newcomer asks for GPU 2 while it is tainted: it must not be
		// scheduled before the taint is gone, then it gets the group.
		createPod(t, c, podSpec{name: "newcomer", claims: fromTemplate("gpu2")})
		var tGone, tPodHealthy, tBound time.Duration
		sawUnschedulable := false
		err := wait.PollUntilContextTimeout(c.Ctx, 10*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
			// The pod first, then the slices: a pod bound before a taint
			// that is still there was bound while it was there.
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, "newcomer", metav1.GetOptions{ResourceVersion: "0"})
			if err != nil {
				return false, nil
			}
			taints, err := taintedDevices(ctx, c, "node-a")
			if err != nil {
				return false, nil
			}
			for _, cond := range p.Status.Conditions {
				sawUnschedulable = sawUnschedulable || (cond.Type == v1.PodScheduled && cond.Reason == v1.PodReasonUnschedulable)
			}
			if p.Spec.NodeName != "" && len(taints) > 0 {
				return false, fmt.Errorf("newcomer was bound to %s while GPU 2's groups were tainted %q", p.Spec.NodeName, taints)
			}
			h := podHealth(ctx, c, "victim")
			if tPodUnhealthy == 0 && slices.Equal(h, unhealthy) {
				tPodUnhealthy = time.Since(written)
			}
			if tGone == 0 && len(taints) == 0 {
				tGone = time.Since(written)
			}
			if tPodHealthy == 0 && tPodUnhealthy != 0 && slices.Equal(h, healthy) {
				tPodHealthy = time.Since(written)
			}
			if tBound == 0 && p.Spec.NodeName != "" {
				tBound = time.Since(written)
			}
			return tGone != 0 && tPodHealthy != 0 && tBound != 0, nil
		})
		if err != nil {
			t.Fatalf("%v (taint gone after %v, victim unhealthy after %v and healthy after %v, newcomer bound after %v); victim %q; newcomer %s; plugin log:\n%s",
				err, tGone, tPodUnhealthy, tPodHealthy, tBound, podHealth(c.Ctx, c, "victim"), c.DescribePod("default", "newcomer"), node.PluginLog.Tail(30))
		}
		if tPodUnhealthy > tGone {
			t.Errorf("the victim's status showed the fault only after the taint was gone")
		}
		_, _, ctrs := c.WaitForPodRunning(t, "default", "newcomer", timeout)
		if g := ctrs["app"].Env["KYB_GPU_GROUP"]; g != "G2" {
			t.Errorf("newcomer got group %s, want G2", g)
		}
		unhealthyAt, note := nodeEventTime(c.Ctx, c, "node-a", "GPUUnhealthy")
		if !strings.HasPrefix(note, "GPU 2 (") || !strings.Contains(note, "XID 79") || !strings.Contains(note, "groups G2 G23") {
			t.Errorf("GPUUnhealthy event %q", note)
		}
		healthyAt, note := nodeEventTime(c.Ctx, c, "node-a", "GPUHealthy")
		if !strings.HasPrefix(note, "GPU 2 (") {
			t.Errorf("GPUHealthy event %q", note)
		}
		ms := func(at time.Time) int64 { return at.Sub(written).Milliseconds() }
		t.Logf("timeline in ms after the fault was written (recoveryPeriod 2s, probes every 500 ms, faults file read every 100 ms): "+
			"taint visible in the API server %d; victim's pod status Unhealthy (kubelet health stream) %d; GPUUnhealthy event %d; "+
			"GPU healthy again (GPUHealthy event) %d; victim's pod status Healthy %d; taint gone from the API server %d; "+
			"newcomer bound to the recovered group %d (reported unschedulable before: %t)",
			tTaint.Milliseconds(), tPodUnhealthy.Milliseconds(), ms(unhealthyAt), ms(healthyAt), tPodHealthy.Milliseconds(),
			tGone.Milliseconds(), tBound.Milliseconds(), sawUnschedulable)
	})

	t.Run("a lost GPU stays tainted; only a tolerating claim gets it", func(t *testing.T) {
		written := time.Now()
		node.InjectFault("lost 5")
		want := []string{
			"g45-2x gpu.kyb.ai/unhealthy=gpu-lost:NoSchedule",
			"g5-1x gpu.kyb.ai/unhealthy=gpu-lost:NoSchedule",
		}
		waitUntil(t, c, "the taints of GPU 5's groups", func(ctx context.Context) bool {
			got, _ := taintedDevices(ctx, c, "node-a")
			return slices.Equal(got, want)
		})
		t.Logf("lost GPU: fault written -> taint visible %d ms", time.Since(written).Milliseconds())
		createTemplate(t, c, "gpu5", class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "5"`))
		createPod(t, c, podSpec{name: "on-lost", claims: fromTemplate("gpu5")})
		c.WaitForPodUnschedulable(t, "default", "on-lost", timeout)
		createTemplate(t, c, "gpu5-tolerating", class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "5"`), tolerateUnhealthy)
		createPod(t, c, podSpec{name: "tolerating", claims: fromTemplate("gpu5-tolerating")})
		_, _, ctrs := c.WaitForPodRunning(t, "default", "tolerating", timeout)
		if g := ctrs["app"].Env["KYB_GPU_GROUP"]; g != "G5" {
			t.Errorf("tolerating pod got group %s, want G5", g)
		}
		// NVML answers again, but a lost GPU does not come back without a
		// restart: the taint outlives a recovery period.
		node.InjectFault("recover 5")
		time.Sleep(3 * time.Second)
		if got, _ := taintedDevices(c.Ctx, c, "node-a"); !slices.Equal(got, want) {
			t.Errorf("after recover and 3s: tainted %q, want %q", got, want)
		}
	})
}

// waitClaimStatus waits for the driver's entries in a claim's status,
// which the plugin writes behind the prepare.
func waitClaimStatus(t *testing.T, c *harness.Cluster, namespace, name string) *resourceapi.ResourceClaim {
	t.Helper()
	var claim *resourceapi.ResourceClaim
	waitUntil(t, c, "the claim status of "+name, func(ctx context.Context) bool {
		cl, err := c.Client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(cl.Status.Devices) == 0 {
			return false
		}
		claim = cl
		return true
	})
	return claim
}

func waitUntil(t *testing.T, c *harness.Cluster, what string, cond func(context.Context) bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(c.Ctx, 10*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) { return cond(ctx), nil })
	if err != nil {
		t.Fatalf("timed out waiting for %s; plugin log:\n%s", what, c.Nodes[0].PluginLog.Tail(30))
	}
}
