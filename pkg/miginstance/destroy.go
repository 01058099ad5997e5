package miginstance

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// migMode checks that the GPU is in MIG mode, and switches it on where
// that takes no reset (the plan gave the GPU to a MIG profile, which is
// why w exists).
func (g gpu) migMode(ctx context.Context, w Want) error {
	current, pending, ret := g.dev.GetMigMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %d: read its MIG mode: %w", w.GPU, callErr("GetMigMode", ret))
	}
	if current == nvml.DEVICE_MIG_ENABLE {
		return nil
	}
	if mig.ModeChangeNeedsReset(w.Architecture) {
		if pending == nvml.DEVICE_MIG_ENABLE {
			return fmt.Errorf("GPU %d (%s) is not in MIG mode yet: MIG mode is pending and takes effect at the GPU's next reset; drain the GPU and run `nvidia-smi -i %d --gpu-reset` (or reboot the node)", w.GPU, w.Architecture, w.GPU)
		}
		return fmt.Errorf("GPU %d (%s) is not in MIG mode, and on %s GPUs turning it on needs a GPU reset with no process on the GPU, which the plugin does not do: drain the GPU, then run `nvidia-smi -i %d -mig 1` and `nvidia-smi -i %d --gpu-reset` (or reboot the node; the mode persists)",
			w.GPU, w.Architecture, w.Architecture, w.GPU, w.GPU)
	}
	if g.step("SetMigMode") {
		return errCrashed
	}
	activation, ret := g.dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %d: turn MIG mode on: %w", w.GPU, callErr("SetMigMode", ret))
	}
	if activation != nvml.SUCCESS {
		return fmt.Errorf("GPU %d: turn MIG mode on: %w", w.GPU, callErr("SetMigMode (activation)", activation))
	}
	klog.FromContext(ctx).Info("Turned MIG mode on", "gpu", w.GPU, "architecture", w.Architecture)
	return nil
}

// state is what is left of a Created record's instance.
type state int

const (
	// whole: the GPU instance and the compute instance, whose MIG device
	// has the recorded UUID.
	whole state = iota
	// partial: the GPU instance without the recorded compute instance (a
	// crash between the two Destroy calls).
	partial
	// vanished: no GPU instance of the record's profile at its placement
	// under its ID (a reboot or a GPU reset took it), or one whose
	// compute instance is another MIG device: not the record's.
	vanished
)

// recordedGI finds the GPU instance a record names by ID, if it is still
// of the record's profile at its placement.
func recordedGI(dev nvml.Device, r Record) (nvml.GpuInstance, bool, error) {
	gi, ret := dev.GetGpuInstanceById(r.GI)
	if gone(ret) || ret == nvml.ERROR_NOT_SUPPORTED {
		// NOT_SUPPORTED: MIG mode is off, so no instance exists.
		return nil, false, nil
	}
	if ret != nvml.SUCCESS {
		return nil, false, callErr("GetGpuInstanceById", ret)
	}
	info, ret := gi.GetInfo()
	if gone(ret) {
		return nil, false, nil
	}
	if ret != nvml.SUCCESS {
		return nil, false, callErr("GpuInstance.GetInfo", ret)
	}
	if int(info.ProfileId) != r.ProfileID || int(info.Placement.Start) != r.Start || int(info.Placement.Size) != r.Size {
		return nil, false, nil
	}
	return gi, true, nil
}

// destroy destroys the instance r records, or what a crash left of it,
// by the rules at the top of journal.go; an Adopted record's instance is
// never destroyed.
func (g gpu) destroy(ctx context.Context, r Record) error {
	switch r.Phase {
	case Adopted:
		return nil // not the plugin's to destroy
	case Created:
		return g.destroyMade(ctx, r)
	}
	return g.rollBack(ctx, r)
}

// destroyMade destroys a Created record's instance: its compute instance,
// then its GPU instance, unless the GPU instance holds a compute instance
// the record does not name (someone else's, made in it since), or is not
// the record's any more.
func (g gpu) destroyMade(ctx context.Context, r Record) error {
	if g.step("find GPU instance") {
		return errCrashed
	}
	st, gi, err := g.check(r)
	if err != nil || st == vanished {
		return err
	}
	if st == whole {
		ci, ret := gi.GetComputeInstanceById(r.CI)
		if ret != nvml.SUCCESS && !gone(ret) {
			return callErr("GpuInstance.GetComputeInstanceById", ret)
		}
		if ret == nvml.SUCCESS {
			if g.step("ComputeInstance.Destroy") {
				return errCrashed
			}
			if ret := ci.Destroy(); ret != nvml.SUCCESS && !gone(ret) {
				return callErr("ComputeInstance.Destroy", ret)
			}
		}
	}
	return g.destroyBareGI(ctx, gi, r)
}

