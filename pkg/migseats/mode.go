package migseats

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// MIG mode at start: the plugin switches MIG mode on only where that takes
// no reset (Hopper and later, at a claim's first prepare). A GPU the plan
// gives to a MIG profile that is on an architecture needing a reset
// (Ampere) and not in MIG mode can make no instance until an administrator
// drains and resets it, so at start it is reported (an error log line and
// a Warning Node event, both with what to do; the doctor says the same)
// and its MIG devices are not published: a claim allocated one could only
// fail its prepare. Its whole-GPU groups stay published, as the GPU serves
// them as usual with MIG off.
//
// The devices are withdrawn, as around a foreign partition
// (draresources.WithdrawAroundPartitions), rather than tainted NoSchedule:
// a taint is tolerated by any claim that tolerates it, and such a claim
// would be allocated a device no prepare can make; withdrawn devices
// consume no counters, so the slices stay exactly what can be made. The
// mode is read once at start, like the partitions: after the reset the
// plugin is restarted to publish the GPU's MIG devices. A claim allocated
// one before (a stale allocation) fails its prepare with the same fix.

// ReasonMIGModeNeedsReset (Warning): a GPU given to a MIG profile is not
// in MIG mode, and turning it on needs a GPU reset the plugin does not
// do; its MIG devices are not published.
const ReasonMIGModeNeedsReset = "MIGModeNeedsReset"

// surveyMIGMode reads the MIG mode of the GPUs the plan gives to a MIG
// profile and returns those whose MIG devices cannot be made until a GPU
// reset, sorted. It runs once at start, before anything is published.
func (f *survey) surveyMIGMode(ctx context.Context, opts Options) []int {
	lib, events := opts.NVML, opts.Events
	logger := klog.FromContext(ctx)
	var off []int
	for _, gpu := range slices.Sorted(maps.Keys(opts.Node.Plan.MIGModels())) {
		g := opts.Node.Inv.GPUs[gpu]
		dev, ret := lib.DeviceGetHandleByIndex(gpu)
		var current, pending int
		if ret == nvml.SUCCESS {
			current, pending, ret = dev.GetMigMode()
		}
		if ret != nvml.SUCCESS {
			// Publishing as if the mode were on offers devices whose
			// prepare says what is wrong; the node's other seats go on.
			logger.Error(fmt.Errorf("GPU %d: read its MIG mode: %s", gpu, nvml.ErrorString(ret)), "Cannot read the MIG mode of a GPU given to a MIG profile; publishing its MIG devices", "gpu", gpu)
			continue
		}
		if current == nvml.DEVICE_MIG_ENABLE {
			continue
		}
		if !mig.ModeChangeNeedsReset(g.Architecture) {
			logger.Info("GPU given to a MIG profile is not in MIG mode; the first MIG claim's prepare turns it on", "gpu", gpu, "architecture", g.Architecture)
			continue
		}
		fix := mig.ModeFix(gpu, g.Architecture, current, pending)
		logger.Error(nil, "GPU given to a MIG profile is not in MIG mode, and turning it on needs a GPU reset the plugin does not do; its MIG devices are not published",
			"gpu", gpu, "uuid", g.UUID, "architecture", g.Architecture, "migPending", pending == nvml.DEVICE_MIG_ENABLE, "fix", fix)
		events.Warning(ctx, ReasonMIGModeNeedsReset, fmt.Sprintf("GPU %d (%s, %s) is given to a MIG profile and is not in MIG mode; its MIG devices are not published, its whole-GPU groups are. %s", gpu, g.Architecture, g.UUID, fix))
		off = append(off, gpu)
	}
	return off
}
