package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	v1 "k8s.io/api/core/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// On a cluster where consumable capacity and partitionable devices are
// switched off (the 1.34/1.35 defaults), the API server drops the fields
// shared groups need. The plugin notices, falls back to one device per
// seat on the exclusive layout, says so in an event, and pods still get
// seats.
func TestFallbackWhenGatesAreOff(t *testing.T) {
	c := harness.Start(t, harness.Options{
		FeatureGates: map[string]bool{"DRAConsumableCapacity": false, "DRAPartitionableDevices": false, "DRAFractionalCapacityRange": false},
		Nodes:        []harness.NodeOptions{{Name: "node-a", Preset: "dgx-h100", Config: seedConfig}},
	})
	installClasses(t, c)
	var note string
	err := wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		evs, err := c.Client.EventsV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, ev := range evs.Items {
			if ev.Reason == "SeatLayoutFallback" && ev.Regarding.Name == "node-a" {
				note = ev.Note
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no SeatLayoutFallback event on the node; plugin log:\n%s", c.Node("node-a").PluginLog.Tail(30))
	}
	if !strings.Contains(note, "2x gets G01 G23") || !strings.Contains(note, "1x gets G4 G5 G6 G7") {
		t.Errorf("event: %s", note)
	}
	createTemplate(t, c, "one-1x", class1x)
	createPod(t, c, podSpec{name: "one", claims: fromTemplate("one-1x")})
	_, node, ctrs := c.WaitForPodRunning(t, "default", "one", timeout)
	if got := c.Allocation("default", harness.PodClaim(mustPod(t, c, "one"), "gpu")); len(got) != 1 || got[0] != "node-a/g4-1x-seat-0" {
		t.Errorf("allocated %v, want node-a/g4-1x-seat-0", got)
	}
	if env := ctrs["app"].Env; env["KYB_GPU_GROUP"] != "G4" || env["KYB_GPU_SEAT"] != "0" || env["CUDA_VISIBLE_DEVICES"] != node.GPUUUID(4) {
		t.Errorf("env %v", env)
	}
	createTemplate(t, c, "two-2x", class2x)
	createPod(t, c, podSpec{name: "two", claims: fromTemplate("two-2x")})
	_, _, ctrs = c.WaitForPodRunning(t, "default", "two", timeout)
	if g := ctrs["app"].Env["KYB_GPU_GROUP"]; g != "G01" {
		t.Errorf("2x seat on %s, want G01", g)
	}
}

// The plugin is stopped and started again between prepare and unprepare:
// the kubelet re-registers it, nothing prepared is lost, and no seat is
// handed out twice.
func TestPluginRestartBetweenPrepareAndUnprepare(t *testing.T) {
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{{Name: "node-a", Preset: "dgx-h100", Config: seedConfig}}})
	installClasses(t, c)
	node := c.Node("node-a")
	createTemplate(t, c, "gpu0", class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "0"`))
	createPod(t, c, podSpec{name: "a", claims: fromTemplate("gpu0")})
	_, _, a := c.WaitForPodRunning(t, "default", "a", timeout)

	node.StopPlugin()
	node.StartPlugin()
	node.WaitForPlugin()

	createPod(t, c, podSpec{name: "b", claims: fromTemplate("gpu0")})
	_, _, b := c.WaitForPodRunning(t, "default", "b", timeout)
	if a["app"].Env["KYB_GPU_SEAT"] != "0" || b["app"].Env["KYB_GPU_SEAT"] != "1" {
		t.Errorf("seats %s and %s, want 0 and 1", a["app"].Env["KYB_GPU_SEAT"], b["app"].Env["KYB_GPU_SEAT"])
	}
	c.DeletePod(t, "default", "a") // unprepared by the restarted plugin
	createPod(t, c, podSpec{name: "c", claims: fromTemplate("gpu0")})
	_, _, cc := c.WaitForPodRunning(t, "default", "c", timeout)
	if cc["app"].Env["KYB_GPU_SEAT"] != "0" || cc["app"].Env["KYB_SEAT_GEN"] != "2" {
		t.Errorf("seat 0 handed out again: seat %s gen %s, want 0 gen 2", cc["app"].Env["KYB_GPU_SEAT"], cc["app"].Env["KYB_SEAT_GEN"])
	}
	st, _, err := checkpoint.NewStore(node.PluginsDir + "/gpu.kyb.ai").Load()
	if err != nil || len(st.Claims) != 2 {
		t.Errorf("checkpoint holds %d claims (%v), want b and c", len(st.Claims), err)
	}
	for uid, cl := range st.Claims {
		if cl.Phase != checkpoint.PrepareCompleted {
			t.Errorf("claim %s in phase %s", uid, cl.Phase)
		}
	}
}

func mustPod(t *testing.T, c *harness.Cluster, name string) *v1.Pod {
	t.Helper()
	p, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The kubelet restarts while pods hold seats: it re-registers the running
// plugin, its DRA manager keeps the prepared claims, new pods are prepared
// and old ones unprepared through the new connection.
func TestKubeletRestart(t *testing.T) {
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{{Name: "node-a", Preset: "dgx-h100", Config: seedConfig}}})
	installClasses(t, c)
	node := c.Node("node-a")
	createTemplate(t, c, "gpu0", class1x, selector(`device.attributes["gpu.kyb.ai"].gpuIndices == "0"`))
	createPod(t, c, podSpec{name: "a", claims: fromTemplate("gpu0")})
	c.WaitForPodRunning(t, "default", "a", timeout)

	t0 := time.Now()
	node.RestartKubelet()
	node.WaitForPlugin()
	t.Logf("kubelet restarted, plugin registered again in %v", time.Since(t0).Round(time.Millisecond))

	createPod(t, c, podSpec{name: "b", claims: fromTemplate("gpu0")})
	_, _, b := c.WaitForPodRunning(t, "default", "b", timeout)
	if b["app"].Env["KYB_GPU_SEAT"] != "1" {
		t.Errorf("after the kubelet restart a new pod got seat %s; seat 0 is held", b["app"].Env["KYB_GPU_SEAT"])
	}
	t0 = time.Now()
	c.DeletePod(t, "default", "a")
	t.Logf("pod a deleted and unprepared in %v", time.Since(t0).Round(time.Millisecond))
	st, _, err := checkpoint.NewStore(node.PluginsDir + "/gpu.kyb.ai").Load()
	if err != nil || len(st.Claims) != 1 {
		t.Errorf("after deleting a: %d prepared claims (%v), want only b's", len(st.Claims), err)
	}
}

// A starting kubelet deletes every ResourceSlice of its node. The plugin
// sees the deletion and publishes again within seconds, instead of at the
// resourceslice controller's next resync, 30 seconds on, with the node
// offering no seats meanwhile.
func TestSlicesComeBackAfterTheKubeletDeletesThem(t *testing.T) {
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{{Name: "node-a", Preset: "dgx-h100", Config: seedConfig}}})
	slices := c.Client.ResourceV1().ResourceSlices()
	onNode := metav1.ListOptions{FieldSelector: "spec.nodeName=node-a"}
	before, err := slices.List(c.Ctx, onNode)
	if err != nil || len(before.Items) == 0 {
		t.Fatalf("node-a's slices before: %d, %v", len(before.Items), err)
	}

	t0 := time.Now()
	if err := slices.DeleteCollection(c.Ctx, metav1.DeleteOptions{}, onNode); err != nil {
		t.Fatal(err)
	}
	var after int
	err = wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := slices.List(ctx, onNode)
		if err != nil {
			return false, err
		}
		after = len(l.Items)
		return after == len(before.Items), nil
	})
	if err != nil {
		t.Fatalf("10 s after node-a's slices were deleted it has %d of %d: %v\nplugin log:\n%s", after, len(before.Items), err, c.Node("node-a").PluginLog.Tail(20))
	}
	t.Logf("node-a's %d slices published again %v after their deletion", after, time.Since(t0).Round(time.Millisecond))
}
