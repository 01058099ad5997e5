package v1alpha1

import (
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// MIGProfile makes a profile's seats MIG instances: on each of the
// profile's GPUs, GPU instances of one MIG profile, each a seat of its
// own with its own memory, cache and SMs. The groups of such a profile
// are single GPUs; gpusPerGroup, seatsPerGroup, sharing and
// allowOverprovision do not apply.
//
// Which MIG profiles exist, and how many instances of one a GPU holds,
// depends on the GPU; the node checks both against the MIG geometry NVML
// gives for its GPUs when it starts. A GPU without one (no MIG) publishes
// no MIG device, which is no error: one configuration serves every node.
type MIGProfile struct {
	// Profile is the GPU-instance profile as `nvidia-smi mig -lgip` names
	// it, less "MIG ": 1g.10gb, 3g.40gb or 1g.10gb+me on an H100, 1g.18gb
	// or 1g.35gb on an H200.
	Profile string `json:"profile"`

	// SeatsPerGPU is how many instances of the profile one GPU offers at
	// most. Default: as many as the GPU allows (7 for 1g.10gb on an H100);
	// fewer keeps memory slices free for other MIG profiles.
	SeatsPerGPU *int `json:"seatsPerGPU,omitempty"`
}

// IsMIG says whether the profile's seats are MIG instances.
func (p *Profile) IsMIG() bool { return p.MIG != nil }

// notDNSLabelChars are the characters a MIG resource name may hold that
// a DNS label may not: the '.' of 1g.10gb.
var notDNSLabelChars = regexp.MustCompile(`[^a-z0-9-]+`)

// defaultName is the profile's name when the configuration sets none.
// A MIG resource names its profile the way nvidia-smi does
// (kyb.ai/mig-1g.10gb), and a profile name is a DNS label: its '.'
// becomes '-' (mig-1g-10gb). Other profiles keep their rule, which
// refuses such a name and asks for one.
func (p *Profile) defaultName() string {
	name := DefaultProfileName(p.Resource)
	if p.IsMIG() {
		name = strings.Trim(notDNSLabelChars.ReplaceAllString(name, "-"), "-")
	}
	return name
}

// validateMIG checks what a MIG profile can be checked for without the
// node's GPUs: the fields that do not apply to it are left out, and the
// seat count is positive. Whether the GPUs have MIG, whether the profile
// is one of theirs and whether they allow that many instances is the
// planner's to check, against the geometry NVML gives.
func validateMIG(p *Profile, path *field.Path, errs *FieldErrors) {
	m := p.MIG
	migPath := path.Child("mig")
	if m.Profile == "" {
		errs.Add(migPath.Child("profile"), "required: a MIG profile as nvidia-smi names it, such as 1g.10gb")
	}
	if m.SeatsPerGPU != nil && *m.SeatsPerGPU < 1 {
		errs.Add(migPath.Child("seatsPerGPU"), "must be at least 1, not %d", *m.SeatsPerGPU)
	}
	if p.GPUsPerGroup != nil && *p.GPUsPerGroup != 1 {
		errs.Add(path.Child("gpusPerGroup"), "a MIG profile's groups are single GPUs: leave gpusPerGroup out, not %d", *p.GPUsPerGroup)
	} else if n := SizeFromResource(p.Resource); n > 1 {
		errs.Add(path.Child("resource"), "%q names groups of %d GPUs; a MIG profile's groups are single GPUs", p.Resource, n)
	}
	if p.SeatsPerGroup != nil {
		errs.Add(path.Child("seatsPerGroup"), "does not apply to a MIG profile, whose seats are instances: use mig.seatsPerGPU")
	}
	if p.Sharing != nil {
		errs.Add(path.Child("sharing"), "does not apply to a MIG profile: a MIG instance is a seat of its own, shared with no other (no time-slicing, no MPS)")
	}
	if p.AllowOverprovision {
		errs.Add(path.Child("allowOverprovision"), "does not apply to a MIG profile: MIG instances on overlapping memory slices cannot exist at once")
	}
}
