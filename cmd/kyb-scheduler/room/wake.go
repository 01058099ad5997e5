package room

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/scheduler/framework/preemption"
)

// wakes try a preemptor again once its asynchronous preemption ends. The
// preemptor is gated (PreEnqueue) while its victims are evicted, and a
// gated pod is tried again only on an event. For a pod with claims that
// event is the release of a victim's claim, which may be seen before the
// scheduler's own informer has seen the last victim go (the release comes
// from the resource-claim controller, the deletion from the API server,
// on different watches): the preemptor then stays gated, and the release
// of the last claim, already seen, wakes nothing. So once its preemption
// ends the preemptor is activated, as the executor does where no victim's
// deletion would come.
type wakes struct {
	mu      sync.Mutex
	waiting sets.Set[types.UID]
}

// wakeWithin bounds the wait for a preemption to end.
const wakeWithin = 30 * time.Second

func (w *wakes) after(ctx context.Context, pl *Preemption, preemptor preemption.ExecutorPreemptor) {
	uid := preemptor.UID()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiting.Has(uid) {
		return
	}
	w.waiting.Insert(uid)
	logger := klog.FromContext(ctx)
	pods := preemptor.Pods()
	go func() {
		defer func() {
			w.mu.Lock()
			w.waiting.Delete(uid)
			w.mu.Unlock()
		}()
		// The executor's context ends with the preemption; the wait has
		// its own.
		wctx, cancel := context.WithTimeout(context.Background(), wakeWithin)
		defer cancel()
		err := wait.PollUntilContextCancel(wctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
			return !pl.Executor.IsPodRunningPreemption(uid), nil
		})
		if err != nil {
			logger.V(2).Info("Preemption did not end in time; the preemptor waits for an event", "preemptor", klog.KObj(preemptor))
			return
		}
		pl.fh.Activate(logger, pods)
	}()
}
