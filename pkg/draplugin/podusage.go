package draplugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
)

// PodUsage configures the per-pod GPU metrics: what each container
// holding a seat uses of its GPUs, which dcgm-exporter cannot attribute
// for a driver other than NVIDIA's.
type PodUsage struct {
	// Sampler reads the GPUs' processes and their containers; nil: no
	// per-pod metrics.
	Sampler *gpuusage.Sampler
	// Interval is the time between samples (default 10s).
	Interval time.Duration
}

// seatAdmin is the seat label of a container whose claim has admin
// access: it sees the group's GPUs and holds no seat.
const seatAdmin = "admin"

// seatFenced is the seat label of a claim whose seats are not known.
const seatFenced = "fenced"

// Why a process's use is not a seat's (the reason label of
// kyb_gpu_unattributed_memory_used_bytes).
const (
	// outsidePods: the process is in no pod's container (the MPS daemon,
	// a host process), or its cgroup could not be read.
	outsidePods = "outside-pods"
	// noSeatHere: the process is a pod's, and the pod holds no seat of
	// this node's driver on that GPU (another driver's device, a GPU it
	// reached around its seat, or a pod the API does not know).
	noSeatHere = "no-seat-here"
)

// podsRetryAfter is the longest a container the pod list did not name
// waits before it is looked for again. A container starts before the
// kubelet reports its ID, so a new one is looked for again at the next
// samples; the wait then grows with the time it has been missing, so that
// a process in a pod that never shows (a static pod: its cgroup has the
// config's UID, not its mirror pod's) costs one list a minute, not one per
// sample.
const podsRetryAfter = time.Minute

// missing is a container the pod list did not name: since when, and when
// it was last looked for.
type missing struct{ since, tried time.Time }

func (m missing) due(now time.Time, interval time.Duration) bool {
	wait := min(max(m.tried.Sub(m.since), interval), podsRetryAfter)
	return now.Sub(m.tried) >= wait
}

// containerKey is one container's use of one GPU through one group.
type containerKey struct {
	namespace, pod, container, group, seat string
	gpu                                    int
}

type containerUse struct {
	memory    uint64
	sm        float64
	processes int
}

type unattributedKey struct {
	gpu    int
	reason string
}

// usageSnapshot is one sample, attributed.
type usageSnapshot struct {
	gpus         []gpuusage.Usage
	containers   map[containerKey]*containerUse
	unattributed map[unattributedKey]uint64
}

// podInfo is what the attribution needs of a pod.
type podInfo struct {
	namespace, name string
	// containers maps the runtime's container IDs to container names.
	containers map[string]string
	// claims are the ResourceClaims each container references.
	claims map[string][]string
}

// podUsage samples the GPUs and attributes each process to the seat its
// container holds: process → cgroup → pod UID and container ID → the
// node's pods (listed from the API, only when a container is new) →
// container name → its ResourceClaims → the seats the ledger records for
// them on the process's GPU.
type podUsage struct {
	opts     PodUsage
	ledger   *seatledger.Ledger
	client   kubernetes.Interface
	nodeName string

	// pods and missed belong to the sampling goroutine.
	pods   map[string]podInfo
	missed map[gpuusage.Container]missing

	mu   sync.Mutex
	last usageSnapshot
	errs map[string]string
}

func newPodUsage(opts PodUsage, ledger *seatledger.Ledger, client kubernetes.Interface, nodeName string) *podUsage {
	if opts.Interval <= 0 {
		opts.Interval = 10 * time.Second
	}
	return &podUsage{opts: opts, ledger: ledger, client: client, nodeName: nodeName,
		pods: map[string]podInfo{}, missed: map[gpuusage.Container]missing{}, errs: map[string]string{}}
}

// run samples until ctx ends.
func (u *podUsage) run(ctx context.Context) {
	ticker := time.NewTicker(u.opts.Interval)
	defer ticker.Stop()
	for {
		u.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func (u *podUsage) sample(ctx context.Context) {
	gpus := u.opts.Sampler.Sample()
	for _, g := range gpus {
		u.noteError(ctx, fmt.Sprintf("gpu %d", g.GPU.Index), g.Err)
	}
	u.noteError(ctx, "processes", u.opts.Sampler.SourceErr())
	u.noteError(ctx, "pods", u.resolvePods(ctx, gpus))
	snap := u.attribute(gpus)
	u.mu.Lock()
	u.last = snap
	u.mu.Unlock()
}

// noteError logs an error when it first appears and when it goes, not at
// every sample.
func (u *podUsage) noteError(ctx context.Context, what string, err error) {
	logger := klog.FromContext(ctx)
	u.mu.Lock()
	defer u.mu.Unlock()
	prev, had := u.errs[what]
	switch {
	case err != nil && (!had || prev != err.Error()):
		logger.Error(err, "Cannot read GPU usage", "part", what)
		u.errs[what] = err.Error()
	case err == nil && had:
		logger.Info("GPU usage readable again", "part", what)
		delete(u.errs, what)
	}
}

// resolvePods lists the node's pods when a process runs in a container
// the last list did not name.
func (u *podUsage) resolvePods(ctx context.Context, gpus []gpuusage.Usage) error {
	now := time.Now()
	unknown := false
	for _, g := range gpus {
		for _, p := range g.Processes {
			if !p.InPod || u.known(p.Container) {
				continue
			}
			if m, ok := u.missed[p.Container]; !ok || m.due(now, u.opts.Interval) {
				unknown = true
			}
		}
	}
	if !unknown {
		return nil
	}
	// From the API server's cache (resourceVersion 0): a node's pods, not
	// a quorum read of the cluster's.
	list, err := u.client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("spec.nodeName", u.nodeName).String(),
		ResourceVersion: "0",
	})
	if err == nil {
		u.pods = map[string]podInfo{}
		for i := range list.Items {
			u.pods[string(list.Items[i].UID)] = podInfoOf(&list.Items[i])
		}
	}
	// A failed list backs off as a missed container does: a plugin
	// without the pods rule must not list at every sample.
	seen := map[gpuusage.Container]bool{}
	for _, g := range gpus {
		for _, p := range g.Processes {
			if !p.InPod || u.known(p.Container) {
				continue
			}
			seen[p.Container] = true
			m, ok := u.missed[p.Container]
			if !ok {
				m.since = now
			}
			m.tried = now
			u.missed[p.Container] = m
		}
	}
	for c := range u.missed {
		if !seen[c] {
			delete(u.missed, c)
		}
	}
	if err != nil {
		return fmt.Errorf("list the node's pods: %w", err)
	}
	return nil
}

