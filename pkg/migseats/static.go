package migseats

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// Static MIG partitions: the GPU instances on the plan's MIG GPUs that the
// plugin did not make are found once at start, after the journal is
// settled and before anything is published. Those that are seats of a
// MIG profile configured for their GPU are published as static seats,
// which a claim adopts (miginstance/adopt.go); the others are reported
// (log, Node event, kyb_dra_mig_partitions) and what they make impossible
// is withdrawn from the slices (draresources.WithdrawAroundPartitions).
// None of them is destroyed. A partition made or removed while the plugin
// runs is seen at its next start: until then a claim on a device it
// overlaps fails its prepare with NVML's ERROR_INSUFFICIENT_RESOURCES, and
// one on a static seat whose instance was removed has one made.

// ReasonForeignMIGInstance (Warning): a MIG instance the plugin did not
// make is no seat of the GPU's configured MIG profiles; it is left, and
// the devices it makes impossible are not published.
const ReasonForeignMIGInstance = "ForeignMIGInstance"

// The kinds kyb_dra_mig_partitions counts.
const (
	partitionStatic  = "static"
	partitionForeign = "foreign"
)

func newPartitionsGauge() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kyb_dra_mig_partitions",
		Help: "MIG instances found at start that the plugin did not make, by GPU and kind: static (a seat of a configured MIG profile, published and adopted by the claim allocated it) or foreign (no seat: left as it is, the devices it overlaps and its GPU's whole-GPU groups not published).",
	}, []string{"gpu", "kind"})
}

// survey is what the plugin found at start of the MIG GPUs' partitions
// and modes; it runs once, before anything is published, and is only
// read after.
type survey struct {
	// static are the MIG devices whose instances the plugin did not make
	// and adopts.
	static map[string]bool
	// withdrawn are the partitions the plugin did not make, which the
	// publisher withdraws around.
	withdrawn []draresources.MIGPartition
	// unpublished are the MIG GPUs none of whose MIG devices can be
	// published: not in MIG mode where that needs a reset (mode.go), or
	// whose instances could not be listed.
	unpublished []int
	// partitions counts the instances the plugin did not make, by GPU and
	// kind (static, foreign).
	partitions *prometheus.GaugeVec
}

// Withdrawn is what the node publishes around: the partitions the plugin
// did not make, and the MIG GPUs none of whose MIG devices can be
// published.
func (s *Seats) Withdrawn() ([]draresources.MIGPartition, []int) {
	return s.found.withdrawn, s.found.unpublished
}

// run finds the partitions the plugin did not make, decides which are
// static seats, reports the others, and reads the GPUs' MIG modes.
func (f *survey) run(ctx context.Context, instances *miginstance.Manager, opts Options) {
	if instances == nil {
		return
	}
	unlisted := f.surveyPartitions(ctx, instances, opts)
	f.unpublished = append(f.surveyMIGMode(ctx, opts), unlisted...)
}

// surveyPartitions finds the partitions the plugin did not make, decides
// which are static seats and reports the others; it returns the MIG GPUs
// whose instances could not be listed.
func (f *survey) surveyPartitions(ctx context.Context, instances *miginstance.Manager, opts Options) (unlisted []int) {
	logger := klog.FromContext(ctx)
	gpus := slices.Sorted(maps.Keys(opts.Node.Plan.MIGModels()))
	for _, gpu := range gpus {
		for _, kind := range []string{partitionStatic, partitionForeign} {
			f.partitions.WithLabelValues(strconv.Itoa(gpu), kind).Set(0)
		}
	}
	var parts []miginstance.Partition
	for _, gpu := range gpus {
		p, err := listPartitions(ctx, instances, gpu)
		if err != nil {
			// A GPU whose instances are unknown may hold any: its MIG
			// devices are not published (a static seat would lose its
			// mark, a device beside a foreign instance fail its prepare),
			// and a whole-GPU group's prepare checks the GPU for
			// instances itself.
			unlisted = append(unlisted, gpu)
			logger.Error(err, "Cannot list a GPU's MIG instances; its MIG devices are not published until the plugin restarts", "gpu", gpu)
			opts.Events.Warning(ctx, ReasonForeignMIGInstance, fmt.Sprintf("The MIG instances of GPU %d cannot be listed (%v): its MIG devices are not published until the plugin restarts. Check the GPU with kubectl kyb doctor.", gpu, err))
			continue
		}
		parts = append(parts, p...)
	}
	static := map[string]bool{}
	for _, p := range parts {
		seat, why := staticSeat(opts.Node.Plan, p)
		kind := partitionStatic
		if seat != "" {
			static[seat] = true
			logger.Info("Publishing a MIG instance the plugin did not make as a static seat; it is never destroyed", "device", seat, "instance", p.String(), "claim", p.Claim)
		} else {
			kind = partitionForeign
			opts.Events.Warning(ctx, ReasonForeignMIGInstance, fmt.Sprintf("MIG %s was not made by the plugin and is no seat: %s. It is left as it is; the MIG devices it overlaps and the whole-GPU groups of GPU %d are not published until it is removed and the plugin restarted.", p, why, p.GPU))
		}
		f.partitions.WithLabelValues(strconv.Itoa(p.GPU), kind).Inc()
		f.withdrawn = append(f.withdrawn, draresources.MIGPartition{GPU: p.GPU, Placement: p.Placement, Seat: seat})
	}
	f.static = static
	return unlisted
}

// listAttempts bounds the tries of a GPU's listing at start: NVML
// answers ERROR_UNKNOWN or a timeout now and then.
const listAttempts = 3

// listPartitions lists gpu's partitions, trying again after a failure.
func listPartitions(ctx context.Context, instances *miginstance.Manager, gpu int) ([]miginstance.Partition, error) {
	var err error
	for attempt := range listAttempts {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
			}
		}
		var parts []miginstance.Partition
		if parts, err = instances.Partitions(ctx, []int{gpu}); err == nil {
			return parts, nil
		}
	}
	return nil, err
}

// staticSeat is the MIG device a partition is a static seat of, or why it
// is none.
func staticSeat(plan *planner.Plan, p miginstance.Partition) (device, why string) {
	var configured []string
	for _, prof := range plan.Profiles {
		if prof.MIG == nil {
			continue
		}
		for _, g := range prof.MIG.GPUs {
			if g.Index() != p.GPU {
				continue
			}
			configured = append(configured, fmt.Sprintf("%s (ID %d)", g.Profile.Name, g.Profile.ID))
			if g.Profile.ID != p.ProfileID || !slices.Contains(g.Profile.Placements, p.Placement) {
				continue
			}
			if !p.Whole {
				return "", fmt.Sprintf("it holds %d compute instances, where a seat of %s holds one that spans it", p.ComputeInstances, g.Profile.Name)
			}
			return planner.MIGDevice{GPU: g, Placement: p.Placement}.DeviceName(), ""
		}
	}
	return "", fmt.Sprintf("its profile is none of those configured for GPU %d: %v", p.GPU, configured)
}
