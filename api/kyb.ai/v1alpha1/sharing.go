package v1alpha1

import (
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// SharingStrategy says how the seats of one group share its GPUs.
type SharingStrategy string

const (
	// SharingTimeSlicing lets the processes of every seat take turns on
	// the GPUs (compute mode DEFAULT): no memory or SM limit at all. The
	// default.
	SharingTimeSlicing SharingStrategy = "timeSlicing"
	// SharingMPS runs one MPS control daemon per group in use, the group's
	// GPUs in compute mode EXCLUSIVE_PROCESS unless MPSConfig.ComputeMode
	// keeps it: a claim holding k of a group's S seats gets k/S of its SMs
	// and of each GPU's memory, or, on a sized profile, the size it asked.
	SharingMPS SharingStrategy = "mps"
)

// MPSComputeMode says what an MPS daemon's start does to the compute mode
// of its group's GPUs.
type MPSComputeMode string

const (
	// MPSComputeModeExclusiveProcess puts the GPUs in compute mode
	// EXCLUSIVE_PROCESS while the daemon runs, and back to DEFAULT once it
	// has ended: a process that does not join the daemon cannot open a
	// GPU the daemon's server holds. The default.
	MPSComputeModeExclusiveProcess MPSComputeMode = "exclusiveProcess"
	// MPSComputeModeKeep leaves the GPUs' compute mode as it is. MPS works
	// in any mode but PROHIBITED; in DEFAULT, a process that does not join
	// the daemon (a container whose CUDA_MPS_PIPE_DIRECTORY points
	// elsewhere) shares the GPU beside it, outside every seat's limits.
	// For nodes whose compute mode the plugin may not or should not
	// change (no root for NVML's SetComputeMode, a mode set by the
	// operator).
	MPSComputeModeKeep MPSComputeMode = "keep"
)

// TimeSliceInterval is the length of a GPU's time slice, as nvidia-smi
// compute-policy --set-timeslice names it.
type TimeSliceInterval string

const (
	TimeSliceDefault TimeSliceInterval = "Default"
	TimeSliceShort   TimeSliceInterval = "Short"
	TimeSliceMedium  TimeSliceInterval = "Medium"
	TimeSliceLong    TimeSliceInterval = "Long"
)

// TimeSliceIntervals are the valid intervals, in nvidia-smi's numbering
// (Default 0 … Long 3).
var TimeSliceIntervals = []TimeSliceInterval{TimeSliceDefault, TimeSliceShort, TimeSliceMedium, TimeSliceLong}

// Sharing is a profile's sharing strategy.
type Sharing struct {
	// Strategy is timeSlicing (default) or mps.
	Strategy SharingStrategy `json:"strategy,omitempty"`
	// TimeSlicing tunes the timeSlicing strategy.
	TimeSlicing *TimeSlicingConfig `json:"timeSlicing,omitempty"`
	// MPS tunes the mps strategy.
	MPS *MPSConfig `json:"mps,omitempty"`
	// Sized, with strategy mps, lets each claim ask its size: device
	// memory on each GPU of its group and a share of their SMs, which its
	// MPS client is held to, instead of an equal share of the group.
	// seatsPerGroup is then the most claims (MPS clients) a group serves.
	Sized bool `json:"sized,omitempty"`
	// Sizes bound what a sized profile's claims may ask and say what one
	// that asks nothing gets (sizes.go).
	Sizes *SeatSizes `json:"sizes,omitempty"`
}

// MPSConfig tunes MPS.
type MPSConfig struct {
	// ComputeMode is exclusiveProcess (default) or keep.
	ComputeMode MPSComputeMode `json:"computeMode,omitempty"`
}

// TimeSlicingConfig tunes time-slicing.
type TimeSlicingConfig struct {
	// Interval, when set, is applied to the group's GPUs when its first
	// seat is prepared. Left out, the GPUs' time slice is not touched.
	Interval TimeSliceInterval `json:"interval,omitempty"`
}

// SharingStrategy is the profile's strategy, timeSlicing unless it says mps.
func (p *Profile) SharingStrategy() SharingStrategy {
	if p.Sharing != nil && p.Sharing.Strategy == SharingMPS {
		return SharingMPS
	}
	return SharingTimeSlicing
}

// TimeSliceInterval is the interval a timeSlicing profile applies, "" for
// none.
func (p *Profile) TimeSliceInterval() TimeSliceInterval {
	if p.Sharing == nil || p.Sharing.TimeSlicing == nil {
		return ""
	}
	return p.Sharing.TimeSlicing.Interval
}

// MPSComputeMode is what an mps profile's daemons do to their GPUs'
// compute mode: exclusiveProcess unless the profile says keep.
func (p *Profile) MPSComputeMode() MPSComputeMode {
	if p.Sharing != nil && p.Sharing.MPS != nil && p.Sharing.MPS.ComputeMode == MPSComputeModeKeep {
		return MPSComputeModeKeep
	}
	return MPSComputeModeExclusiveProcess
}

func validateSharing(p *Profile, path *field.Path, errs *FieldErrors) {
	s := p.Sharing
	if s == nil {
		return
	}
	path = path.Child("sharing")
	switch s.Strategy {
	case "", SharingTimeSlicing:
	case SharingMPS:
		if s.TimeSlicing != nil {
			errs.Add(path.Child("timeSlicing"), "applies to strategy %q only; strategy is %q", SharingTimeSlicing, SharingMPS)
		}
		if p.SeatsPerGroup == nil || *p.SeatsPerGroup < 2 {
			errs.Add(path.Child("strategy"), "%q shares a group between seats: set seatsPerGroup to 2 or more (a one-seat group needs no strategy)", SharingMPS)
		}
		if p.AllowOverprovision {
			errs.Add(path.Child("strategy"), "%q cannot be combined with allowOverprovision: an MPS daemon needs its GPUs in EXCLUSIVE_PROCESS mode, which another group's processes on them would break", SharingMPS)
		}
	default:
		errs.Add(path.Child("strategy"), "must be %q or %q, not %q", SharingTimeSlicing, SharingMPS, s.Strategy)
	}
	if s.MPS != nil {
		if s.Strategy != SharingMPS {
			errs.Add(path.Child("mps"), "applies to strategy %q only; strategy is %q", SharingMPS, p.SharingStrategy())
		}
		switch s.MPS.ComputeMode {
		case "", MPSComputeModeExclusiveProcess, MPSComputeModeKeep:
		default:
			errs.Add(path.Child("mps", "computeMode"), "must be %q or %q, not %q", MPSComputeModeExclusiveProcess, MPSComputeModeKeep, s.MPS.ComputeMode)
		}
	}
	if s.TimeSlicing != nil && s.TimeSlicing.Interval != "" && !slices.Contains(TimeSliceIntervals, s.TimeSlicing.Interval) {
		errs.Add(path.Child("timeSlicing", "interval"), "must be Default, Short, Medium or Long, not %q", s.TimeSlicing.Interval)
	}
	validateSized(p, path, errs)
}

// validateSharingTogether refuses profiles whose groups could be in use on
// the same GPU at once with strategies that contradict each other. Groups
// that share a GPU are in use at once only where a profile involved
// overprovisions; profiles without a gpus list cover every GPU.
func validateSharingTogether(profiles []Profile, errs *FieldErrors) {
	for i := range profiles {
		for j := range i {
			a, b := &profiles[j], &profiles[i]
			if !a.AllowOverprovision && !b.AllowOverprovision {
				continue
			}
			if !gpusMayOverlap(a.GPUs, b.GPUs) {
				continue
			}
			path := field.NewPath("profiles").Index(i).Child("sharing")
			switch {
			case a.SharingStrategy() == SharingMPS || b.SharingStrategy() == SharingMPS:
				errs.Add(path, "profiles[%d] and profiles[%d] may be in use on the same GPU at once (one overprovisions and their gpus lists overlap or are left out), and one of them uses mps: give them disjoint gpus lists", j, i)
			case a.TimeSliceInterval() != b.TimeSliceInterval() && a.TimeSliceInterval() != "" && b.TimeSliceInterval() != "":
				errs.Add(path.Child("timeSlicing", "interval"), "%s contradicts profiles[%d]'s %s on GPUs both may use at once (one overprovisions): use one interval or disjoint gpus lists", b.TimeSliceInterval(), j, a.TimeSliceInterval())
			}
		}
	}
}

// gpusMayOverlap: an empty list is every GPU.
func gpusMayOverlap(a, b []int) bool {
	if len(a) == 0 || len(b) == 0 {
		return true
	}
	for _, x := range a {
		if slices.Contains(b, x) {
			return true
		}
	}
	return false
}
