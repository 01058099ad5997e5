package health

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// WatchedEvents are the NVML events that can make a GPU unhealthy, or
// healthy again (a recovery action that changed). Single-bit ECC errors
// are corrected by the hardware and are not watched; a GPU that has too
// many raises XID 92.
const WatchedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeGpuUnavailableError | nvml.EventTypeGpuRecoveryAction

// maxWaitBackoff caps the pause after failed event waits.
const maxWaitBackoff = 30 * time.Second

// handles are the GPUs' NVML handles, by index, taken by UUID (UUIDs
// survive renumbering; indices need not), and what each last answered:
// the events it is registered for, and whether it reports a recovery
// action (recovery.go).
type handles struct {
	lib       nvml.Interface
	inventory *inventory.Inventory

	mu sync.Mutex
	// devices are nil where NVML gave none yet (retried at each probe).
	devices    []nvml.Device
	registered []uint64
	actions    map[int]nvml.Return
}

func newHandles(lib nvml.Interface, inv *inventory.Inventory) *handles {
	n := len(inv.GPUs)
	return &handles{lib: lib, inventory: inv, devices: make([]nvml.Device, n), registered: make([]uint64, n), actions: map[int]nvml.Return{}}
}

// handle returns the NVML handle of a GPU, taking it by UUID if there is
// none yet.
func (h *handles) handle(gpu int) (nvml.Device, nvml.Return) {
	h.mu.Lock()
	dev := h.devices[gpu]
	h.mu.Unlock()
	if dev != nil {
		return dev, nvml.SUCCESS
	}
	dev, ret := h.lib.DeviceGetHandleByUUID(h.inventory.GPUs[gpu].UUID)
	if ret != nvml.SUCCESS {
		return nil, ret
	}
	h.mu.Lock()
	h.devices[gpu] = dev
	h.mu.Unlock()
	return dev, nvml.SUCCESS
}

// indexOf is the index of the GPU whose handle dev is, -1 where it is
// none of them.
func (h *handles) indexOf(dev nvml.Device) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, d := range h.devices {
		if d != nil && d == dev {
			return i
		}
	}
	return -1
}

// setRegistered records the events a GPU is registered for.
func (h *handles) setRegistered(gpu int, mask uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.registered[gpu] = mask
}

// Registered are the event types each GPU was registered for, by GPU
// index: those of WatchedEvents it supports (none where it could not be
// registered).
func (h *handles) Registered() map[int]uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make(map[int]uint64, len(h.registered))
	for gpu, mask := range h.registered {
		out[gpu] = mask
	}
	return out
}

// device returns the NVML handle of a GPU (handles.handle). A GPU that NVML
// cannot hand out is marked unhealthy here.
func (m *Monitor) device(ctx context.Context, gpu int) nvml.Device {
	dev, ret := m.handle(gpu)
	if ret != nvml.SUCCESS {
		m.fail(ctx, gpu, m.probeFault(ret, "DeviceGetHandleByUUID"))
		return nil
	}
	return dev
}

// openEvents creates an event set and registers every GPU for the events
// it supports. A GPU that cannot be registered is still probed.
func (m *Monitor) openEvents(ctx context.Context) (nvml.EventSet, error) {
	logger := klog.FromContext(ctx)
	set, ret := m.opts.NVML.EventSetCreate()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("create an NVML event set: %s", m.opts.NVML.ErrorString(ret))
	}
	registered := 0
	for gpu := range m.devices {
		dev := m.device(ctx, gpu)
		if dev == nil {
			continue
		}
		supported, ret := dev.GetSupportedEventTypes()
		if ret != nvml.SUCCESS {
			logger.Info("GPU does not report its supported events; it is watched by probes only", "gpu", gpu, "warning", m.opts.NVML.ErrorString(ret))
			continue
		}
		mask := supported & WatchedEvents
		if mask == 0 {
			logger.Info("GPU reports none of the health events; it is watched by probes only", "gpu", gpu)
			continue
		}
		if ret := dev.RegisterEvents(mask, set); ret != nvml.SUCCESS {
			logger.Info("Cannot register for the GPU's health events; it is watched by probes only", "gpu", gpu, "warning", m.opts.NVML.ErrorString(ret))
			continue
		}
		m.setRegistered(gpu, mask)
		registered++
	}
	if registered == 0 {
		freeEventSet(ctx, m.opts.NVML, set)
		return nil, fmt.Errorf("no GPU could be registered for health events")
	}
	return set, nil
}

