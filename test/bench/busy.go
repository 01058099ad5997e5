package bench

import (
	"context"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
)

// fillNodes makes nodes full, as a busy cluster's nodes are: on each, the
// scheduler's own allocator places one-device claims of s's class until
// one does not fit; the claims are written to the API server as allocated
// (the scheduler counts every allocated claim, whoever allocated it), and
// a shape that publishes again while seats are held (unavailable groups
// hidden) has its node's slices updated as its plugin would once those
// claims are prepared.
func fillNodes(ctx context.Context, client kubernetes.Interface, s Shape, ns string, nodes []string) error {
	return parallel(ctx, len(nodes), func(i int) error { return fillAPINode(ctx, client, s, ns, nodes[i]) })
}

func fillAPINode(ctx context.Context, client kubernetes.Interface, s Shape, ns, node string) error {
	c := schedulertest.New(schedulertest.SchedulerFeatures())
	c.AddNode(node, s.Resources(node), s.Driver)
	c.AddClasses(s.Classes...)
	held := holdings{}
	for k := 0; ; k++ {
		claim := schedulertest.Claim(fmt.Sprintf("full-%s-%d", node, k), s.Class, 1)
		r, err := c.Allocate(ctx, claim, node)
		if err != nil {
			return fmt.Errorf("fill %s: %w", node, err)
		}
		if r == nil {
			if k != s.PerNode {
				return fmt.Errorf("fill %s: %d claims fit, want %d", node, k, s.PerNode)
			}
			break
		}
		held.note(s, c, node, r)
		obj := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: claim.Name, Namespace: ns}, Spec: claim.Spec}
		obj, err = client.ResourceV1().ResourceClaims(ns).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("fill %s: create claim: %w", node, err)
		}
		obj.Status.Allocation = r
		if _, err := client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("fill %s: allocate claim %s: %w", node, obj.Name, err)
		}
	}
	if s.Republish == nil {
		return nil
	}
	return updateSlices(ctx, client, s, node, held)
}

// updateSlices replaces the devices and counters of node's slices with
// what s publishes while held seats are in use. The slice count stays, as
// the plugin keeps it, so each slice is updated in place.
func updateSlices(ctx context.Context, client kubernetes.Interface, s Shape, node string, held holdings) error {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		resourceapi.ResourceSliceSelectorNodeName: node,
		resourceapi.ResourceSliceSelectorDriver:   s.Driver,
	}.String()})
	if err != nil {
		return fmt.Errorf("publish %s again: %w", node, err)
	}
	want := sliceObjects(s.Driver, s.Republish(node, held[node]), node)
	if len(want) != len(list.Items) {
		return fmt.Errorf("publish %s again: %d slices, the node has %d", node, len(want), len(list.Items))
	}
	for _, w := range want {
		var cur *resourceapi.ResourceSlice
		for i := range list.Items {
			if strings.HasPrefix(list.Items[i].Name, w.GenerateName) {
				cur = &list.Items[i]
			}
		}
		if cur == nil {
			return fmt.Errorf("publish %s again: no slice named %s*", node, w.GenerateName)
		}
		cur.Spec.Devices, cur.Spec.SharedCounters = w.Spec.Devices, w.Spec.SharedCounters
		if _, err := client.ResourceV1().ResourceSlices().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("publish %s again: %w", node, err)
		}
	}
	return nil
}
