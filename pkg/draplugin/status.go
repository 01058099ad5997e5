package draplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// SeatStatus is what the driver writes into a claim's
// status.devices[].data: the seats a device holds, for operators.
type SeatStatus struct {
	Profile     string   `json:"profile"`
	Group       string   `json:"group"`
	GPUs        []int    `json:"gpus"`
	GPUUUIDs    []string `json:"gpuUUIDs"`
	Seats       []int    `json:"seats"`
	Generations []int64  `json:"generations"`
}

// writeStatus records the seats in the claim's status with server-side
// apply, as field manager gpu.kyb.ai: the driver owns its own entries of
// status.devices and nothing else (RBAC: resourceclaims/driver,
// associated-node:patch).
func (d *Driver) writeStatus(ctx context.Context, c *checkpoint.Claim) error {
	status := resourceapply.ResourceClaimStatus()
	for _, dev := range c.Devices {
		data, err := json.Marshal(SeatStatus{Profile: dev.Profile, Group: dev.Group, GPUs: dev.GPUs, GPUUUIDs: dev.GPUUUIDs, Seats: dev.Seats, Generations: dev.Generations})
		if err != nil {
			return fmt.Errorf("encode seat status: %w", err)
		}
		entry := resourceapply.AllocatedDeviceStatus().
			WithDriver(driver.Name).WithPool(dev.Pool).WithDevice(dev.Device).
			WithData(runtime.RawExtension{Raw: data})
		if dev.ShareID != "" {
			entry = entry.WithShareID(dev.ShareID)
		}
		status = status.WithDevices(entry)
	}
	apply := resourceapply.ResourceClaim(c.Name, c.Namespace).WithStatus(status)
	_, err := d.client.ResourceV1().ResourceClaims(c.Namespace).ApplyStatus(ctx, apply, metav1.ApplyOptions{FieldManager: driver.Name, Force: true})
	if err != nil {
		return fmt.Errorf("apply status of claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	return nil
}

// The seats are written into the claims' status behind the prepare calls,
// a second later: the status is for operators (and for rebuilding a lost
// checkpoint), the pod does not wait for it. A queue keyed by claim UID retries failures
// with backoff; an entry that is gone by then (unprepared) is skipped.
// That a status was written is kept in the checkpoint with the next save,
// so a restart writes again only the statuses it may have missed.

// statusWriteTimeout bounds one status write.
const statusWriteTimeout = 10 * time.Second

// statusWriteDelay is how long a status write waits after its prepare:
// when the kubelet starts many pods at once, their prepares go first and
// the API server is not asked to apply statuses while it answers the
// kubelet's and the plugin's reads for the pods still starting.
const statusWriteDelay = time.Second

// stopDrainTimeout is how long Stop waits for queued status writes.
const stopDrainTimeout = 5 * time.Second

func newStatusQueue() workqueue.TypedRateLimitingInterface[types.UID] {
	return workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](100*time.Millisecond, time.Minute),
		workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "kyb-claim-status"})
}

// writeStatuses works the status queue until it shuts down.
func (d *Driver) writeStatuses(ctx context.Context) {
	for d.writeNextStatus(ctx) {
	}
}

func (d *Driver) writeNextStatus(ctx context.Context) bool {
	uid, shutdown := d.statusQueue.Get()
	if shutdown {
		return false
	}
	defer d.statusQueue.Done(uid)
	// An entry's devices never change once recorded: the write below may
	// read them without the lock.
	d.mu.Lock()
	var c *checkpoint.Claim
	if d.st != nil {
		c = d.st.Claims[uid]
	}
	written := c != nil && c.StatusWritten
	d.mu.Unlock()
	if c == nil || written {
		d.statusQueue.Forget(uid)
		return true
	}
	wctx, cancel := context.WithTimeout(ctx, statusWriteTimeout)
	err := d.writeStatus(wctx, c)
	cancel()
	switch {
	case err == nil:
		d.statusQueue.Forget(uid)
		d.metrics.statusesWritten.Inc()
		d.mu.Lock()
		if d.st != nil && d.st.Claims[uid] == c {
			c.StatusWritten = true
		}
		d.mu.Unlock()
		d.hooks.run(HookAfterStatusWrite)
	case apierrors.IsNotFound(err):
		// The claim is gone; its unprepare follows.
		d.statusQueue.Forget(uid)
	case ctx.Err() != nil:
		// Stopping: the next start writes it (StatusWritten is unset).
	default:
		d.metrics.prepareError("status")
		klog.FromContext(ctx).Error(err, "Cannot record the seats in the claim's status; retrying (the pod is not affected)", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
		d.statusQueue.AddRateLimited(uid)
	}
	return true
}

// queueMissingStatuses queues the status of every prepared claim not known
// to have one: those written just before the plugin last stopped.
func (d *Driver) queueMissingStatuses() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.st == nil {
		return
	}
	for uid, c := range d.st.Claims {
		if !c.StatusWritten && c.Phase == checkpoint.PrepareCompleted {
			d.statusQueue.Add(uid)
		}
	}
}
