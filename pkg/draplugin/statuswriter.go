package draplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/migseats"
)

// The seats are written into the claims' status behind the prepare calls,
// a second later: the status is for operators (and for rebuilding a lost
// checkpoint), the pod does not wait for it. A queue keyed by claim UID
// retries failures with backoff; an entry that is gone by then
// (unprepared) is skipped. That a status was written is kept in the
// checkpoint with the next save, so a restart writes again only the
// statuses it may have missed.

// statusWriteTimeout bounds one status write.
const statusWriteTimeout = 10 * time.Second

// statusWriteDelay is how long a status write waits after its prepare:
// when the kubelet starts many pods at once, their prepares go first and
// the API server is not asked to apply statuses while it answers the
// kubelet's and the plugin's reads for the pods still starting.
const statusWriteDelay = time.Second

// stopDrainTimeout is how long Stop waits for queued status writes.
const stopDrainTimeout = 5 * time.Second

// statusLedger is what the status writer needs of the seat ledger.
type statusLedger interface {
	StatusOwed(uid types.UID) *checkpoint.Claim
	MarkStatusWritten(uid types.UID, c *checkpoint.Claim)
	StatusesOwed() []types.UID
	// PreparedClaims: a status written before is written again (rewrite)
	// only while its claim is held.
	PreparedClaims() map[types.UID]*checkpoint.Claim
}

// migDevices is what a claim's status says of its MIG devices
// (migseats.Seats).
type migDevices interface {
	// InstanceUUID is the UUID of the MIG device made for a claim's
	// device; "" for another device.
	InstanceUUID(uid types.UID, dev checkpoint.Device) string
	// Lost says whether the MIG instance of a claim's device is gone.
	Lost(uid types.UID, device string) (migseats.Lost, bool)
}

// statusWriter writes the seats of prepared claims into their status.
type statusWriter struct {
	claims  resourceclient.ResourceClaimsGetter
	ledger  statusLedger
	queue   workqueue.TypedRateLimitingInterface[types.UID]
	metrics *metrics
	// written is called after each status written (a test hook).
	written func()
	// mig says what a status says of MIG devices.
	mig migDevices

	// again counts the rewrites asked for each claim whose status was
	// written already; a write that saw n clears them only if no other
	// was asked for meanwhile.
	mu    sync.Mutex
	again map[types.UID]int
}

func newStatusWriter(claims resourceclient.ResourceClaimsGetter, ledger statusLedger, mig migDevices, m *metrics, written func()) *statusWriter {
	return &statusWriter{
		claims: claims, ledger: ledger, mig: mig, metrics: m, written: written, again: map[types.UID]int{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](100*time.Millisecond, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "kyb-claim-status"}),
	}
}

// queueAfterPrepare writes the claim's status a little later.
func (w *statusWriter) queueAfterPrepare(uid types.UID) { w.queue.AddAfter(uid, statusWriteDelay) }

// rewrite writes again the status of a held claim, written before or not:
// what it says of a device changed (its MIG instance went or was made
// again).
func (w *statusWriter) rewrite(uid types.UID) {
	w.mu.Lock()
	w.again[uid]++
	w.mu.Unlock()
	w.queue.Add(uid)
}

// owed is the entry whose status to write, and how many rewrites of it
// were asked for; nil where none is owed.
func (w *statusWriter) owed(uid types.UID) (*checkpoint.Claim, int) {
	w.mu.Lock()
	n := w.again[uid]
	w.mu.Unlock()
	if c := w.ledger.StatusOwed(uid); c != nil {
		return c, n
	}
	if n == 0 {
		return nil, n
	}
	return w.ledger.PreparedClaims()[uid], n
}

// rewritten forgets the n rewrites of uid a write saw, or the claim's
// rewrites altogether where n is 0 (it is gone).
func (w *statusWriter) rewritten(uid types.UID, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n == 0 || w.again[uid] == n {
		delete(w.again, uid)
	}
}

