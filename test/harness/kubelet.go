package harness

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cri"
)

// Container is what a container of a pod would get from the container
// runtime: the CDI devices the kubelet passed, and the environment and
// device nodes that injecting them into an OCI spec gives.
type Container struct {
	Name        string
	CDIDevices  []string
	Env         map[string]string
	DeviceNodes []oci.LinuxDevice
	Mounts      []oci.Mount
}

// DeviceNodePaths lists the container's device nodes.
func (c *Container) DeviceNodePaths() []string {
	var out []string
	for _, d := range c.DeviceNodes {
		out = append(out, d.Path)
	}
	return out
}

func labelsEverything() labels.Selector { return labels.Everything() }

// sync does what the kubelet does for one pod of this node: prepare its
// claims through the DRA manager before its containers start, unprepare
// them when it goes away, and report it running.
func (n *Node) sync(ctx context.Context, key types.NamespacedName) error {
	logger := klog.FromContext(ctx)
	n.mu.Lock()
	lister := n.lister
	n.mu.Unlock()
	if lister == nil {
		return fmt.Errorf("the kubelet is restarting")
	}
	pods, err := lister()
	if err != nil {
		return err
	}
	var pod *v1.Pod
	for _, p := range pods {
		if p.Namespace == key.Namespace && p.Name == key.Name {
			pod = p
		}
	}
	n.mu.Lock()
	var prev *v1.Pod
	for _, p := range n.prepared {
		if p.Namespace == key.Namespace && p.Name == key.Name && (pod == nil || p.UID != pod.UID) {
			prev = p
		}
	}
	n.mu.Unlock()
	if prev != nil {
		// The pod is gone (or replaced by a new one of the same name).
		if err := n.unprepare(ctx, prev); err != nil {
			return err
		}
	}
	if pod == nil {
		return nil
	}
	if pod.DeletionTimestamp != nil || pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed {
		if err := n.unprepare(ctx, pod); err != nil {
			return err
		}
		if pod.DeletionTimestamp != nil {
			// Confirm the deletion, as the kubelet does once containers are gone.
			err := n.c.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0), Preconditions: &metav1.Preconditions{UID: &pod.UID}})
			if err != nil && !isNotFound(err) {
				return err
			}
		}
		return nil
	}
	n.mu.Lock()
	_, done := n.prepared[pod.UID]
	n.mu.Unlock()
	if done {
		return nil
	}
	if err := n.dra.PrepareResources(ctx, pod); err != nil {
		n.mu.Lock()
		n.failures[pod.UID] = err
		n.mu.Unlock()
		logger.Info("Preparing resources failed", "pod", klog.KObj(pod), "err", err)
		return err
	}
	views := map[string]*Container{}
	for i := range pod.Spec.Containers {
		ctr := &pod.Spec.Containers[i]
		info, err := n.dra.GetResources(pod, ctr)
		if err != nil {
			return fmt.Errorf("container %s: %w", ctr.Name, err)
		}
		view := &Container{Name: ctr.Name, Env: map[string]string{}}
		for _, d := range info.CDIDevices {
			view.CDIDevices = append(view.CDIDevices, d.Name)
		}
		if err := n.inject(view); err != nil {
			return fmt.Errorf("container %s: %w", ctr.Name, err)
		}
		views[ctr.Name] = view
	}
	for name := range views {
		n.runtime.Add(cri.Container{ID: containerID(pod.UID, name), PodUID: string(pod.UID), PodNamespace: pod.Namespace, PodName: pod.Name, Name: name})
	}
	n.mu.Lock()
	n.prepared[pod.UID] = pod
	n.containers[pod.UID] = views
	delete(n.failures, pod.UID)
	err = n.procs.write(n.prepared, n.containers)
	n.mu.Unlock()
	if err != nil {
		return err
	}
	return n.markRunning(ctx, pod)
}

