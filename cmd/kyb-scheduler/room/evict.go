package room

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	klabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Event reasons of defragmentation.
const (
	// ReasonDefragmenting is on the waiting pod: pods are moved for it.
	ReasonDefragmenting = "Defragmenting"
	// ReasonDefragmented is on each pod evicted for it.
	ReasonDefragmented = "Defragmented"
	// ReasonDefragmentationDryRun is on both, in a dry run.
	ReasonDefragmentationDryRun = "DefragmentationDryRun"
)

// evictTimeout bounds one eviction's API call.
const evictTimeout = 10 * time.Second

// report says, in the log and in events on the waiting pod and on each
// pod to move, what a defragmentation moves, where it found each pod
// fits, and for whom. A consolidation's waiting pod is nil.
func (pl *Preemption) report(ctx context.Context, waiting *v1.Pod, p *plan, dryRun bool) {
	logger := klog.FromContext(ctx)
	recorder := pl.fh.EventRecorder()
	var where []string
	fitsOn := map[types.UID]string{}
	for _, m := range p.moves {
		where = append(where, fmt.Sprintf("%s/%s to %s", m.pod.Namespace, m.pod.Name, m.node))
		fitsOn[m.original] = "on node " + m.node
	}
	forWhom := "a whole group of the largest size (consolidation)"
	if waiting != nil {
		forWhom = "pod " + waiting.Namespace + "/" + waiting.Name
	}
	reason, action, verb := ReasonDefragmenting, "Evicting", "Moving"
	if dryRun {
		reason, action, verb = ReasonDefragmentationDryRun, "DryRun", "Would move"
	}
	logger.Info(verb+" pods to free devices", "dryRun", dryRun, "for", forWhom, "node", p.node, "pods", klog.KObjSlice(p.victims), "fitsOn", where)
	if waiting != nil {
		recorder.Eventf(waiting, nil, v1.EventTypeNormal, reason, action, "%s %s off node %s to free devices for this pod (replacements fit: %s)",
			verb, names(p.victims), p.node, strings.Join(where, ", "))
	}
	if !dryRun {
		reason = ReasonDefragmented
	}
	for _, v := range p.victims {
		note := "Evicted to free devices on node %s for %s; its controller recreates it, and it fits"
		if dryRun {
			note = "Would be evicted to free devices on node %s for %s (dry run); it would fit"
		}
		note += " " + fitsOn[v.UID]
		if waiting != nil {
			recorder.Eventf(v, waiting, v1.EventTypeNormal, reason, action, note, p.node, forWhom)
		} else {
			recorder.Eventf(v, nil, v1.EventTypeNormal, reason, action, note, p.node, forWhom)
		}
	}
}

// evictAll evicts the plan's pods through the Eviction API, which honours
// their PodDisruptionBudgets: the API server refuses an eviction a budget
// does not allow, and the pods after it stay. The pods a budget selects
// go first, so that a refusal the scheduler's informer could not foresee
// (a budget changed since, a pod two budgets select) comes, most often,
// before any pod is evicted for nothing. It returns the pods evicted; a
// pod refused is not moved again for a while (refusals).
func (pl *Preemption) evictAll(ctx context.Context, waiting *v1.Pod, p *plan) ([]*v1.Pod, error) {
	client := pl.fh.ClientSet()
	victims := slices.Clone(p.victims)
	if pdbs, err := pl.Evaluator.PdbLister.List(klabels.Everything()); err == nil {
		slices.SortStableFunc(victims, func(a, b *v1.Pod) int {
			return cmpBool(!budgeted(a, pdbs), !budgeted(b, pdbs))
		})
	}
	var evicted []*v1.Pod
	for i, v := range victims {
		ectx, cancel := context.WithTimeout(ctx, evictTimeout)
		err := client.CoreV1().Pods(v.Namespace).EvictV1(ectx, &policyv1.Eviction{
			ObjectMeta:    metav1.ObjectMeta{Name: v.Name, Namespace: v.Namespace},
			DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &v.UID}},
		})
		cancel()
		if err != nil {
			pl.refused.add(v.UID)
			if waiting != nil {
				pl.fh.EventRecorder().Eventf(waiting, nil, v1.EventTypeWarning, ReasonDefragmenting, "Evicting",
					"Stopped after %d of %d evictions on node %s: %s/%s: %v", i, len(victims), p.node, v.Namespace, v.Name, err)
			}
			return evicted, fmt.Errorf("evict %s/%s (%d of %d) on node %s: %w", v.Namespace, v.Name, i+1, len(victims), p.node, err)
		}
		evicted = append(evicted, v)
	}
	return evicted, nil
}

// budgeted says whether a PodDisruptionBudget selects the pod.
func budgeted(pod *v1.Pod, pdbs []*policyv1.PodDisruptionBudget) bool {
	for _, pdb := range pdbs {
		if pdb.Namespace != pod.Namespace {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || sel.Empty() {
			continue
		}
		if sel.Matches(klabels.Set(pod.Labels)) {
			return true
		}
	}
	return false
}

// refusals are the pods whose eviction the API server refused lately:
// defragmentation leaves them be for refusedFor. A plan that needs one
// would evict the pods before it in every cycle, and be refused again
// at it.
type refusals struct {
	mu    sync.Mutex
	until map[types.UID]time.Time
}

// refusedFor is how long a pod whose eviction was refused is not moved.
const refusedFor = 5 * time.Minute

func (r *refusals) add(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.until == nil {
		r.until = map[types.UID]time.Time{}
	}
	r.until[uid] = time.Now().Add(refusedFor)
}

// has says whether the pod's eviction was refused lately, and forgets
// the refusals whose time is up.
func (r *refusals) has(uid types.UID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for u, t := range r.until {
		if now.After(t) {
			delete(r.until, u)
		}
	}
	_, ok := r.until[uid]
	return ok
}