// destroyBareGI destroys a GPU instance of r's that holds no compute
// instance; one that holds any is left as it is.
func (g gpu) destroyBareGI(ctx context.Context, gi nvml.GpuInstance, r Record) error {
	cis, err := computeInstances(gi)
	if err != nil {
		return err
	}
	if len(cis) > 0 {
		klog.FromContext(ctx).Info("Leaving a GPU instance at a MIG record's placement: it holds compute instances the plugin did not make", "instance", r.String(), "computeInstances", len(cis))
		return nil
	}
	if g.step("GpuInstance.Destroy") {
		return errCrashed
	}
	switch ret := gi.Destroy(); {
	case ret == nvml.SUCCESS || gone(ret):
		klog.FromContext(ctx).V(2).Info("Destroyed MIG instance", "instance", r.String())
		return nil
	case ret == nvml.ERROR_IN_USE:
		return fmt.Errorf("GPU %d: the GPU instance at %s holds compute instances the plugin did not make; it is left as it is: %w", r.GPU, r.Placement(), callErr("GpuInstance.Destroy", ret))
	default:
		return callErr("GpuInstance.Destroy", ret)
	}
}

// halfMadeGI finds the GPU instance a half-made record's step may have
// made: the recorded one once the record names it, else the one of its
// profile at its placement.
func (g gpu) halfMadeGI(r Record) (nvml.GpuInstance, bool, error) {
	if r.Phase != GIIntended {
		return recordedGI(g.dev, r)
	}
	info, err := giProfileInfo(g.dev, r.ProfileIndex, r.ProfileID, r.Profile)
	if err != nil {
		return nil, false, err
	}
	gi, _, found, err := instanceAt(g.dev, &info, r.Placement())
	if IsReturn(err, nvml.ERROR_NOT_SUPPORTED) {
		return nil, false, nil // MIG mode off: nothing was made
	}
	return gi, found, err
}

// wholeCI is the compute instance of gi that spans it, where it holds
// that one alone: the one instance a CIIntended record's step makes.
func wholeCI(dev nvml.Device, gi nvml.GpuInstance, r Record) (nvml.ComputeInstanceInfo, bool, error) {
	cis, err := computeInstances(gi)
	if err != nil || len(cis) != 1 {
		return nvml.ComputeInstanceInfo{}, false, err
	}
	info, err := giProfileInfo(dev, r.ProfileIndex, r.ProfileID, r.Profile)
	if err != nil {
		return nvml.ComputeInstanceInfo{}, false, err
	}
	return cis[0], cis[0].Placement.Size == info.SliceCount, nil
}

// rollBack destroys what a half-made record's interrupted step left: a
// GPU instance with no compute instance, or, after CIIntended, one with
// the one compute instance that spans it. A GPU instance holding anything
// else is left as it is: the step cannot have made it.
func (g gpu) rollBack(ctx context.Context, r Record) error {
	if g.step("find GPU instance") {
		return errCrashed
	}
	gi, found, err := g.halfMadeGI(r)
	if err != nil || !found {
		return err
	}
	if r.Phase == CIIntended {
		ci, ok, err := wholeCI(g.dev, gi, r)
		if err != nil {
			return err
		}
		if ok {
			handle, ret := gi.GetComputeInstanceById(int(ci.Id))
			if ret != nvml.SUCCESS && !gone(ret) {
				return callErr("GpuInstance.GetComputeInstanceById", ret)
			}
			if ret == nvml.SUCCESS {
				if g.step("ComputeInstance.Destroy") {
					return errCrashed
				}
				if ret := handle.Destroy(); ret != nvml.SUCCESS && !gone(ret) {
					return callErr("ComputeInstance.Destroy", ret)
				}
			}
		}
	}
	return g.destroyBareGI(ctx, gi, r)
}

// complete reads, for a CIIntended or GIMade record, the instance its
// step made whole (the GPU instance holding the one compute instance
// that spans it) and returns the record Created; false where there is
// none.
func (g gpu) complete(r Record) (Record, bool, error) {
	if r.Phase != CIIntended && r.Phase != GIMade {
		return r, false, nil
	}
	gi, found, err := recordedGI(g.dev, r)
	if err != nil || !found {
		return r, false, err
	}
	ci, ok, err := wholeCI(g.dev, gi, r)
	if err != nil || !ok {
		return r, false, err
	}
	uuid, err := migDeviceUUID(g.dev, r.GI, int(ci.Id))
	if err != nil {
		return r, false, err
	}
	r.Phase, r.CI, r.UUID = Created, int(ci.Id), uuid
	return r, true, nil
}

