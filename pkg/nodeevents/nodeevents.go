// Package nodeevents records Kubernetes Events on the node a plugin serves
// and on the claims it prepares there, and logs each one: the one way the DRA plugin tells operators what they
// should know (a GPU fault, a layout fallback, a lost checkpoint). An
// event's note is written for people; the log line carries the same note
// under a constant message, so that logs stay greppable and structured.
//
// Warnings are logged one way across the driver: an Info line (klog has
// no warning level for structured logs) whose "warning" key says what is
// wrong; a Warning event's line is such a line too.
package nodeevents

import (
	"context"
	"sync"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
)

// Reasons of the events the DRA plugin records, in one place so that each
// is written one way, with one type.
const (
	// ReasonGPUUnhealthy (Warning): a GPU failed; its groups are tainted.
	ReasonGPUUnhealthy = "GPUUnhealthy"
	// ReasonGPUHealthy (Normal): a GPU recovered; the taint is gone.
	ReasonGPUHealthy = "GPUHealthy"
	// ReasonSeatLayoutFallback (Warning): the API server dropped the
	// fields shared groups need; the node publishes one device per seat.
	ReasonSeatLayoutFallback = "SeatLayoutFallback"
	// ReasonInvalidResourceSlice (Warning): the API server refuses the
	// node's slices.
	ReasonInvalidResourceSlice = "InvalidResourceSlice"
	// ReasonDeviceTaintsDropped (Warning): the API server does not keep
	// device taints.
	ReasonDeviceTaintsDropped = "DeviceTaintsDropped"
	// ReasonCheckpointRebuilt (Warning): both copies of the checkpoint were
	// unusable; it was rebuilt from the API server.
	ReasonCheckpointRebuilt = "CheckpointRebuilt"
	// ReasonCheckpointLost (Warning): the checkpoint is unusable and not
	// rebuilt yet; new claims are refused.
	ReasonCheckpointLost = "CheckpointLost"
	// ReasonStaleClaimReleased (Normal): a held claim the kubelet will not
	// unprepare was released.
	ReasonStaleClaimReleased = "StaleClaimReleased"
	// ReasonGPUsFenced (Warning): a held claim fences GPUs: its group
	// changed in the configuration, or its seats could not be recovered.
	ReasonGPUsFenced = "GPUsFenced"
	// ReasonMPSDaemonRestarted (Warning): the MPS control daemon of a
	// group in use ended; it was started again.
	ReasonMPSDaemonRestarted = "MPSDaemonRestarted"
	// ReasonNoMIGGeometry (Warning): a GPU the configuration gives to a
	// MIG profile has no MIG geometry (no MIG, or NVML would not give
	// it); it publishes no MIG device.
	ReasonNoMIGGeometry = "NoMIGGeometry"
	// ReasonMIGInstanceGone (Warning, on the Node and the claim): the MIG
	// instance of a held claim's device is gone (destroyed outside the
	// plugin, or taken by a GPU reset); the device is tainted until the
	// claim is released or its next prepare makes the instance again.
	ReasonMIGInstanceGone = "MIGInstanceGone"
	// ReasonMIGInstanceMadeAgain (Normal, on the Node and the claim): a
	// prepare of the claim made its gone MIG instance again; the taint is
	// removed.
	ReasonMIGInstanceMadeAgain = "MIGInstanceMadeAgain"
)

// nodeGetTimeout bounds the read of the Node object at start: the events
// name the node with its UID where it can be had, without it otherwise.
const nodeGetTimeout = 5 * time.Second

// Recorder records events on one node. A nil Recorder only logs.
type Recorder struct {
	broadcaster events.EventBroadcaster
	recorder    events.EventRecorder
	node        *corev1.ObjectReference

	mu     sync.Mutex
	warned map[string]bool
	// claimEvents are when each claim event was last recorded, and
	// claimLimiter bounds their rate (Claim).
	claimEvents  map[string]time.Time
	claimLimiter *rate.Limiter
}

// Start starts recording events on node nodeName through client until
// Shutdown.
func Start(ctx context.Context, client kubernetes.Interface, nodeName, component string) *Recorder {
	ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: nodeName}
	getCtx, cancel := context.WithTimeout(ctx, nodeGetTimeout)
	defer cancel()
	if node, err := client.CoreV1().Nodes().Get(getCtx, nodeName, metav1.GetOptions{}); err == nil {
		ref.UID = node.UID
	} else {
		klog.FromContext(ctx).V(2).Info("Cannot read the Node object; events will name it without its UID", "err", err)
	}
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	b.StartRecordingToSink(ctx.Done())
	return &Recorder{broadcaster: b, recorder: b.NewRecorder(scheme.Scheme, component), node: ref, warned: map[string]bool{},
		claimEvents: map[string]time.Time{}, claimLimiter: rate.NewLimiter(claimEventsPerSecond, claimEventBurst)}
}

// Shutdown stops recording; events not yet sent may be lost.
func (r *Recorder) Shutdown() {
	if r != nil {
		r.broadcaster.Shutdown()
	}
}

// Normal logs note and records it as a Normal event with reason.
func (r *Recorder) Normal(ctx context.Context, reason, note string) {
	r.record(ctx, corev1.EventTypeNormal, reason, note)
}

// Warning logs note and records it as a Warning event with reason.
func (r *Recorder) Warning(ctx context.Context, reason, note string) {
	r.record(ctx, corev1.EventTypeWarning, reason, note)
}

// WarningOnce is Warning the first time a note is seen: for conditions
// that each retry would report again.
func (r *Recorder) WarningOnce(ctx context.Context, reason, note string) {
	if r != nil {
		r.mu.Lock()
		seen := r.warned[note]
		r.warned[note] = true
		r.mu.Unlock()
		if seen {
			return
		}
	}
	r.Warning(ctx, reason, note)
}

func (r *Recorder) record(ctx context.Context, eventType, reason, note string) {
	// A warning is logged as every warning of the plugin is: an Info line
	// whose "warning" key says what is wrong.
	logger := klog.FromContext(ctx)
	if eventType == corev1.EventTypeWarning {
		logger.Info("Node event", "type", eventType, "reason", reason, "warning", note)
	} else {
		logger.Info("Node event", "type", eventType, "reason", reason, "note", note)
	}
	if r == nil {
		return
	}
	r.recorder.Eventf(r.node, nil, eventType, reason, reason, "%s", note)
}
