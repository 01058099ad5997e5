package health

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// DefaultIgnoredXIDs returns the XIDs that do not make a GPU unhealthy unless
// the configuration lists them in health.criticalXIDs. NVIDIA's XID catalog
// (docs.nvidia.com/deploy/xid-errors) gives every XID its possible causes;
// these are the ones whose usual cause is the application that ran on the
// GPU, or whose damage the driver contained to that application. Tainting a
// GPU for them punishes every later tenant for one program's bug.
//
// Application faults (the catalog's "User App Error"), the same list as
// NVIDIA's device plugin:
//
//	13  Graphics Engine Exception: an out-of-range access or illegal
//	    instruction in a kernel; the CUDA context is torn down.
//	31  GPU memory page fault: the application touched an address it does
//	    not own.
//	43  GPU stopped processing: the driver reset the application's channel
//	    (the application hit a fault or was killed).
//	45  Preemptive cleanup, due to previous errors: the driver cleaning up a
//	    context after an earlier error or after the process was killed; a
//	    real hardware error shows up as its own XID first.
//	68  Video processor (NVDEC) exception: a malformed stream in a decoder
//	    session.
//	109 Context switch timeout: most often a kernel that never yields; the
//	    catalog also lists hardware and driver causes, so a site that sees it
//	    repeat on one GPU should move it to health.criticalXIDs.
//
// Contained errors:
//
//	94  Contained ECC error: an uncorrectable ECC error that the GPU
//	    contained to the application using the memory (that application is
//	    stopped, the others keep running) and that row remapping will repair
//	    at the next GPU reset. Compare 95, an uncontained ECC error that
//	    needs a reset now: it stays critical. NVIDIA's device plugin gets
//	    this one backwards (NVIDIA/k8s-device-plugin#1974).
//
// Every other XID marks the GPU unhealthy, among them 48 (double-bit ECC),
// 63/64 (row remapping recorded/failed), 74 (NVLink error), 79 (fallen off
// the bus), 92 (high single-bit ECC rate), 95 (uncontained ECC), 119/120
// (GSP timeout/error) and XIDs newer than this list. An XID that turns out
// to be harmless for a workload costs one recovery period per occurrence;
// a harmful one that was ignored would cost a workload.
func DefaultIgnoredXIDs() []uint64 { return []uint64{13, 31, 43, 45, 68, 94, 109} }

// memoryXIDs are the XIDs that report a fault of the GPU's memory itself:
// uncorrectable or too many corrected ECC errors, and rows the GPU marked
// for remapping or could not remap. Reported for a MIG instance, the
// fault is in the memory slices it holds, which every instance made at a
// placement that shares one of them gets again; every other XID is the
// instance's own (its engines, its contexts) and goes with it.
//
//	48  double-bit ECC error
//	63  ECC row remapping (page retirement) recorded
//	64  ECC row remapping (page retirement) failed
//	92  high single-bit ECC error rate
//	94  contained ECC error (ignored by default)
//	95  uncontained ECC error
//
// XID 31, a GPU memory page fault, is not among them: it is an address
// the application does not own, not a fault of the memory.
var memoryXIDs = map[uint64]bool{48: true, 63: true, 64: true, 92: true, 94: true, 95: true}

// xidNames are short descriptions of the XIDs that users meet most, for
// messages; the XID number is always given as well.
var xidNames = map[uint64]string{
	13:  "graphics engine exception",
	31:  "GPU memory page fault",
	43:  "GPU stopped processing",
	45:  "preemptive cleanup",
	48:  "double-bit ECC error",
	61:  "internal micro-controller breakpoint",
	62:  "internal micro-controller halt",
	63:  "ECC row remapping recorded",
	64:  "ECC row remapping failed",
	68:  "video processor exception",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	109: "context switch timeout",
	119: "GSP RPC timeout",
	120: "GSP error",
}

// XIDPolicy decides which XIDs make a GPU unhealthy.
type XIDPolicy struct {
	ignored map[uint64]bool
}

// NewXIDPolicy starts from DefaultIgnoredXIDs(), adds ignored and removes
// critical. A number in both is an error (the configuration's validation
// refuses it too).
func NewXIDPolicy(ignored, critical []int) (XIDPolicy, error) {
	p := XIDPolicy{ignored: map[uint64]bool{}}
	for _, x := range DefaultIgnoredXIDs() {
		p.ignored[x] = true
	}
	for _, x := range ignored {
		if x <= 0 {
			return XIDPolicy{}, fmt.Errorf("ignored XID %d: an XID is a positive number", x)
		}
		if slices.Contains(critical, x) {
			return XIDPolicy{}, fmt.Errorf("XID %d is both ignored and critical", x)
		}
		p.ignored[uint64(x)] = true
	}
	for _, x := range critical {
		if x <= 0 {
			return XIDPolicy{}, fmt.Errorf("critical XID %d: an XID is a positive number", x)
		}
		delete(p.ignored, uint64(x))
	}
	return p, nil
}

// Critical reports whether an XID makes a GPU unhealthy.
func (p XIDPolicy) Critical(xid uint64) bool { return !p.ignored[xid] }

// Ignored lists the ignored XIDs in ascending order.
func (p XIDPolicy) Ignored() []uint64 {
	out := make([]uint64, 0, len(p.ignored))
	for x := range p.ignored {
		out = append(out, x)
	}
	slices.Sort(out)
	return out
}

// String lists the ignored XIDs, for the start-up log.
func (p XIDPolicy) String() string {
	var parts []string
	for _, x := range p.Ignored() {
		parts = append(parts, strconv.FormatUint(x, 10))
	}
	return strings.Join(parts, ",")
}

// describeXID is "XID 79 (GPU has fallen off the bus)", or "XID 150"
// for one without a known name.
func describeXID(xid uint64) string {
	if name, ok := xidNames[xid]; ok {
		return fmt.Sprintf("XID %d (%s)", xid, name)
	}
	return fmt.Sprintf("XID %d", xid)
}
