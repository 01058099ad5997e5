package harness

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	podresources "k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
)

// The node's kubelet serves its PodResources API with the kubelet's own
// server (pkg/kubelet/apis/podresources), at
// <root>/pod-resources/kubelet.sock as the kubelet does. Its providers are
// the node's: the pods bound to it, and the DRA manager's claim cache for
// each container's claims, read as the kubelet's container manager reads
// it. The node has no device plugins, CPU or memory managers: those
// providers answer nothing.

// servePodResources serves the API for the kubelet parts started with mgr
// until ctx ends; the returned func waits for the server to stop.
func (n *Node) servePodResources(ctx context.Context, mgr *dra.Manager) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(n.PodResourcesSocket), 0o750); err != nil {
		return nil, err
	}
	_ = os.Remove(n.PodResourcesSocket)
	lis, err := net.Listen("unix", n.PodResourcesSocket)
	if err != nil {
		return nil, fmt.Errorf("node %s: serve PodResources: %w", n.Name, err)
	}
	srv := grpc.NewServer()
	podresourcesv1.RegisterPodResourcesListerServer(srv, podresources.NewV1PodResourcesServer(ctx, podresources.PodResourcesProviders{
		Pods: nodePods{n}, Devices: noDevices{}, Cpus: noCPUs{}, Memory: noMemory{}, DynamicResources: claimsOf{mgr},
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	return func() { srv.Stop(); <-done }, nil
}

// nodePods are the pods the kubelet knows: those bound to the node.
type nodePods struct{ n *Node }

func (p nodePods) GetActivePods() []*v1.Pod { return p.n.activePods() }

func (p nodePods) GetPods() []*v1.Pod {
	p.n.mu.Lock()
	lister := p.n.lister
	p.n.mu.Unlock()
	if lister == nil {
		return nil
	}
	pods, _ := lister()
	return pods
}

func (p nodePods) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, pod := range p.GetPods() {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

// claimsOf gives each container's claims from the DRA manager, as the
// kubelet's container manager does (pkg/kubelet/cm,
// containerManagerImpl.GetDynamicResources).
type claimsOf struct{ mgr *dra.Manager }

func (c claimsOf) GetDynamicResources(logger klog.Logger, pod *v1.Pod, container *v1.Container) []*podresourcesv1.DynamicResource {
	infos, err := c.mgr.GetContainerClaimInfos(pod, container)
	if err != nil {
		logger.Error(err, "Unable to get container claim info state")
		return []*podresourcesv1.DynamicResource{}
	}
	var out []*podresourcesv1.DynamicResource
	for _, info := range infos {
		var resources []*podresourcesv1.ClaimResource
		for driverName, driverState := range info.DriverState {
			var cdiDevices []*podresourcesv1.CDIDevice
			for _, device := range driverState.Devices {
				for _, id := range device.CDIDeviceIDs {
					cdiDevices = append(cdiDevices, &podresourcesv1.CDIDevice{Name: id})
				}
				resources = append(resources, &podresourcesv1.ClaimResource{
					CdiDevices: cdiDevices, DriverName: driverName, PoolName: device.PoolName,
					DeviceName: device.DeviceName, ShareId: (*string)(device.ShareID),
				})
			}
		}
		out = append(out, &podresourcesv1.DynamicResource{ClaimName: info.ClaimName, ClaimNamespace: info.Namespace, ClaimResources: resources})
	}
	return out
}

type noDevices struct{}

func (noDevices) UpdateAllocatedDevices(klog.Logger) {}
func (noDevices) GetDevices(string, string) []*podresourcesv1.ContainerDevices {
	return nil
}
func (noDevices) GetAllocatableDevices(klog.Logger) []*podresourcesv1.ContainerDevices {
	return nil
}

type noCPUs struct{}

func (noCPUs) GetCPUs(*v1.Pod, *v1.Container) []int64 { return nil }
func (noCPUs) GetPodCPUs(string) []int64              { return nil }
func (noCPUs) GetAllocatableCPUs() []int64            { return nil }

type noMemory struct{}

func (noMemory) GetMemory(klog.Logger, *v1.Pod, *v1.Container) []*podresourcesv1.ContainerMemory {
	return nil
}
func (noMemory) GetPodMemory(klog.Logger, string) []*podresourcesv1.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory(klog.Logger) []*podresourcesv1.ContainerMemory {
	return nil
}
