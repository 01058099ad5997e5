package harness

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/kubernetes/test/utils/ktesting"
)

// Methods that can fail take the caller's test: a failure must end the
// (sub)test that waits, not the one that started the cluster.

// WaitForPodRunning waits until a pod is running on some node with its
// claims prepared, and returns the pod, its node and its containers.
func (c *Cluster) WaitForPodRunning(t ktesting.TB, ns, name string, timeout time.Duration) (*v1.Pod, *Node, map[string]*Container) {
	t.Helper()
	var pod *v1.Pod
	var node *Node
	var ctrs map[string]*Container
	err := wait.PollUntilContextTimeout(c.Ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.Spec.NodeName == "" || p.Status.Phase != v1.PodRunning {
			return false, nil
		}
		for _, n := range c.Nodes {
			if n.Name == p.Spec.NodeName {
				if cs := n.Containers(p.UID); cs != nil {
					pod, node, ctrs = p, n, cs
					return true, nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s not running after %v: %s", ns, name, timeout, c.DescribePod(ns, name))
	}
	return pod, node, ctrs
}

// WaitForPodUnschedulable waits until the scheduler reports a pod
// unschedulable and returns its message.
func (c *Cluster) WaitForPodUnschedulable(t ktesting.TB, ns, name string, timeout time.Duration) string {
	t.Helper()
	var msg string
	err := wait.PollUntilContextTimeout(c.Ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && cond.Reason == v1.PodReasonUnschedulable {
				msg = cond.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s was not reported unschedulable: %s", ns, name, c.DescribePod(ns, name))
	}
	return msg
}

// DeletePod deletes a pod the way a user does; the node's kubelet loop
// unprepares its claims and confirms the deletion. It waits until the pod
// is gone.
func (c *Cluster) DeletePod(t ktesting.TB, ns, name string) {
	t.Helper()
	if err := c.Client.CoreV1().Pods(ns).Delete(c.Ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod %s/%s: %v", ns, name, err)
	}
	err := wait.PollUntilContextTimeout(c.Ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return isNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s not gone: %s", ns, name, c.DescribePod(ns, name))
	}
}

// DescribePod summarises a pod and its claims for failure messages.
func (c *Cluster) DescribePod(ns, name string) string {
	p, err := c.Client.CoreV1().Pods(ns).Get(c.Ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "node=%q phase=%s", p.Spec.NodeName, p.Status.Phase)
	for _, cond := range p.Status.Conditions {
		fmt.Fprintf(&b, " %s=%s(%s: %s)", cond.Type, cond.Status, cond.Reason, cond.Message)
	}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName == nil {
			continue
		}
		claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(c.Ctx, *s.ResourceClaimName, metav1.GetOptions{})
		if err == nil {
			fmt.Fprintf(&b, " claim %s allocated=%t", claim.Name, claim.Status.Allocation != nil)
		}
	}
	for _, n := range c.Nodes {
		if err := n.PrepareFailure(p.UID); err != nil {
			fmt.Fprintf(&b, " prepare on %s failed: %v", n.Name, err)
		}
	}
	return b.String()
}

// Allocation returns a claim's allocated devices as "pool/device".
func (c *Cluster) Allocation(ns, claim string) []string {
	cl, err := c.Client.ResourceV1().ResourceClaims(ns).Get(c.Ctx, claim, metav1.GetOptions{})
	if err != nil || cl.Status.Allocation == nil {
		return nil
	}
	var out []string
	for _, r := range cl.Status.Allocation.Devices.Results {
		out = append(out, r.Pool+"/"+r.Device)
	}
	return out
}

// PodClaim returns the name of the claim a pod got for one of its
// resourceClaims entries (from a template or by name).
func PodClaim(pod *v1.Pod, entry string) string {
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.Name == entry && s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.Name == entry && rc.ResourceClaimName != nil {
			return *rc.ResourceClaimName
		}
	}
	return ""
}

var _ = resourceapi.SchemeGroupVersion
