package room

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
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
}

func newKeptDevices() *keptDevices {
	return &keptDevices{byPod: map[types.UID]kept{}}
}

func (k *keptDevices) set(pod *v1.Pod, node string, allocation []resourceapi.AllocationResult) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.byPod[pod.UID] = kept{namespace: pod.Namespace, name: pod.Name, node: node, allocation: allocation}
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

// node is the node a pod's devices are kept on, "" for none.
func (k *keptDevices) node(pod types.UID) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.byPod[pod].node
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
