package room

import (
	"cmp"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	klabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	fwk "k8s.io/kube-scheduler/framework"
)

// movesUnderway are the moves of the defragmentations and consolidations
// that evicted their pods, until the replacements bind: where each
// replacement was found to fit, with the devices it would get there. A
// later plan counts them as placed, for its waiting pod and for its own
// moved pods: two plans in a row checked each against the cluster
// without the other's replacements would send both to the one free seat,
// and leave one with nowhere to go.
type movesUnderway struct {
	mu    sync.Mutex
	moves []underway
}

type underway struct {
	move
	namespace string
	// owner is the moved pod's controller, whose new pod is its
	// replacement.
	owner types.UID
	since time.Time
}

// replacementsBindWithin bounds how long a move counts: a replacement
// not bound by then waits as any pending pod (a controller that is slow
// to recreate, a replacement placed by another scheduler, or one gone
// for good), and no longer holds the devices it was found.
const replacementsBindWithin = 2 * time.Minute

// add remembers the moves of the pods evicted.
func (u *movesUnderway) add(moves []move, evicted []*v1.Pod) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	for _, m := range moves {
		owner := metav1.GetControllerOf(m.pod)
		if owner == nil || !slices.ContainsFunc(evicted, func(p *v1.Pod) bool { return p.UID == m.original }) {
			continue
		}
		u.moves = append(u.moves, underway{move: m, namespace: m.pod.Namespace, owner: owner.UID, since: now})
	}
}

// prune forgets the moves whose time is up, and those whose replacement
// is bound, its claims allocated: a pod of the moved pod's controller
// created since the move and bound, one for each move, the oldest move
// first.
func (u *movesUnderway) prune(pods corelisters.PodLister) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.moves) == 0 {
		return
	}
	slices.SortStableFunc(u.moves, func(a, b underway) int { return a.since.Compare(b.since) })
	byNamespace := map[string][]*v1.Pod{}
	taken := map[types.UID]bool{}
	kept := u.moves[:0]
	for _, m := range u.moves {
		if time.Since(m.since) > replacementsBindWithin {
			continue
		}
		list, ok := byNamespace[m.namespace]
		if !ok {
			list, _ = pods.Pods(m.namespace).List(klabels.Everything())
			byNamespace[m.namespace] = list
		}
		// Creation times are in seconds.
		created := m.since.Truncate(time.Second)
		i := slices.IndexFunc(list, func(p *v1.Pod) bool {
			owner := metav1.GetControllerOf(p)
			return owner != nil && owner.UID == m.owner && p.UID != m.original && !taken[p.UID] &&
				p.Spec.NodeName != "" && !p.CreationTimestamp.Time.Before(created)
		})
		if i >= 0 {
			taken[list[i].UID] = true
			continue
		}
		kept = append(kept, m)
	}
	u.moves = kept
}

// list returns the moves under way, ordered by the moved pod's UID.
func (u *movesUnderway) list() []move {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]move, 0, len(u.moves))
	for _, m := range u.moves {
		out = append(out, m.move)
	}
	slices.SortFunc(out, func(a, b move) int { return cmp.Compare(a.original, b.original) })
	return out
}

// withUnderway returns the cycle state with the devices of the moves
// under way allocated, for the Filter plugins that judge a plan: a clone
// where there are any, the state itself where there are none.
func (pl *Preemption) withUnderway(state fwk.CycleState, moves []move) fwk.CycleState {
	c := newChanges(state, pl.dra)
	if c == nil || len(moves) == 0 {
		return state
	}
	c = c.copy()
	for _, m := range moves {
		c.added[m.pod.UID] = m.allocation
	}
	state = state.Clone()
	c.write(state)
	return state
}