// watchEvents waits for events until ctx ends, then frees the set.
func (m *Monitor) watchEvents(ctx context.Context, set nvml.EventSet) {
	logger := klog.FromContext(ctx)
	defer freeEventSet(ctx, m.opts.NVML, set)
	backoff := time.Second
	for ctx.Err() == nil {
		ev, ret := set.Wait(uint32(m.opts.WaitTimeout.Milliseconds()))
		switch ret {
		case nvml.SUCCESS:
			backoff = time.Second
			m.handleEvent(ctx, ev)
		case nvml.ERROR_TIMEOUT:
			backoff = time.Second
		default:
			// NVIDIA's device plugin marks every GPU unhealthy here, which
			// takes a node down for one failed call. Ask each GPU instead.
			logger.Error(fmt.Errorf("NVML event wait: %s", m.opts.NVML.ErrorString(ret)), "Waiting for NVML events failed; probing every GPU", "retryIn", backoff)
			m.probeAll(ctx)
			select {
			case <-ctx.Done():
			case <-m.clock.After(backoff):
			}
			backoff = min(2*backoff, maxWaitBackoff)
		}
	}
}

// handleEvent turns one NVML event into a fault, or ignores it.
func (m *Monitor) handleEvent(ctx context.Context, ev nvml.EventData) {
	logger := klog.FromContext(ctx)
	gpu, gi, ok := m.gpuOf(ev)
	if !ok {
		logger.Info("NVML event for a device the plugin does not know; probing every GPU", "eventType", ev.EventType, "data", ev.EventData)
		m.probeAll(ctx)
		return
	}
	switch {
	case ev.EventType&nvml.EventTypeXidCriticalError != 0:
		xid := ev.EventData
		f := Fault{Kind: KindXID, XID: xid, Reason: fmt.Sprintf("xid-%d", xid), Message: describeXID(xid)}
		var action nvml.DeviceGpuRecoveryAction
		if dev := m.device(ctx, gpu); dev != nil {
			action, _, _ = m.recoveryAction(ctx, gpu, dev)
		}
		critical := m.policy.Critical(xid)
		if !critical && action == nvml.GPU_RECOVERY_ACTION_NONE {
			m.metrics.count(gpu, kindIgnoredXID)
			logger.V(2).Info("Ignoring an XID that is the application's fault", "gpu", gpu, "gpuInstance", int64(gi), "xid", xid, "message", describeXID(xid))
			return
		}
		if critical {
			m.failOn(ctx, gpu, gi, f)
		}
		if action != nvml.GPU_RECOVERY_ACTION_NONE {
			// The whole GPU, whatever instance the XID names: the driver
			// asks for the GPU's recovery.
			f.Message += "; " + describeAction(action)
			m.hold(ctx, gpu, f)
		}
		// A GPU that fell off the bus answers "lost" at once: find out now
		// rather than at the next probe.
		m.probe(ctx, gpu)
	case ev.EventType&nvml.EventTypeDoubleBitEccError != 0:
		m.failOn(ctx, gpu, gi, Fault{Kind: KindECC, Reason: "double-bit-ecc", Message: "double-bit (uncorrectable) ECC error"})
		m.probe(ctx, gpu)
	case ev.EventType&nvml.EventTypeGpuUnavailableError != 0:
		m.fail(ctx, gpu, Fault{Kind: KindLost, Reason: "gpu-lost", Message: "GPU unavailable (NVML event)"})
	case ev.EventType&nvml.EventTypeGpuRecoveryAction != 0:
		// The probe reads the action the driver asks for now.
		m.probe(ctx, gpu)
	default:
		logger.V(4).Info("Ignoring an NVML event", "gpu", gpu, "eventType", ev.EventType, "data", ev.EventData)
	}
}