// queueOwed queues the status of every prepared claim not known to have
// one now: those prepared just before the plugin last stopped, or waiting
// out their delay.
func (w *statusWriter) queueOwed() {
	for _, uid := range w.ledger.StatusesOwed() {
		w.queue.Add(uid)
	}
}

// run works the queue until it shuts down.
func (w *statusWriter) run(ctx context.Context) {
	for w.writeNext(ctx) {
	}
}

// drain stops the queue, giving queued writes a bounded time to finish:
// the next start, or a rebuild of a lost checkpoint, then finds them in
// place.
func (w *statusWriter) drain() {
	w.queueOwed()
	drained := make(chan struct{})
	go func() {
		w.queue.ShutDownWithDrain()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(stopDrainTimeout):
		// Writes left are retried by the next start (StatusWritten).
		w.queue.ShutDown()
		<-drained
	}
}

func (w *statusWriter) writeNext(ctx context.Context) bool {
	uid, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	defer w.queue.Done(uid)
	c, again := w.owed(uid)
	if c == nil {
		w.rewritten(uid, 0)
		w.queue.Forget(uid)
		return true
	}
	wctx, cancel := context.WithTimeout(ctx, statusWriteTimeout)
	err := w.write(wctx, uid, c)
	cancel()
	switch {
	case err == nil:
		w.queue.Forget(uid)
		w.metrics.statusesWritten.Inc()
		w.ledger.MarkStatusWritten(uid, c)
		w.rewritten(uid, again)
		if w.written != nil {
			w.written()
		}
	case apierrors.IsNotFound(err):
		// The claim is gone; its unprepare follows.
		w.rewritten(uid, 0)
		w.queue.Forget(uid)
	case ctx.Err() != nil:
		// Stopping: the next start writes it (StatusWritten is unset).
	default:
		w.metrics.prepareError("status")
		klog.FromContext(ctx).Error(err, "Cannot record the seats in the claim's status; retrying (the pod is not affected)", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
		w.queue.AddRateLimited(uid)
	}
	return true
}

// deviceStatus is what a device's status data holds: its seats and, for a
// MIG device, the UUID of the MIG device made for it (MIG-…), which
// kubectl kyb seats shows and a container sees in CUDA_VISIBLE_DEVICES.
// Every reader of the seat status (a lost checkpoint's rebuild, kubectl
// kyb seats) decodes it with encoding/json, which skips a field it does
// not know, so an older reader reads it as before.
type deviceStatus struct {
	v1alpha1.SeatStatus
	MIGDeviceUUID string `json:"migDeviceUUID,omitempty"`
}

// write records the seats in the claim's status with server-side apply,
// as field manager gpu.kyb.ai: the driver owns its own entries of
// status.devices and nothing else (RBAC: resourceclaims/driver,
// associated-node:patch).
func (w *statusWriter) write(ctx context.Context, uid types.UID, c *checkpoint.Claim) error {
	status := resourceapply.ResourceClaimStatus()
	for _, dev := range c.Devices {
		st := deviceStatus{SeatStatus: dev.SeatStatus, MIGDeviceUUID: w.mig.InstanceUUID(uid, dev)}
		data, err := json.Marshal(st)
		if err != nil {
			return fmt.Errorf("encode seat status: %w", err)
		}
		entry := resourceapply.AllocatedDeviceStatus().
			WithDriver(driver.Name).WithPool(dev.Pool).WithDevice(dev.Device).
			WithData(runtime.RawExtension{Raw: data})
		// Applied without it once the instance is made again, the
		// condition goes: the plugin owns its entries' conditions.
		if li, ok := w.mig.Lost(uid, dev.Device); ok {
			entry = entry.WithConditions(li.Condition())
		}
		if dev.ShareID != "" {
			entry = entry.WithShareID(dev.ShareID)
		}
		status = status.WithDevices(entry)
	}
	apply := resourceapply.ResourceClaim(c.Name, c.Namespace).WithStatus(status)
	_, err := w.claims.ResourceClaims(c.Namespace).ApplyStatus(ctx, apply, metav1.ApplyOptions{FieldManager: driver.Name, Force: true})
	if err != nil {
		return fmt.Errorf("apply status of claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	return nil
}
