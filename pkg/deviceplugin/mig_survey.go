package deviceplugin

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
)

// The MIG seats' placements are fixed at start (migLayout), so an
// instance at a placement a seat overlaps that is not the seat's own makes
// the seat impossible: every Allocate of it would fail, and its pod fail
// admission, each time the kubelet chose it. The shim therefore surveys
// the MIG GPUs once at start, before it serves anything, with the listing
// and journal the DRA plugin's survey uses (package miginstance):
//
//   - The journal is settled (miginstance.Manager.Reconcile): what a crash
//     left half made is rolled back and records of vanished instances are
//     forgotten. Where the kubelet's PodResources API says which seats
//     containers hold, the instances made for devices that are neither a
//     seat of the configuration nor held are destroyed: the shim's own of
//     an earlier configuration, and the DRA plugin's, since the shim
//     starts only on a node no pod of the DRA plugin holds (pkg/driver).
//     Without that answer no made instance is destroyed.
//   - A GPU not in MIG mode whose mode changes wait for a GPU reset
//     (Ampere) can make none of its seats until an administrator resets
//     it, which no plugin does on a node running workloads: every seat of
//     it is served Unhealthy, and a log line says what to do (the DRA
//     plugin publishes no MIG device of such a GPU). Where a mode change
//     takes effect at once (Hopper and later), a seat's first Allocate
//     turns MIG mode on.
//   - Every instance left on a seat's GPU that is not the seat's own (made
//     for it, or a whole instance of its profile at its placement that no
//     other claim adopted, which its Allocate adopts) blocks the seats it
//     overlaps. They are served Unhealthy, so the kubelet never hands them
//     out, and a log line names the instance. The shim has no API client,
//     so no Node event says it: the node's capacity counts the seats, its
//     allocatable not.
//
// An instance made or removed while the shim runs is seen at its next
// start.

// foundInstance is a GPU instance on a seat's GPU.
type foundInstance struct {
	gpu int
	miginstance.GPUInstance
	// partition is set where the driver did not make it.
	partition *miginstance.Partition
}

// surveyMIG settles the journal and says why each seat that cannot be
// made cannot, by seat ID. listing is what the kubelet said at start, nil
// where it was not asked.
func surveyMIG(ctx context.Context, instances *miginstance.Manager, lib miginstance.Library, inv *inventory.Inventory, layout map[string][]planner.MIGDevice, listing *podresources.Listing) map[string]string {
	if instances == nil {
		return nil
	}
	logger := klog.FromContext(ctx)
	byGPU := map[int][]planner.MIGDevice{}
	held := map[types.UID]bool{}
	for _, seats := range layout {
		for _, d := range seats {
			byGPU[d.GPU.Index()] = append(byGPU[d.GPU.Index()], d)
			held[migClaim(d.DeviceName())] = true
		}
	}
	if listing != nil {
		// A device of any resource counts: a seat of an earlier
		// configuration may have been served under a resource name, in
		// any domain, that the configuration no longer has. Another
		// vendor's device IDs name no seat, so they keep nothing.
		for id := range listing.AssignedIDs(func(string) bool { return true }) {
			held[migClaim(id)] = true
		}
	}
	if err := instances.Reconcile(ctx, func() (map[types.UID]bool, bool) { return held, listing != nil }); err != nil {
		logger.Error(err, "Cannot settle every MIG instance; retried at the next start")
	}
	if listing == nil {
		logger.Info("Destroying no MIG instance of an earlier configuration", "warning", "the kubelet's PodResources API was not asked which seats containers hold")
	}
	blocked := map[string]string{}
	for _, gpu := range slices.Sorted(maps.Keys(byGPU)) {
		seats := byGPU[gpu]
		if why := migModeBlocks(ctx, lib, inv, gpu); why != "" {
			for _, d := range seats {
				blocked[d.DeviceName()] = why
			}
			continue
		}
		found, err := listInstances(ctx, instances, lib, gpu)
		if err != nil {
			for _, d := range seats {
				blocked[d.DeviceName()] = fmt.Sprintf("the MIG instances of GPU %d cannot be listed: %v", gpu, err)
			}
			continue
		}
		for _, f := range found {
			why := blockedBy(instances, f, seats)
			if why == "" {
				continue
			}
			for _, d := range seats {
				if _, ok := blocked[d.DeviceName()]; !ok && mig.Overlaps(d.Placement, f.Placement) {
					blocked[d.DeviceName()] = why
				}
			}
		}
	}
	for _, id := range slices.Sorted(maps.Keys(blocked)) {
		logger.Info("A MIG seat cannot be made: it is served Unhealthy until what blocks it is removed and the shim restarted", "seat", id, "warning", blocked[id])
	}
	return blocked
}

