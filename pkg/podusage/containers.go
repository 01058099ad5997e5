package podusage

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cri"
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
//   - A claim of which a container has no such mount (device metadata
//     off, or the claim prepared before it was on) comes from
//     PodResources, whole: a container using one request of a claim with
//     several is counted on the seats of all of them.
//   - A mount counts only from the plugin's data directory's filesystem,
//     for a claim of the pod's namespace that PodResources lists for the
//     container (see mountRefused): a container able to make mounts of its
//     own could otherwise move its use onto any claim's seats.

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

// resolve names a container from its runtime ID and reads what it holds:
// the requests its device metadata mounts name, read from the first of
// its processes (pids) whose mounts can be read, and, whole, the claims
// the kubelet lists for it that no such mount names (a claim prepared
// before device metadata was on has none). It fails, to be tried again at
// the next sample, where no process's mounts can be read: a process that
// exited is not a container without mounts. answers are the kubelet's
// answers of this sample, by pod.
func (u *Usage) resolve(ctx context.Context, c gpuusage.Container, pids []uint32, answers *podAnswers) (*containerInfo, error) {
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
	mounts, err := u.mountedRequests(pids)
	if err != nil {
		return nil, fmt.Errorf("container %s of pod %s/%s: %w", ctr.Name, ctr.PodNamespace, ctr.PodName, err)
	}
	listed, known, err := u.listedClaims(ctx, ctr, answers)
	switch {
	case podresources.RateLimited(err) || errors.Is(err, errNoBudget):
		return nil, err
	case err != nil && len(mounts) == 0:
		return nil, fmt.Errorf("container %s of pod %s/%s has no device metadata mounts, and its claims cannot be listed: %w", ctr.Name, ctr.PodNamespace, ctr.PodName, err)
	}
	info := &containerInfo{namespace: ctr.PodNamespace, pod: ctr.PodName, name: ctr.Name}
	var held map[types.NamespacedName]bool
	for _, r := range mounts {
		claim := types.NamespacedName{Namespace: r.Namespace, Name: r.Claim}
		if why := u.mountRefused(r, ctr, known, listed, &held); why != "" {
			u.noteRefusedMount(ctx, c.ID, ctr, r, why)
			continue
		}
		i := slices.IndexFunc(info.uses, func(x claimUse) bool { return x.claim == claim })
		if i < 0 {
			info.uses = append(info.uses, claimUse{claim: claim, requests: []string{}})
			i = len(info.uses) - 1
		}
		info.uses[i].requests = append(info.uses[i].requests, r.Request)
	}
	for _, claim := range listed {
		if !slices.ContainsFunc(info.uses, func(x claimUse) bool { return x.claim == claim }) {
			info.uses = append(info.uses, claimUse{claim: claim})
		}
	}
	return info, nil
}

// mountRefused says why a metadata mount does not count for the
// container; "" if it does. The file must be on the plugin's data
// directory's filesystem, of a claim of the pod's namespace (a pod
// references no other), that the kubelet lists for the container; where
// the kubelet cannot say (no PodResources API, or a container it does not
// list, such as an init container), one the node holds.
func (u *Usage) mountRefused(r gpuusage.ClaimRequest, ctr cri.Container, known bool, listed []types.NamespacedName, held *map[types.NamespacedName]bool) string {
	claim := types.NamespacedName{Namespace: r.Namespace, Name: r.Claim}
	switch {
	case u.dataDevice == "":
		return "the plugin's data directory could not be read"
	case r.Device != u.dataDevice:
		return fmt.Sprintf("the file is on device %s, not on the plugin's data directory's (%s)", r.Device, u.dataDevice)
	case r.Namespace != ctr.PodNamespace:
		return "the claim is of another namespace than the pod"
	case known && !slices.Contains(listed, claim):
		return "the kubelet does not list the claim for the container"
	case !known:
		if *held == nil {
			*held = map[types.NamespacedName]bool{}
			for _, c := range u.ledger.Prepared() {
				(*held)[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = true
			}
		}
		if !(*held)[claim] {
			return "the node holds no such claim"
		}
	}
	return ""
}

// noteRefusedMount logs a mount that does not count, once per container.
func (u *Usage) noteRefusedMount(ctx context.Context, id string, ctr cri.Container, r gpuusage.ClaimRequest, why string) {
	if u.refused[id] {
		return
	}
	u.refused[id] = true
	klog.FromContext(ctx).Info("Ignoring a device metadata mount of a container for the GPU metrics", "pod", klog.KRef(ctr.PodNamespace, ctr.PodName), "container", ctr.Name,
		"claim", klog.KRef(r.Namespace, r.Claim), "request", r.Request, "warning", why)
}

// errNoBudget defers a container whose pod the kubelet was not asked
// about in this sample.
var errNoBudget = errors.New("the kubelet's PodResources API is asked about a few pods per sample; the container waits for a later one")

// listedClaims are the claims the kubelet lists for the container; known
// is false where it does not list the container (no PodResources API, or
// an init container).
func (u *Usage) listedClaims(ctx context.Context, ctr cri.Container, answers *podAnswers) ([]types.NamespacedName, bool, error) {
	if u.claims == nil {
		return nil, false, errors.New("no PodResources socket is configured")
	}
	pod, err := answers.get(ctx, u.claims, types.NamespacedName{Namespace: ctr.PodNamespace, Name: ctr.PodName})
	if err != nil {
		return nil, false, err
	}
	claims, ok := pod.Container(ctr.Name)
	return claims.Claims, ok, nil
}

// podAnswer is the kubelet's answer for one pod.
type podAnswer struct {
	pod podresources.PodClaims
	err error
}

// podAnswers are the kubelet's answers of one sample, by pod. The
// kubelet's rate limit is the node's, shared with the prepares, which a
// refusal turns into waits: a sample asks about a few pods only
// (podResourcesPerSample), once each.
type podAnswers struct {
	pods map[types.NamespacedName]podAnswer
}

// podResourcesPerSample is how many pods one sample asks the kubelet
// about, out of the kubelet's burst of 10.
const podResourcesPerSample = 3

func (a *podAnswers) get(ctx context.Context, claims podresources.ClaimsReader, key types.NamespacedName) (podresources.PodClaims, error) {
	if got, ok := a.pods[key]; ok {
		return got.pod, got.err
	}
	if len(a.pods) >= podResourcesPerSample {
		return podresources.PodClaims{}, errNoBudget
	}
	if a.pods == nil {
		a.pods = map[types.NamespacedName]podAnswer{}
	}
	pod, err := claims.PodClaims(ctx, key.Namespace, key.Name)
	a.pods[key] = podAnswer{pod: pod, err: err}
	return pod, err
}

// mountedRequests reads the requests a container uses from its device
// metadata mounts, as the first of its processes whose mounts can be read
// shows them: none where there are no mounts to read (no host procfs) or
// a mount of this driver's metadata could not be understood (its claims
// then count whole).
func (u *Usage) mountedRequests(pids []uint32) ([]gpuusage.ClaimRequest, error) {
	if u.opts.Mounts == nil {
		return nil, nil
	}
	var first error
	for _, pid := range pids {
		mountinfo, err := u.opts.Mounts.Mountinfo(pid)
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		reqs, ok := gpuusage.MetadataRequests(mountinfo, driver.Name)
		if !ok {
			return nil, nil
		}
		return reqs, nil
	}
	return nil, fmt.Errorf("none of its processes' mounts can be read: %w", first)
}
