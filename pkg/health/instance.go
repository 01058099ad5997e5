package health

// MIG instances.
//
// On a GPU in MIG mode NVML hands events out on the GPU's own handle (MIG
// device handles cannot be registered) and says in GpuInstanceId which
// GPU instance an event is about, or 0xFFFFFFFF for the whole GPU. An XID
// or ECC error of one instance is that instance's: its engines, its
// memory slices. It makes the instance unhealthy, not the GPU: the seats
// of the GPU's other instances keep scheduling. An event of the whole GPU
// (a GPU fallen off the bus, an XID NVML does not give an instance) makes
// the GPU unhealthy and with it every instance on it.
//
// An instance is watched by the memory slices it holds (its placement),
// which NVML reads for any GPU instance ID, whoever made the instance: a
// published MIG device stands for a profile at a placement, so the
// placement names the devices to taint. An instance destroyed between the
// event and its handling can no longer be found; its event then counts
// for the whole GPU, since the slices it held are not known.
//
// A memory fault (Fault.Memory: an ECC error, a row remapping) is in the
// memory slices the instance holds, not in the instance: an instance made
// next at any placement that shares one of those slices (a 2g at slices
// 4-5 after a faulty 1g at 4) gets the same memory. It reaches the MIG
// devices of every such placement (Instance.Reaches), and every group of
// whole GPUs that holds the instance's GPU (MemoryFaults): once the
// instance is gone, such a group hands out the GPU whole, every memory
// slice of it. Any other fault (an engine's XID, a GSP error naming the
// instance) is the instance's own and reaches the devices at its
// placement only.
//
// An unhealthy instance recovers as a GPU does: once its GPU has answered
// its probes for the recovery period after the instance's last fault.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// noInstance is the instance ID of an event about no MIG instance.
const noInstance = 0xFFFFFFFF

// Instance is a MIG GPU instance: its GPU's index and the memory slices
// it holds.
type Instance struct {
	GPU       int
	Placement mig.Placement
}

func (in Instance) String() string {
	return fmt.Sprintf("GPU %d MIG instance at %s", in.GPU, in.Placement)
}

// InstanceSource is a Source that also tells which MIG instances are
// unhealthy (the Monitor is one).
type InstanceSource interface {
	// InstanceFaults maps every unhealthy MIG instance to its fault.
	InstanceFaults() map[Instance]Fault
}

// InstanceFaults are the unhealthy MIG instances: none without a source,
// or with one that does not tell them.
func (v View) InstanceFaults() map[Instance]Fault {
	if s, ok := v.Source.(InstanceSource); ok {
		return s.InstanceFaults()
	}
	return nil
}

// Reaches reports whether f, a fault of instance in, reaches the MIG
// devices that stand for instance at: those at in's own placement for any
// fault, and for a memory fault those at every placement of in's GPU
// that shares a memory slice with it.
func (in Instance) Reaches(f Fault, at Instance) bool {
	if in == at {
		return true
	}
	return f.Memory() && in.GPU == at.GPU && mig.Overlaps(in.Placement, at.Placement)
}

// Reaching lists the unhealthy instances whose fault reaches the MIG
// devices of at: at itself first, then the others in placement order.
func Reaching(at Instance, instances map[Instance]Fault) []Instance {
	var out []Instance
	for in, f := range instances {
		if in.Reaches(f, at) {
			out = append(out, in)
		}
	}
	slices.SortFunc(out, func(a, b Instance) int {
		if (a == at) != (b == at) {
			if a == at {
				return -1
			}
			return 1
		}
		return compareInstances(a, b)
	})
	return out
}

// MemoryFaults lists the unhealthy instances on gpus whose fault is in
// memory, in GPU and placement order: they reach every group that holds
// one of those GPUs whole.
func MemoryFaults(gpus []int, instances map[Instance]Fault) []Instance {
	var out []Instance
	for in, f := range instances {
		if f.Memory() && slices.Contains(gpus, in.GPU) {
			out = append(out, in)
		}
	}
	slices.SortFunc(out, compareInstances)
	return out
}

// compareInstances orders instances by GPU, then placement.
func compareInstances(a, b Instance) int {
	return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.Placement.Start, b.Placement.Start), cmp.Compare(a.Placement.Size, b.Placement.Size))
}

// OfInstance reports whether the MIG devices of an instance are healthy
// and, if not, why: they are as healthy as their GPU, the instance, and
// the instances whose memory fault reaches them.
func OfInstance(in Instance, gpus map[int]Fault, instances map[Instance]Fault) (bool, string) {
	var msgs []string
	if f, ok := gpus[in.GPU]; ok {
		msgs = append(msgs, fmt.Sprintf("GPU %d: %s", in.GPU, f.Message))
	}
	for _, bad := range Reaching(in, instances) {
		msgs = append(msgs, fmt.Sprintf("%s: %s", bad, instances[bad].Message))
	}
	if len(msgs) == 0 {
		return true, ""
	}
	return false, strings.Join(msgs, "; ")
}

// OfGroup reports whether a group of whole GPUs is healthy and, if not,
// why: it is as healthy as its GPUs and the memory their instances hold
// (MemoryFaults).
func OfGroup(gpus []int, faults map[int]Fault, instances map[Instance]Fault) (bool, string) {
	healthy, msg := OfGPUs(gpus, faults)
	msgs := []string{}
	if !healthy {
		msgs = append(msgs, msg)
	}
	for _, bad := range MemoryFaults(gpus, instances) {
		msgs = append(msgs, fmt.Sprintf("%s: %s", bad, instances[bad].Message))
	}
	if len(msgs) == 0 {
		return true, ""
	}
	return false, strings.Join(msgs, "; ")
}

// instanceOf finds the instance a GPU instance ID names on a GPU. It
// fails where NVML does not know the ID (any more).
func (m *Monitor) instanceOf(ctx context.Context, gpu int, id uint32) (Instance, error) {
	dev := m.device(ctx, gpu)
	if dev == nil {
		return Instance{}, fmt.Errorf("no NVML handle for GPU %d", gpu)
	}
	gi, ret := dev.GetGpuInstanceById(int(id))
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("GPU %d: GPU instance %d: %s", gpu, id, m.opts.NVML.ErrorString(ret))
	}
	info, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return Instance{}, fmt.Errorf("GPU %d: GPU instance %d: get its info: %s", gpu, id, m.opts.NVML.ErrorString(ret))
	}
	return Instance{GPU: gpu, Placement: mig.Placement{Start: int(info.Placement.Start), Size: int(info.Placement.Size)}}, nil
}

// failOn records a fault of the GPU instance an event names, or of the
// whole GPU where it names none or one NVML cannot find.
func (m *Monitor) failOn(ctx context.Context, gpu int, id uint32, f Fault) {
	if id == noInstance {
		m.fail(ctx, gpu, f)
		return
	}
	in, err := m.instanceOf(ctx, gpu, id)
	if err != nil {
		klog.FromContext(ctx).Info("MIG instance of a health event not found; the event counts for its whole GPU", "gpu", gpu, "gpuInstance", id, "reason", f.Reason, "err", err)
		f.Message = fmt.Sprintf("%s (GPU instance %d, not found)", f.Message, id)
		m.fail(ctx, gpu, f)
		return
	}
	f.Message = fmt.Sprintf("%s (GPU instance %d)", f.Message, id)
	m.failInstance(ctx, in, f)
}