// inject resolves a container's CDI devices from the node's CDI directory
// into an OCI spec, as the container runtime does.
func (n *Node) inject(view *Container) error {
	if len(view.CDIDevices) == 0 {
		return nil
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(n.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return err
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, view.CDIDevices...); err != nil {
		return fmt.Errorf("inject CDI devices %v (unresolved %v): %w", view.CDIDevices, unresolved, err)
	}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		view.Env[k] = v
	}
	view.DeviceNodes = spec.Linux.Devices
	sort.Slice(view.DeviceNodes, func(i, j int) bool { return view.DeviceNodes[i].Path < view.DeviceNodes[j].Path })
	view.Mounts = spec.Mounts
	return nil
}

func (n *Node) unprepare(ctx context.Context, pod *v1.Pod) error {
	n.mu.Lock()
	_, known := n.prepared[pod.UID]
	n.mu.Unlock()
	if !known {
		return nil
	}
	// The containers stop, and their processes with them, before the
	// kubelet unprepares the claims.
	n.mu.Lock()
	for name := range n.containers[pod.UID] {
		n.runtime.Remove(containerID(pod.UID, name))
	}
	delete(n.containers, pod.UID)
	err := n.procs.write(n.prepared, n.containers)
	n.mu.Unlock()
	if err != nil {
		return err
	}
	if err := n.dra.UnprepareResources(ctx, pod); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.prepared, pod.UID)
	return nil
}

func (n *Node) markRunning(ctx context.Context, pod *v1.Pod) error {
	p := pod.DeepCopy()
	now := metav1.Now()
	p.Status.Phase = v1.PodRunning
	p.Status.StartTime = &now
	p.Status.Conditions = []v1.PodCondition{
		{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: now},
	}
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, v1.ContainerStatus{
			Name: c.Name, Image: c.Image, Ready: true, Started: ptr.To(true), ContainerID: "containerd://" + containerID(p.UID, c.Name),
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
		})
	}
	n.dra.UpdateAllocatedResourcesStatus(klog.FromContext(ctx), p, &p.Status)
	_, err := n.c.Client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if err != nil && !isNotFound(err) {
		return err
	}
	return nil
}

// Containers returns what the containers of a running pod got.
func (n *Node) Containers(uid types.UID) map[string]*Container {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.containers[uid]
}

// PrepareFailure is the last prepare error of a pod, if any.
func (n *Node) PrepareFailure(uid types.UID) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.failures[uid]
}

// forwardHealth does what the kubelet's sync loop does with the DRA
// manager's health updates (KEP-4680): for every pod whose devices changed
// health, it writes the manager's view into the pod's container statuses
// (allocatedResourcesStatus), through the manager's own
// UpdateAllocatedResourcesStatus.
func (n *Node) forwardHealth(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case u := <-n.dra.Updates():
			for _, uid := range u.PodUIDs {
				if err := n.updateHealthStatus(ctx, types.UID(uid)); err != nil {
					klog.FromContext(ctx).Info("Cannot update the pod's resource health", "podUID", uid, "err", err)
				}
			}
		}
	}
}

func (n *Node) updateHealthStatus(ctx context.Context, uid types.UID) error {
	pods, err := n.lister()
	if err != nil {
		return err
	}
	var key *v1.Pod
	for _, p := range pods {
		if p.UID == uid {
			key = p
		}
	}
	if key == nil {
		return nil
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := n.c.Client.CoreV1().Pods(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
		if isNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if p.UID != uid || len(p.Status.ContainerStatuses) == 0 {
			// Replaced, or not running yet: markRunning reports it.
			return nil
		}
		n.dra.UpdateAllocatedResourcesStatus(klog.FromContext(ctx), p, &p.Status)
		_, err = n.c.Client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
}

// ResourceHealth returns what a pod's status says about the health of its
// containers' devices: "container resource health (message)" per device,
// sorted.
func ResourceHealth(pod *v1.Pod) []string {
	var out []string
	for _, cs := range pod.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			for _, h := range rs.Resources {
				line := fmt.Sprintf("%s %s %s", cs.Name, rs.Name, h.Health)
				if h.Message != nil && *h.Message != "" {
					line += " (" + *h.Message + ")"
				}
				out = append(out, line)
			}
		}
	}
	slices.Sort(out)
	return out
}