// migModeBlocks says why gpu's MIG mode keeps its seats from being made,
// "" where it does not.
func migModeBlocks(ctx context.Context, lib miginstance.Library, inv *inventory.Inventory, gpu int) string {
	g, ok := inv.GPUByIndex(gpu)
	if !ok {
		return fmt.Sprintf("GPU %d is not in the inventory", gpu)
	}
	dev, ret := lib.DeviceGetHandleByIndex(gpu)
	var current, pending int
	if ret == nvml.SUCCESS {
		current, pending, ret = dev.GetMigMode()
	}
	if ret != nvml.SUCCESS {
		return fmt.Sprintf("the MIG mode of GPU %d cannot be read: %s", gpu, nvml.ErrorString(ret))
	}
	if fix := mig.ModeFix(gpu, g.Architecture, current, pending); fix != "" {
		return fmt.Sprintf("GPU %d (%s, %s) is not in MIG mode, and turning it on needs a GPU reset the shim does not do. %s", gpu, g.Architecture, g.UUID, fix)
	}
	if current != nvml.DEVICE_MIG_ENABLE {
		klog.FromContext(ctx).Info("GPU given to a MIG profile is not in MIG mode; the first Allocate of one of its seats turns it on", "gpu", gpu, "architecture", g.Architecture)
	}
	return ""
}

// listInstances lists every GPU instance on gpu, with those the driver
// did not make marked.
func listInstances(ctx context.Context, instances *miginstance.Manager, lib miginstance.Library, gpu int) ([]foundInstance, error) {
	dev, ret := lib.DeviceGetHandleByIndex(gpu)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("DeviceGetHandleByIndex: %s", nvml.ErrorString(ret))
	}
	all, err := miginstance.ListGPUInstances(dev)
	if err != nil {
		return nil, err
	}
	parts, err := instances.Partitions(ctx, []int{gpu})
	if err != nil {
		return nil, err
	}
	out := make([]foundInstance, 0, len(all))
	for _, gi := range all {
		f := foundInstance{gpu: gpu, GPUInstance: gi}
		if i := slices.IndexFunc(parts, func(p miginstance.Partition) bool { return p.GI == gi.ID }); i >= 0 {
			f.partition = &parts[i]
		}
		out = append(out, f)
	}
	return out, nil
}

// blockedBy says why f blocks the seats it overlaps, "" where it is a
// seat's own.
func blockedBy(instances *miginstance.Manager, f foundInstance, seats []planner.MIGDevice) string {
	i := slices.IndexFunc(seats, func(d planner.MIGDevice) bool { return d.Placement == f.Placement && d.GPU.Profile.ID == f.ProfileID })
	what := fmt.Sprintf("MIG instance %d (profile ID %d) at %s on GPU %d", f.ID, f.ProfileID, f.Placement, f.gpu)
	if i >= 0 {
		what = fmt.Sprintf("MIG %s instance %d at %s on GPU %d", seats[i].GPU.Profile.Name, f.ID, f.Placement, f.gpu)
	}
	if p := f.partition; p != nil {
		switch {
		case i < 0:
			return fmt.Sprintf("%s was made by someone else and is no seat of the configuration; remove it (nvidia-smi mig -i %d -gi %d -dci; nvidia-smi mig -i %d -gi %d -dgi) or configure its profile", what, f.gpu, f.ID, f.gpu, f.ID)
		case !p.Whole:
			return fmt.Sprintf("%s was made by someone else and holds %d compute instances, where a seat's holds one that spans it", what, p.ComputeInstances)
		case p.Claim != "" && p.Claim != migClaim(seats[i].DeviceName()):
			return fmt.Sprintf("%s was made by someone else and is adopted by claim %s", what, p.Claim)
		}
		return ""
	}
	if i >= 0 {
		id := seats[i].DeviceName()
		inst, ok, err := instances.Lookup(migClaim(id), id)
		if err != nil {
			return fmt.Sprintf("%s cannot be found in the journal: %v", what, err)
		}
		if ok && inst.GI == f.ID {
			return ""
		}
	}
	return fmt.Sprintf("%s was made by the driver for another device (a seat of an earlier configuration that a container still holds, or a claim of the DRA plugin); the shim destroys it at its next start once no container holds it", what)
}