func (u *podUsage) known(c gpuusage.Container) bool {
	_, ok := u.pods[c.PodUID].containers[c.ID]
	return ok
}

// podInfoOf reads a pod's container IDs and each container's claims:
// those of its resources.claims (the pod's claims, by name, through the
// pod's status for claims made from templates) and the claim the
// scheduler made for its extended resources.
func podInfoOf(p *v1.Pod) podInfo {
	info := podInfo{namespace: p.Namespace, name: p.Name, containers: map[string]string{}, claims: map[string][]string{}}
	for _, statuses := range [][]v1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses} {
		for _, s := range statuses {
			if _, id, ok := strings.Cut(s.ContainerID, "://"); ok {
				info.containers[id] = s.Name
			}
		}
	}
	names := map[string]string{}
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			names[rc.Name] = *rc.ResourceClaimName
		}
	}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			names[s.Name] = *s.ResourceClaimName
		}
	}
	for _, ctrs := range [][]v1.Container{p.Spec.Containers, p.Spec.InitContainers} {
		for _, c := range ctrs {
			for _, ref := range c.Resources.Claims {
				if n, ok := names[ref.Name]; ok {
					info.claims[c.Name] = append(info.claims[c.Name], n)
				}
			}
		}
	}
	if x := p.Status.ExtendedResourceClaimStatus; x != nil {
		for _, m := range x.RequestMappings {
			if !slices.Contains(info.claims[m.ContainerName], x.ResourceClaimName) {
				info.claims[m.ContainerName] = append(info.claims[m.ContainerName], x.ResourceClaimName)
			}
		}
	}
	return info
}

// attribute gives each process's use to the seat its container holds on
// the process's GPU.
func (u *podUsage) attribute(gpus []gpuusage.Usage) usageSnapshot {
	held := map[types.NamespacedName]*checkpoint.Claim{}
	for _, c := range u.ledger.Prepared() {
		held[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c
	}
	snap := usageSnapshot{gpus: gpus, containers: map[containerKey]*containerUse{}, unattributed: map[unattributedKey]uint64{}}
	for _, g := range gpus {
		for _, p := range g.Processes {
			key, ok := u.seatOf(p, g.GPU.Index, held)
			if !ok {
				reason := noSeatHere
				if !p.InPod {
					reason = outsidePods
				}
				snap.unattributed[unattributedKey{g.GPU.Index, reason}] += p.MemoryBytes
				continue
			}
			use := snap.containers[key]
			if use == nil {
				use = &containerUse{}
				snap.containers[key] = use
			}
			use.memory += p.MemoryBytes
			use.sm += p.SMPercent
			use.processes++
		}
	}
	return snap
}

func (u *podUsage) seatOf(p gpuusage.Process, gpu int, held map[types.NamespacedName]*checkpoint.Claim) (containerKey, bool) {
	if !p.InPod {
		return containerKey{}, false
	}
	pod, ok := u.pods[p.Container.PodUID]
	if !ok {
		return containerKey{}, false
	}
	name, ok := pod.containers[p.Container.ID]
	if !ok {
		return containerKey{}, false
	}
	group, seats, admin := "", map[int]bool{}, false
	for _, claim := range pod.claims[name] {
		c := held[types.NamespacedName{Namespace: pod.namespace, Name: claim}]
		if c == nil {
			continue
		}
		for _, dev := range c.Devices {
			if !slices.Contains(dev.GPUs, gpu) || (group != "" && dev.Group != group) {
				continue
			}
			group = dev.Group
			admin = admin || dev.AdminAccess
			for _, s := range dev.Seats {
				seats[s] = true
			}
		}
	}
	if group == "" {
		return containerKey{}, false
	}
	return containerKey{namespace: pod.namespace, pod: pod.name, container: name, group: group, seat: seatLabel(seats, admin), gpu: gpu}, true
}

// seatLabel names a container's seats in a group: "0", "1,2", "admin"
// for admin access, or "fenced" for a claim whose seats were lost with
// the checkpoint (it holds the whole group).
func seatLabel(seats map[int]bool, admin bool) string {
	switch {
	case len(seats) == 0 && admin:
		return seatAdmin
	case len(seats) == 0:
		return seatFenced
	}
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(seats)) {
		parts = append(parts, strconv.Itoa(s))
	}
	return strings.Join(parts, ",")
}

func (u *podUsage) snapshot() usageSnapshot {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last
}
