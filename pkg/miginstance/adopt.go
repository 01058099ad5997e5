package miginstance

// Static partitions: GPU instances that exist when the plugin starts and
// that no record names (an administrator's, nvidia-smi's, another tool's)
// are never destroyed. Partitions lists them, with whether each is whole
// (one compute instance spanning it, the only kind a seat can be); the
// plugin publishes those of a GPU's configured MIG profile as static seats
// and withdraws what the others make impossible. A claim allocated a
// static seat adopts its instance:
//
//	(none) --find the instance at the placement, its one full-size compute
//	         instance, its MIG device's UUID-->
//	       --journal "Adopted" (GI, CI, UUID)--> adopted
//	adopted --drop the record--> (none), the instance left as it is
//
// Adoption changes nothing on the GPU, so a crash before the record leaves
// the instance as foreign as it was, and one after it a record that the
// claim's retried prepare uses, or that Reconcile forgets once the claim is
// released. No path destroys an Adopted record's instance.

import (
	"context"
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// Partition is a GPU instance the plugin did not make.
type Partition struct {
	GPU int
	// GI is the GPU instance's ID, ProfileID its NVML profile ID.
	GI        int
	ProfileID int
	Placement mig.Placement
	// ComputeInstances is how many compute instances it holds; Whole says
	// it holds exactly one, spanning it.
	ComputeInstances int
	Whole            bool
	// Claim is the claim that adopted it, empty where none did.
	Claim types.UID
}

func (p Partition) String() string {
	return fmt.Sprintf("GPU %d instance %d (profile ID %d) at %s with %d compute instances", p.GPU, p.GI, p.ProfileID, p.Placement, p.ComputeInstances)
}

// Partitions lists the GPU instances on gpus that the plugin did not make:
// those no record names, and those adopted by a claim.
func (m *Manager) Partitions(ctx context.Context, gpus []int) ([]Partition, error) {
	records, unlock, err := m.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var out []Partition
	for _, i := range gpus {
		g, err := m.gpu(i)
		if err != nil {
			return nil, err
		}
		parts, err := g.partitions(i, records)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: list its MIG instances: %w", i, err)
		}
		out = append(out, parts...)
	}
	return out, nil
}

// partitions lists the GPU instances of GPU index that the plugin did
// not make (Partitions).
func (g gpu) partitions(index int, records []Record) ([]Partition, error) {
	gis, err := gpuInstances(g.dev)
	if err != nil {
		return nil, err
	}
	var out []Partition
	for _, inst := range gis {
		p := Partition{GPU: index, GI: int(inst.info.Id), ProfileID: int(inst.info.ProfileId),
			Placement: mig.Placement{Start: int(inst.info.Placement.Start), Size: int(inst.info.Placement.Size)}}
		if i := recordAt(records, index, p.Placement); i >= 0 {
			if records[i].Phase != Adopted {
				continue // made by the plugin
			}
			p.Claim = records[i].Claim
		}
		cis, err := computeInstances(inst.gi)
		if err != nil {
			return nil, fmt.Errorf("GPU instance %d: %w", p.GI, err)
		}
		p.ComputeInstances = len(cis)
		p.Whole = len(cis) == 1 && cis[0].Placement.Size == inst.profile.SliceCount
		out = append(out, p)
	}
	return out, nil
}

// recordAt is the record of an instance on gpu at pl, -1 where none.
func recordAt(records []Record, gpu int, pl mig.Placement) int {
	return slices.IndexFunc(records, func(r Record) bool { return r.GPU == gpu && r.Placement() == pl })
}

// computeInstances are gi's compute instances, of every profile.
func computeInstances(gi nvml.GpuInstance) ([]nvml.ComputeInstanceInfo, error) {
	var out []nvml.ComputeInstanceInfo
	for index := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // a profile this GPU instance does not have
		}
		if ret != nvml.SUCCESS {
			return nil, callErr("GpuInstance.GetComputeInstanceProfileInfo", ret)
		}
		cis, ret := gi.GetComputeInstances(&ciInfo)
		if ret != nvml.SUCCESS {
			return nil, callErr("GpuInstance.GetComputeInstances", ret)
		}
		for _, ci := range cis {
			cInfo, ret := ci.GetInfo()
			if gone(ret) {
				continue
			}
			if ret != nvml.SUCCESS {
				return nil, callErr("ComputeInstance.GetInfo", ret)
			}
			out = append(out, cInfo)
		}
	}
	return out, nil
}

// adopt records the instance at w's placement as w's claim's, where it is
// a static seat: of w's profile, holding one compute instance that spans
// it, named by no record. found is false where no instance of w's profile
// is at the placement (removed since the plugin started): the caller
// makes one as for any seat.
func (m *Manager) adopt(ctx context.Context, dev nvml.Device, w Want, records []Record) (inst Instance, found bool, err error) {
	if m.step("find static instance") {
		return Instance{}, true, errCrashed
	}
	info, err := giProfileInfo(dev, w.Profile.Index, w.Profile.ID, w.Profile.Name)
	if err != nil {
		return Instance{}, true, fmt.Errorf("GPU %d: %w", w.GPU, err)
	}
	gi, gInfo, found, err := instanceAt(dev, &info, w.Placement)
	if IsReturn(err, nvml.ERROR_NOT_SUPPORTED) || err == nil && !found {
		return Instance{}, false, nil // MIG mode off, or no instance there
	}
	if err != nil {
		return Instance{}, true, fmt.Errorf("GPU %d: %w", w.GPU, err)
	}
	if i := recordAt(records, w.GPU, w.Placement); i >= 0 {
		return Instance{}, true, fmt.Errorf("GPU %d: the MIG %s instance at %s is %s's: %w",
			w.GPU, w.Profile.Name, w.Placement, records[i], callErr("adopt", nvml.ERROR_INSUFFICIENT_RESOURCES))
	}
	cis, err := computeInstances(gi)
	if err != nil {
		return Instance{}, true, fmt.Errorf("GPU %d: GPU instance %d: %w", w.GPU, gInfo.Id, err)
	}
	if len(cis) != 1 || cis[0].Placement.Size != info.SliceCount {
		return Instance{}, true, fmt.Errorf("GPU %d: the MIG %s instance at %s (GPU instance %d) holds %d compute instances, not one that spans it: it is no seat, and it is left as it is",
			w.GPU, w.Profile.Name, w.Placement, gInfo.Id, len(cis))
	}
	if m.step("read static MIG UUID") {
		return Instance{}, true, errCrashed
	}
	uuid, err := migDeviceUUID(dev, int(gInfo.Id), int(cis[0].Id))
	if err != nil {
		return Instance{}, true, fmt.Errorf("GPU %d: %w", w.GPU, err)
	}
	if _, err := m.minors.load(); err != nil {
		return Instance{}, true, err
	}
	r := newRecord(w, Adopted, m.opts.BootID)
	r.GI, r.CI, r.UUID = int(gInfo.Id), int(cis[0].Id), uuid
	if err := m.save("record adopted", append(records, r)); err != nil {
		return Instance{}, true, err
	}
	klog.FromContext(ctx).V(2).Info("Adopted static MIG instance", "instance", r.String())
	inst, err = m.minors.instance(r)
	return inst, true, err
}
