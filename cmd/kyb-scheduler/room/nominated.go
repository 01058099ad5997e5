package room

import (
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
)

// keptDevices are the devices preemptions found for the pods they
// nominated to nodes: while a pod's victims terminate, Filter treats
// them as the nominated pod's for every pod of a lower or the same
// priority (AddPod), as kube-scheduler treats a nominated pod's CPU and
// memory. The devices are the allocator's choice in the dry run, with
// the victims' claims released: the ones the victims free, and any free
// ones the pod needs besides. When the pod is tried again, its own
// allocation does not count them (the framework adds no pod to its own
// cycle), and it may take others.
type keptDevices struct {
	mu    sync.Mutex
	byPod map[types.UID]kept
}

type kept struct {
	namespace, name, node string
	allocation            []resourceapi.AllocationResult
	// victims are those the preemption evicts, and since when; held,
	// what their claims held then.
	victims []*v1.Pod
	held    held
	since   time.Time
}

// held are devices and shares claims hold.
type held struct {
	devices []structured.DeviceID
	shares  []structured.SharedDeviceID
}

// heldBy is what the pods' allocated claims hold.
func heldBy(dra fwk.SharedDRAManager, pods []*v1.Pod) held {
	var h held
	for _, p := range pods {
		for _, claim := range podClaims(dra, p) {
			forEachDevice(claim.Status.Allocation.Devices.Results,
				func(id structured.DeviceID) { h.devices = append(h.devices, id) },
				func(id structured.SharedDeviceID, _ structured.DeviceConsumedCapacity) {
					h.shares = append(h.shares, id)
				})
		}
	}
	return h
}

// in reports whether the state still holds any of it.
func (h held) in(state *structured.AllocatedState) bool {
	for _, id := range h.devices {
		if state.AllocatedDevices.Has(id) {
			return true
		}
	}
	for _, id := range h.shares {
		if state.AllocatedSharedDeviceIDs.Has(id) {
			return true
		}
	}
	return false
}

// victimsGoWithin is how long a victim may stay without being deleted
// before its preemption counts as failed (the eviction's API call did
// not go through): the pod may then preempt again. A victim deleted, or
// marked for deletion by the preemption, counts until it goes however
// long its grace period.
const victimsGoWithin = 10 * time.Second

func newKeptDevices() *keptDevices {
	return &keptDevices{byPod: map[types.UID]kept{}}
}

func (k *keptDevices) set(pod *v1.Pod, node string, allocation []resourceapi.AllocationResult, victims []*v1.Pod, h held) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.byPod[pod.UID] = kept{namespace: pod.Namespace, name: pod.Name, node: node, allocation: allocation, victims: victims, held: h, since: time.Now()}
}

// leaving reports whether a victim of the pod's last preemption is still
// there, or what its claims held is still allocated: in gathered, the
// allocated state the pod's cycle judged it by, where given (the claims
// may have been released since, and the next cycle will see the room),
// else now.
func (k *keptDevices) leaving(pod types.UID, pods corelisters.PodLister, dra fwk.SharedDRAManager, gathered *structured.AllocatedState) bool {
	k.mu.Lock()
	d, ok := k.byPod[pod]
	k.mu.Unlock()
	if !ok {
		return false
	}
	for _, v := range d.victims {
		if p, err := pods.Pods(v.Namespace).Get(v.Name); err == nil && p.UID == v.UID {
			if p.DeletionTimestamp != nil || disruptedByPreemption(p) || time.Since(d.since) < victimsGoWithin {
				return true
			}
			continue
		}
		if gathered != nil {
			continue
		}
		for _, claim := range podClaims(dra, v) {
			for _, r := range claim.Status.ReservedFor {
				if r.UID == v.UID {
					return true
				}
			}
		}
	}
	return gathered != nil && d.held.in(gathered)
}

// disruptedByPreemption reports whether the scheduler marked the pod a
// preemption's victim (the condition it sets before the deletion).
func disruptedByPreemption(p *v1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == v1.DisruptionTarget && c.Status == v1.ConditionTrue && c.Reason == v1.PodReasonPreemptionByScheduler {
			return true
		}
	}
	return false
}

// get returns the devices kept for a pod on a node.
func (k *keptDevices) get(pod types.UID, node string) ([]resourceapi.AllocationResult, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	d, ok := k.byPod[pod]
	if !ok || d.node != node {
		return nil, false
	}
	return d.allocation, true
}

// prune forgets the pods that are gone or bound: a bound pod's claims
// are allocated, and count as such.
func (k *keptDevices) prune(pods corelisters.PodLister) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for uid, d := range k.byPod {
		p, err := pods.Pods(d.namespace).Get(d.name)
		if err != nil || p.UID != uid || p.Spec.NodeName != "" {
			delete(k.byPod, uid)
		}
	}
}
