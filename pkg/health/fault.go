package health

import "time"

// Kind is what made a GPU unhealthy.
type Kind string

const (
	// KindXID is a critical XID error event.
	KindXID Kind = "xid"
	// KindECC is a double-bit (uncorrectable) ECC error event.
	KindECC Kind = "ecc"
	// KindUnreachable is an NVML probe that failed with an error other than
	// "GPU is lost": the GPU may come back (after a reset, for example).
	KindUnreachable Kind = "unreachable"
	// KindLost is a GPU that fell off the bus (ERROR_GPU_IS_LOST, or a
	// GPU-unavailable event). It stays unhealthy until the plugin restarts:
	// a lost GPU needs a reset or a reboot, and NVML handles taken before
	// do not come back.
	KindLost Kind = "lost"
	// KindRecoveryAction is a GPU whose driver asks for a recovery action
	// (a reset, a reboot, a drain) with no XID seen here: one that came
	// before the plugin started, or whose event was missed.
	KindRecoveryAction Kind = "recovery_action"
)

// Fault is why a GPU is unhealthy.
type Fault struct {
	Kind Kind
	// XID is the XID of a KindXID fault.
	XID uint64
	// Reason is a short code that is also a valid label value (the device
	// taint's value): xid-79, double-bit-ecc, unreachable, gpu-lost.
	Reason string
	// Message says what happened, for people: the health stream, events
	// and logs.
	Message string
	// Since is when the GPU became unhealthy.
	Since time.Time
}

// Permanent reports whether the fault never recovers while the plugin runs.
func (f Fault) Permanent() bool { return f.Kind == KindLost }

// Memory reports whether the fault is in the GPU's memory: a double-bit
// ECC error event, or an XID that reports one (memoryXIDs). A MIG
// instance's memory fault reaches every placement that shares one of its
// memory slices (Instance.Reaches).
func (f Fault) Memory() bool {
	return f.Kind == KindECC || f.Kind == KindXID && memoryXIDs[f.XID]
}

// gpuState is one unhealthy GPU. A healthy GPU has none.
type gpuState struct {
	fault Fault
	// quietSince is the last time something went wrong with the GPU: the
	// fault, a later event, a failed probe. Recovery counts from here.
	// Zero: only the driver's recovery action holds it.
	quietSince time.Time
	// held: the driver asks for a recovery action (recovery.go); the GPU
	// does not recover before it asks for none.
	held bool
}

// tracker is the health state machine of a node's GPUs:
//
//	healthy --critical event / failed probe--> unhealthy
//	unhealthy --new event / failed probe--> unhealthy, recovery clock restarts
//	unhealthy --successful probe, quiet for the recovery period--> healthy
//	any --lost--> lost (terminal until restart)
//	any --driver asks for a recovery action--> unhealthy, held
//	held --driver asks for none, or stops reporting actions--> recovers at
//	                               the next successful probe, if the rules
//	                               above let it
//
// A GPU the driver's recovery action alone made unhealthy has no recovery
// clock: it recovers at the first successful probe once the driver asks
// for nothing.
//
// It is pure: every input carries its time, and it reports whether the set
// of unhealthy GPUs changed, so that the monitor around it decides about
// locking, logging and notification.
//
// K is what is watched: a GPU by index, or a MIG instance.
type tracker[K comparable] struct {
	recovery time.Duration
	gpus     map[K]*gpuState
}

func newTracker[K comparable](recovery time.Duration) *tracker[K] {
	return &tracker[K]{recovery: recovery, gpus: map[K]*gpuState{}}
}

// transition is a change of one GPU's (or instance's) health.
type transition[K comparable] struct {
	gpu K
	// fault is the new fault; nil when the GPU became healthy.
	fault *Fault
	// previous is the fault it had before; nil when it was healthy.
	previous *Fault
}

// fail records that something went wrong with a GPU at now. A healthy GPU
// becomes unhealthy with f; an unhealthy one keeps its first fault (the
// cause an operator looks for) and restarts its recovery clock, unless f is
// a loss, which replaces any fault because it never recovers.
func (t *tracker[K]) fail(gpu K, f Fault, now time.Time) *transition[K] {
	f.Since = now
	st, bad := t.gpus[gpu]
	switch {
	case !bad:
		t.gpus[gpu] = &gpuState{fault: f, quietSince: now}
		return &transition[K]{gpu: gpu, fault: &f}
	case st.fault.Permanent():
		return nil
	case f.Permanent():
		prev := st.fault
		st.fault, st.quietSince = f, now
		return &transition[K]{gpu: gpu, fault: &f, previous: &prev}
	default:
		st.quietSince = now
		return nil
	}
}

// hold records at now that the driver asks for a recovery action for a
// GPU: a healthy GPU becomes unhealthy with f, an unhealthy one keeps its
// first fault; either is held until release. A fault that is the
// driver's recovery action alone is not a cause but what the driver asks
// for, so it follows the action: a GPU whose driver asked for a reset and
// now asks for a node reboot says so (since its first request), or its
// operator resets it again, which cannot clear it.
func (t *tracker[K]) hold(gpu K, f Fault, now time.Time) *transition[K] {
	st, bad := t.gpus[gpu]
	switch {
	case !bad:
		f.Since = now
		t.gpus[gpu] = &gpuState{fault: f, held: true}
		return &transition[K]{gpu: gpu, fault: &f}
	case st.fault.Permanent():
		return nil
	case st.fault.Kind == KindRecoveryAction && f.Kind == KindRecoveryAction && st.fault.Reason != f.Reason:
		prev := st.fault
		f.Since = prev.Since
		st.fault, st.held = f, true
		return &transition[K]{gpu: gpu, fault: &f, previous: &prev}
	default:
		st.held = true
		return nil
	}
}

// release records that the driver asks for no recovery action for a GPU
// any more; succeed decides when it is healthy again.
func (t *tracker[K]) release(gpu K) {
	if st, bad := t.gpus[gpu]; bad {
		st.held = false
	}
}

// succeed records a successful probe of a GPU at now: an unhealthy GPU
// that has been quiet for the recovery period, and that the driver's
// recovery action does not hold, is healthy again.
func (t *tracker[K]) succeed(gpu K, now time.Time) *transition[K] {
	st, bad := t.gpus[gpu]
	if !bad || st.fault.Permanent() || st.held || (!st.quietSince.IsZero() && now.Sub(st.quietSince) < t.recovery) {
		return nil
	}
	delete(t.gpus, gpu)
	prev := st.fault
	return &transition[K]{gpu: gpu, previous: &prev}
}

// lost reports whether a GPU is lost (and need not be probed any more).
func (t *tracker[K]) lost(gpu K) bool {
	st, bad := t.gpus[gpu]
	return bad && st.fault.Permanent()
}

// faults are the faults of the unhealthy GPUs.
func (t *tracker[K]) faults() map[K]Fault {
	out := make(map[K]Fault, len(t.gpus))
	for gpu, st := range t.gpus {
		out[gpu] = st.fault
	}
	return out
}