// gpuOf finds the GPU an event is about, by handle, else by UUID, and
// the GPU instance it names (noInstance for the whole GPU). NVML hands MIG
// events out on the GPU's handle with the instance's ID; an event on a
// MIG device's own handle is taken as its GPU's, for that instance.
func (m *Monitor) gpuOf(ev nvml.EventData) (int, uint32, bool) {
	dev, gi := ev.Device, ev.GpuInstanceId
	if dev == nil {
		return -1, gi, false
	}
	if i := m.indexOf(dev); i >= 0 {
		return i, gi, true
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return -1, gi, false
	}
	if strings.HasPrefix(uuid, "MIG-") {
		parent, ret := dev.GetDeviceHandleFromMigDeviceHandle()
		if ret != nvml.SUCCESS {
			return -1, gi, false
		}
		if gi == noInstance {
			id, ret := dev.GetGpuInstanceId()
			if ret != nvml.SUCCESS {
				return -1, gi, false
			}
			gi = uint32(id)
		}
		if uuid, ret = parent.GetUUID(); ret != nvml.SUCCESS {
			return -1, gi, false
		}
	}
	for i, g := range m.opts.Inventory.GPUs {
		if strings.EqualFold(g.UUID, uuid) {
			return i, gi, true
		}
	}
	return -1, gi, false
}

// probeLoop probes every GPU at the probe interval until ctx ends.
func (m *Monitor) probeLoop(ctx context.Context) {
	t := m.clock.NewTicker(m.opts.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			m.probeAll(ctx)
		}
	}
}

func (m *Monitor) probeAll(ctx context.Context) {
	for gpu := range m.devices {
		m.probe(ctx, gpu)
	}
}

// probe asks a GPU for its UUID and memory: calls that need the GPU itself
// to answer, not just the driver's cache. A lost GPU is not asked again.
func (m *Monitor) probe(ctx context.Context, gpu int) {
	if m.isLost(gpu) {
		return
	}
	dev := m.device(ctx, gpu)
	if dev == nil {
		return
	}
	want := m.opts.Inventory.GPUs[gpu].UUID
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		m.fail(ctx, gpu, m.probeFault(ret, "GetUUID"))
		return
	}
	if !strings.EqualFold(uuid, want) {
		m.fail(ctx, gpu, Fault{Kind: KindUnreachable, Reason: "unreachable", Message: fmt.Sprintf("NVML handle answers as %s, not %s", uuid, want)})
		return
	}
	if _, ret := dev.GetMemoryInfo(); ret != nvml.SUCCESS && ret != nvml.ERROR_NOT_SUPPORTED {
		m.fail(ctx, gpu, m.probeFault(ret, "GetMemoryInfo"))
		return
	}
	switch action, known, unreported := m.recoveryAction(ctx, gpu, dev); {
	case known && action != nvml.GPU_RECOVERY_ACTION_NONE:
		m.hold(ctx, gpu, Fault{Kind: KindRecoveryAction, Reason: actionReason(action), Message: describeAction(action) + " (NVML GPU recovery action)"})
		return
	case known || unreported:
		m.release(gpu)
	}
	m.succeed(ctx, gpu)
}

// probeFault is the fault of a failed NVML call.
func (m *Monitor) probeFault(ret nvml.Return, call string) Fault {
	msg := fmt.Sprintf("NVML %s: %s", call, m.opts.NVML.ErrorString(ret))
	if ret == nvml.ERROR_GPU_IS_LOST {
		return Fault{Kind: KindLost, Reason: "gpu-lost", Message: msg}
	}
	return Fault{Kind: KindUnreachable, Reason: "unreachable", Message: msg}
}

// freeEventSet frees an NVML event set; a failure leaks the set's memory
// in the driver and is logged.
func freeEventSet(ctx context.Context, lib nvml.Interface, set nvml.EventSet) {
	if ret := set.Free(); ret != nvml.SUCCESS {
		klog.FromContext(ctx).Error(fmt.Errorf("free the NVML event set: %s", lib.ErrorString(ret)), "Cannot free the NVML event set")
	}
}
