package health

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// status is what the monitor knows of the GPUs' and MIG instances'
// health, and who wants to hear when it changes: the side of the Monitor
// that both surfaces read (Source). Probes and events report into it;
// it keeps each recovery clock (fault.go), counts each change in the
// metrics and logs it.
type status struct {
	recovery  time.Duration
	clock     clock.WithTicker
	metrics   *metrics
	inventory *inventory.Inventory

	mu   sync.Mutex
	gpus *tracker[int]
	// instances are the unhealthy MIG instances (see instance.go).
	instances *tracker[Instance]
	subs      map[int]chan struct{}
	next      int
}

func newStatus(recovery time.Duration, clk clock.WithTicker, inv *inventory.Inventory) *status {
	return &status{
		recovery: recovery, clock: clk, metrics: newMetrics(len(inv.GPUs)), inventory: inv,
		gpus: newTracker[int](recovery), instances: newTracker[Instance](recovery), subs: map[int]chan struct{}{},
	}
}

// Faults maps the index of every unhealthy GPU to its fault.
func (s *status) Faults() map[int]Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gpus.faults()
}

// Subscribe returns a channel that receives after every change of the set
// of unhealthy GPUs (changes in a burst may arrive as one), and the
// function that ends the subscription. The channel is never closed.
func (s *status) Subscribe() (<-chan struct{}, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan struct{}, 1)
	id := s.next
	s.next++
	s.subs[id] = ch
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.subs, id)
	}
}

// fail records a fault of a GPU.
func (s *status) fail(ctx context.Context, gpu int, f Fault) {
	s.metrics.count(gpu, string(f.Kind))
	s.mu.Lock()
	tr := s.gpus.fail(gpu, f, s.clock.Now())
	s.mu.Unlock()
	if tr == nil {
		klog.FromContext(ctx).V(2).Info("GPU still unhealthy; recovery clock restarted", "gpu", gpu, "reason", f.Reason, "message", f.Message)
		return
	}
	s.changed(ctx, tr)
}

// succeed records a successful probe of a GPU.
func (s *status) succeed(ctx context.Context, gpu int) {
	s.mu.Lock()
	tr := s.gpus.succeed(gpu, s.clock.Now())
	s.mu.Unlock()
	if tr != nil {
		s.metrics.count(gpu, kindRecovered)
		s.changed(ctx, tr)
	}
	s.succeedInstances(ctx, gpu)
}

// isLost reports whether a GPU is lost for good.
func (s *status) isLost(gpu int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gpus.lost(gpu)
}

// changed logs a transition and tells the subscribers.
func (s *status) changed(ctx context.Context, tr *transition[int]) {
	logger := klog.FromContext(ctx)
	uuid := s.inventory.GPUs[tr.gpu].UUID
	switch {
	case tr.fault == nil:
		logger.Info("GPU is healthy again", "gpu", tr.gpu, "uuid", uuid, "fault", tr.previous.Reason,
			"unhealthyFor", s.clock.Since(tr.previous.Since).Round(time.Millisecond), "quietFor", s.recovery)
	case tr.fault.Permanent():
		logger.Error(nil, "GPU is lost; it stays unhealthy until it is reset and the plugin restarted", "gpu", tr.gpu, "uuid", uuid,
			"reason", tr.fault.Reason, "message", tr.fault.Message)
	default:
		logger.Error(nil, "GPU is unhealthy", "gpu", tr.gpu, "uuid", uuid, "reason", tr.fault.Reason, "message", tr.fault.Message,
			"recoversAfter", s.recovery)
	}
	s.notify()
}

// notify tells the subscribers that something changed.
func (s *status) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default: // a change is already pending for this subscriber
		}
	}
}

// hold records that the driver asks for a recovery action for a GPU: it
// is unhealthy (with f, where it was healthy) until the driver asks for
// nothing again.
func (s *status) hold(ctx context.Context, gpu int, f Fault) {
	s.mu.Lock()
	tr := s.gpus.hold(gpu, f, s.clock.Now())
	s.mu.Unlock()
	if tr != nil {
		s.metrics.count(gpu, string(f.Kind))
		s.changed(ctx, tr)
	}
}

// release records that the driver asks for nothing for a GPU, or no
// longer reports what it asks for.
func (s *status) release(gpu int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gpus.release(gpu)
}

// InstanceFaults maps every unhealthy MIG instance to its fault.
func (s *status) InstanceFaults() map[Instance]Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.instances.faults()
}

// failInstance records a fault of a MIG instance.
func (s *status) failInstance(ctx context.Context, in Instance, f Fault) {
	s.metrics.count(in.GPU, string(f.Kind))
	s.mu.Lock()
	tr := s.instances.fail(in, f, s.clock.Now())
	s.mu.Unlock()
	if tr == nil {
		klog.FromContext(ctx).V(2).Info("MIG instance still unhealthy; recovery clock restarted", "gpu", in.GPU, "placement", in.Placement, "reason", f.Reason, "message", f.Message)
		return
	}
	s.changedInstance(ctx, tr)
}

// succeedInstances records a successful probe of a GPU for its unhealthy
// instances.
func (s *status) succeedInstances(ctx context.Context, gpu int) {
	now := s.clock.Now()
	var done []*transition[Instance]
	s.mu.Lock()
	var onGPU []Instance
	for in := range s.instances.faults() {
		if in.GPU == gpu {
			onGPU = append(onGPU, in)
		}
	}
	slices.SortFunc(onGPU, func(a, b Instance) int {
		return cmp.Or(cmp.Compare(a.Placement.Start, b.Placement.Start), cmp.Compare(a.Placement.Size, b.Placement.Size))
	})
	for _, in := range onGPU {
		if tr := s.instances.succeed(in, now); tr != nil {
			done = append(done, tr)
		}
	}
	s.mu.Unlock()
	for _, tr := range done {
		s.metrics.count(gpu, kindRecovered)
		s.changedInstance(ctx, tr)
	}
}

// changedInstance logs an instance's transition and tells the
// subscribers.
func (s *status) changedInstance(ctx context.Context, tr *transition[Instance]) {
	logger := klog.FromContext(ctx)
	in := tr.gpu
	uuid := s.inventory.GPUs[in.GPU].UUID
	if tr.fault == nil {
		logger.Info("MIG instance is healthy again", "gpu", in.GPU, "uuid", uuid, "placement", in.Placement, "fault", tr.previous.Reason,
			"unhealthyFor", s.clock.Since(tr.previous.Since).Round(time.Millisecond), "quietFor", s.recovery)
	} else {
		logger.Error(nil, "MIG instance is unhealthy", "gpu", in.GPU, "uuid", uuid, "placement", in.Placement, "reason", tr.fault.Reason,
			"message", tr.fault.Message, "recoversAfter", s.recovery)
	}
	s.notify()
}
