package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	for i := range 32 {
		createPod(t, c, podSpec{name: fmt.Sprintf("seat-%d", i), claims: fromTemplate("any-1x")})
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