// Destroy destroys the instances made for a claim and forgets them, and
// forgets those it adopted, which stay. An instance already gone is no
// error: a second call does nothing.
func (m *Manager) Destroy(ctx context.Context, claim types.UID) error {
	records, unlock, err := m.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	keep := records[:0:0]
	var errs []error
	for _, r := range records {
		if r.Claim != claim {
			keep = append(keep, r)
			continue
		}
		if r.Phase == Adopted {
			klog.FromContext(ctx).V(2).Info("Released adopted MIG instance; it stays", "instance", r.String())
			continue
		}
		if err := m.destroyRecord(ctx, r); errors.Is(err, errCrashed) {
			return err
		} else if err != nil {
			errs = append(errs, fmt.Errorf("destroy MIG instance %s: %w", r, err))
			keep = append(keep, r)
		}
	}
	if len(keep) != len(records) {
		if err := m.save("forget destroyed", keep); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) destroyRecord(ctx context.Context, r Record) error {
	g, err := m.gpu(r.GPU)
	if err != nil {
		return err
	}
	return g.destroy(ctx, r)
}

// Prepared says which claims hold their seats; known is false where that
// cannot be told (the seat checkpoint is lost), and then no made instance
// is destroyed.
type Prepared func() (claims map[types.UID]bool, known bool)

// Reconcile settles what a crash or a lost unprepare left. Half-made
// instances are rolled back (journal.go says what of them); made
// instances whose claim is not prepared any more are destroyed; records
// whose instance is gone are forgotten, to be made again at the claim's
// next prepare. Adopted instances are never destroyed: their records are
// forgotten once their claim is released or the instance is gone. No
// instance that no record names is touched (see Partitions).
func (m *Manager) Reconcile(ctx context.Context, prepared Prepared) error {
	logger := klog.FromContext(ctx)
	records, unlock, err := m.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	held, known := prepared()
	keep := records[:0:0]
	var errs []error
	for _, r := range records {
		var drop bool
		switch {
		case r.Phase == Adopted:
			var err error
			if drop, err = m.settleAdopted(ctx, r, known && !held[r.Claim]); err != nil {
				errs = append(errs, err)
			}
		case !r.Phase.Made(), known && !held[r.Claim]:
			err := m.destroyRecord(ctx, r)
			if errors.Is(err, errCrashed) {
				return err
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("destroy MIG instance %s: %w", r, err))
				break
			}
			if r.Phase.Made() {
				logger.Info("Destroyed a MIG instance no prepared claim holds", "instance", r.String())
			} else {
				logger.Info("Rolled back a half-made MIG instance", "instance", r.String())
			}
			drop = true
		default:
			var err error
			if drop, err = m.settleHeld(ctx, r); errors.Is(err, errCrashed) {
				return err
			} else if err != nil {
				errs = append(errs, err)
			}
		}
		if !drop {
			keep = append(keep, r)
		}
	}
	if len(keep) != len(records) {
		if err := m.save("forget reconciled", keep); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// isWhole says whether a made record's instance is whole on its GPU
// (gpu.check), and returns the GPU for what is done next.
func (m *Manager) isWhole(r Record) (gpu, bool, error) {
	g, err := m.gpu(r.GPU)
	if err != nil {
		return gpu{}, false, err
	}
	st, _, err := g.check(r)
	if err != nil {
		return g, false, fmt.Errorf("check MIG instance %s: %w", r, err)
	}
	return g, st == whole, nil
}

// settleHeld says whether the record of a made instance that a prepared
// claim holds is to be forgotten: its instance is no longer whole, and
// what is left of it (a GPU instance whose compute instance went) is
// destroyed; the claim's next prepare makes the instance again.
func (m *Manager) settleHeld(ctx context.Context, r Record) (bool, error) {
	g, ok, err := m.isWhole(r)
	if err != nil || ok {
		return false, err
	}
	if err := g.destroy(ctx, r); err != nil {
		if errors.Is(err, errCrashed) {
			return false, err
		}
		return false, fmt.Errorf("destroy what is left of MIG instance %s: %w", r, err)
	}
	klog.FromContext(ctx).Info("A MIG instance the journal records is gone; the claim's next prepare makes it again", "instance", r.String())
	return true, nil
}

// settleAdopted says whether an Adopted record is to be forgotten: its
// claim is released, or its instance is gone or no longer the record's.
// The instance itself stays whatever the answer.
func (m *Manager) settleAdopted(ctx context.Context, r Record, released bool) (bool, error) {
	logger := klog.FromContext(ctx)
	if released {
		logger.Info("Released an adopted MIG instance no prepared claim holds; it stays", "instance", r.String())
		return true, nil
	}
	if _, ok, err := m.isWhole(r); err != nil || ok {
		return false, err
	}
	logger.Info("An adopted MIG instance is gone or changed; its record is forgotten and what is left stays", "instance", r.String())
	return true, nil
}
