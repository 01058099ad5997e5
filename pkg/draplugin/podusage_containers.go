package draplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
)

// Which container a GPU process runs in, and what that container holds,
// is read from the node alone; the plugin needs no read of any pod from
// the API server, whose pod specs (with every pod's literal environment)
// RBAC could not confine to the node.
//
//   - The cgroup names the pod's UID and the container's runtime ID.
//   - The container runtime's CRI API (ListContainers by that ID) names the
//     pod and the container, from the labels the kubelet gives every
//     container. The kubelet's PodResources API cannot: it names neither
//     UIDs nor container IDs.
//   - The container's mounts name the requests it uses: with device
//     metadata on, the kubelet mounts one file per request the container
//     references, and only those (gpuusage.MetadataRequests). PodResources
//     names claims only, whole: it lists every device of a claim for every
//     container that references it, whatever request the container named.
//   - Where a container has no such mount (device metadata off), its
//     claims come from PodResources, whole: a container using one request
//     of a claim with several is counted on the seats of all of them.

// containerInfo is what the attribution needs of a container.
type containerInfo struct {
	namespace, pod, name string
	uses                 []claimUse
}

// claimUse is a claim a container holds, and the requests of it that the
// container uses; nil requests: all of them (not known more exactly).
type claimUse struct {
	claim    types.NamespacedName
	requests []string
}

// uses reports whether the container uses a device of the claim.
func (c claimUse) uses(dev checkpoint.Device) bool {
	if c.requests == nil {
		return true
	}
	for _, r := range dev.Requests {
		if slices.Contains(c.requests, r) {
			return true
		}
	}
	return false
}

var errNoRuntime = errors.New("no container runtime socket is configured: processes cannot be matched to their pods")

// resolve names a container from its runtime ID and reads what it holds,
// from one of its processes.
func (u *podUsage) resolve(ctx context.Context, c gpuusage.Container, pid uint32) (*containerInfo, error) {
	if u.opts.Containers == nil {
		return nil, errNoRuntime
	}
	ctr, err := u.opts.Containers.Container(ctx, c.ID)
	if err != nil {
		return nil, err
	}
	if ctr.PodUID != c.PodUID {
		return nil, fmt.Errorf("container %s: the runtime names pod %s, its cgroup pod %s", c.ID, ctr.PodUID, c.PodUID)
	}
	info := &containerInfo{namespace: ctr.PodNamespace, pod: ctr.PodName, name: ctr.Name}
	if uses, ok := u.mountedRequests(pid); ok {
		info.uses = uses
		return info, nil
	}
	if u.claims == nil {
		return nil, fmt.Errorf("container %s of pod %s/%s has no device metadata mounts, and no PodResources socket is configured", ctr.Name, ctr.PodNamespace, ctr.PodName)
	}
	pod, err := u.claims.PodClaims(ctx, ctr.PodNamespace, ctr.PodName)
	if err != nil {
		return nil, err
	}
	claims, _ := pod.Container(ctr.Name)
	for _, claim := range claims.Claims {
		info.uses = append(info.uses, claimUse{claim: claim})
	}
	return info, nil
}

// mountedRequests reads the requests a process's container uses from its
// device metadata mounts; ok is false when it has none of this driver's,
// or they cannot all be read.
func (u *podUsage) mountedRequests(pid uint32) ([]claimUse, bool) {
	if u.opts.Mounts == nil {
		return nil, false
	}
	mountinfo, err := u.opts.Mounts.Mountinfo(pid)
	if err != nil {
		return nil, false
	}
	reqs, ok := gpuusage.MetadataRequests(mountinfo, driver.Name)
	if !ok || len(reqs) == 0 {
		return nil, false
	}
	var uses []claimUse
	for _, r := range reqs {
		claim := types.NamespacedName{Namespace: r.Namespace, Name: r.Claim}
		i := slices.IndexFunc(uses, func(x claimUse) bool { return x.claim == claim })
		if i < 0 {
			uses = append(uses, claimUse{claim: claim, requests: []string{}})
			i = len(uses) - 1
		}
		uses[i].requests = append(uses[i].requests, r.Request)
	}
	return uses, true
}

// PodClaimsReader tells which claims each container of a pod references
// (the kubelet's PodResources API, podresources.Client).
type PodClaimsReader interface {
	PodClaims(ctx context.Context, namespace, name string) (podresources.PodClaims, error)
}
