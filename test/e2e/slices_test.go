package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kubectlkyb "github.com/kyb-ai/kyb-dra-driver/cmd/kubectl-kyb/app"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatview"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// publishedDevices lists the devices of a node's ResourceSlices, sorted,
// with the slices' pool generation.
func publishedDevices(ctx context.Context, c *harness.Cluster, node string) ([]string, int64, error) {
	list, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, 0, err
	}
	var out []string
	var gen int64
	for _, s := range list.Items {
		gen = max(gen, s.Spec.Pool.Generation)
		for _, d := range s.Spec.Devices {
			out = append(out, d.Name)
		}
	}
	slices.Sort(out)
	return out, gen, nil
}

// TestAFullNodePublishesWhatAnIdleNodeDoes: the slices describe what the
// node has, not what is free (docs/design.md, "What is published"). A
// node filled through the scheduler and the kubelet, and every pod deleted
// again, publishes the same devices throughout, without a single slice
// update; the scheduler's counters and capacities refuse what is taken.
func TestAFullNodePublishesWhatAnIdleNodeDoes(t *testing.T) {
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{{Name: "node-a", Preset: "nvlink-2x4", Config: seedConfig}}})
	installClasses(t, c)
	var idle []string
	var idleGen int64
	waitUntil(t, c, "the node's slices", func(ctx context.Context) bool {
		var err error
		idle, idleGen, err = publishedDevices(ctx, c, "node-a")
		return err == nil && len(idle) == 12
	})

	// 8 one-GPU groups of 4 seats: 32 pods fill every GPU.
	createTemplate(t, c, "any-1x", class1x)
	// One after the other, each bound before the next: stock
	// kube-scheduler counts a share in flight twice while it writes the
	// allocation (docs/kyb-scheduler.md, "In-flight share counted once"),
	// and a pod filtered in that window was now and then reported
	// unschedulable with a seat still free and not retried within a
	// minute, in batches of 8 too. A pod is bound only after that window.
	for i := range 32 {
		createPod(t, c, podSpec{name: fmt.Sprintf("seat-%d", i), claims: fromTemplate("any-1x")})
		waitBound(t, c, fmt.Sprintf("seat-%d", i))
	}
	for i := range 32 {
		c.WaitForPodRunning(t, "default", fmt.Sprintf("seat-%d", i), timeout)
	}
	createTemplate(t, c, "any-2x", class2x)
	createPod(t, c, podSpec{name: "one-seat-more", claims: fromTemplate("any-1x")})
	createPod(t, c, podSpec{name: "a-pair", claims: fromTemplate("any-2x")})
	c.WaitForPodUnschedulable(t, "default", "one-seat-more", timeout)
	c.WaitForPodUnschedulable(t, "default", "a-pair", timeout)
	// A republish, where one happened, would have landed by now.
	time.Sleep(2 * time.Second)
	full, fullGen, err := publishedDevices(c.Ctx, c, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(full, idle) || fullGen != idleGen {
		t.Errorf("full node publishes %v (pool generation %d), idle %v (generation %d)", full, fullGen, idle, idleGen)
	}

	// kubectl kyb seats, against the real API server: every one-GPU group
	// full, each seat named once the plugin has written the statuses.
	var view seatview.View
	waitUntil(t, c, "kubectl kyb seats to name every seat", func(ctx context.Context) bool {
		var out, errOut bytes.Buffer
		env := func(k string) string {
			if k == "KUBECONFIG" {
				return c.Kubeconfig
			}
			return ""
		}
		if code := kubectlkyb.Run(ctx, []string{"seats", "-A", "-o", "json"}, env, &out, &errOut); code != 0 {
			t.Fatalf("kubectl kyb seats: exit %d: %s", code, errOut.String())
		}
		if err := json.Unmarshal(out.Bytes(), &view); err != nil {
			t.Fatal(err)
		}
		named := 0
		for _, g := range view.Nodes[0].Groups {
			for _, h := range g.Held {
				if h.Seat != nil && len(h.Pods) == 1 {
					named++
				}
			}
		}
		return named == 32
	})
	for _, g := range view.Nodes[0].Groups {
		want := seatview.StateFull
		if g.Profile == "2x" {
			want = seatview.StateBlocked
		}
		if g.State != want {
			t.Errorf("kubectl kyb seats: %s is %s, want %s", g.Device, g.State, want)
		}
	}
	if len(view.Free) != 2 || view.Free[0].Free != 0 || view.Free[0].Total != 32 || view.Free[1].Free != 0 {
		t.Errorf("kubectl kyb seats: free %+v", view.Free)
	}

	for i := range 32 {
		c.DeletePod(t, "default", fmt.Sprintf("seat-%d", i))
	}
	c.WaitForPodRunning(t, "default", "one-seat-more", timeout)
	time.Sleep(2 * time.Second)
	after, afterGen, err := publishedDevices(c.Ctx, c, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(after, idle) || afterGen != idleGen {
		t.Errorf("after releasing: %v (generation %d), idle %v (generation %d)", after, afterGen, idle, idleGen)
	}
}

// waitBound waits for a pod to be bound to a node; when it is not, it says
// what the scheduler saw: the seats allocated per device and the pod's
// events.
func waitBound(t *testing.T, c *harness.Cluster, name string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		p, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, name, metav1.GetOptions{})
		if err == nil && p.Spec.NodeName != "" {
			return
		}
		if time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		per := map[string]int{}
		if claims, err := c.Client.ResourceV1().ResourceClaims("default").List(c.Ctx, metav1.ListOptions{}); err == nil {
			for _, cl := range claims.Items {
				if cl.Status.Allocation != nil {
					for _, r := range cl.Status.Allocation.Devices.Results {
						per[r.Device]++
					}
				}
			}
		}
		var events []string
		if evs, err := c.Client.CoreV1().Events("default").List(c.Ctx, metav1.ListOptions{}); err == nil {
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == name {
					events = append(events, fmt.Sprintf("%s x%d %s", e.Reason, e.Count, e.Message))
				}
			}
		}
		t.Fatalf("pod %s not bound after %v; claims allocated per device: %v; its events: %q", name, timeout, per, events)
	}
}
