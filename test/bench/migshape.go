package bench

import (
	"context"
	"fmt"
	"strings"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// A node that turns every MIG profile on publishes every instance at every
// placement its GPUs allow, each a device consuming the GPU's memory and
// compute-slice counters, beside the 1x…8x groups that consume the same
// GPUs. Full of the smallest instances, every other device of the node is
// blocked only by the counters: the allocator still considers each one
// before it finds that, which is what a full MIG node costs a pod.

// EveryMIGProfileConfig is the node configuration that publishes 1x, 2x,
// 4x and 8x groups and every MIG profile of model, each profile's
// resource named after it (kyb.ai/mig-1g.10gb; "+" becomes "-").
func EveryMIGProfileConfig(model mig.Model) string {
	var b strings.Builder
	b.WriteString("profiles:\n")
	for _, size := range []int{1, 2, 4, 8} {
		fmt.Fprintf(&b, "- {resource: kyb.ai/gpu-%dx-seat}\n", size)
	}
	for _, p := range model.Profiles {
		fmt.Fprintf(&b, "- {resource: %s, mig: {profile: %q}}\n", migResource(p.Name), p.Name)
	}
	return b.String()
}

func migResource(profile string) string {
	return "kyb.ai/mig-" + strings.ReplaceAll(profile, "+", "-")
}

// MIGShape is KybShape for preset with every MIG profile of its GPUs on
// (EveryMIGProfileConfig), measured with claims for the model's smallest
// instance (its first profile: 1g.10gb on an H100, 1g.5gb on an A100-40GB).
func MIGShape(ctx context.Context, name, preset string) (Shape, error) {
	_, inv, _, err := Plan(ctx, preset, "node-0", "")
	if err != nil {
		return Shape{}, err
	}
	if len(inv.GPUs) == 0 {
		return Shape{}, fmt.Errorf("shape %s: preset %s has no GPU", name, preset)
	}
	if inv.GPUs[0].MIG == nil {
		return Shape{}, fmt.Errorf("shape %s: GPU 0 of %s has no MIG geometry: %s", name, preset, inv.GPUs[0].NoMIG)
	}
	model := *inv.GPUs[0].MIG
	config := EveryMIGProfileConfig(model)
	plan, _, _, err := Plan(ctx, preset, "node-0", config)
	if err != nil {
		return Shape{}, err
	}
	resource := migResource(model.Profiles[0].Name)
	for _, prof := range plan.Profiles {
		if prof.Resource == resource {
			return KybShape(ctx, name, preset, config, prof.Name)
		}
	}
	return Shape{}, fmt.Errorf("shape %s: the plan of %s has no profile for %s", name, preset, resource)
}
