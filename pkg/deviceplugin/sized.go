package deviceplugin

import "github.com/kyb-ai/kyb-dra-driver/pkg/planner"

// Why the shim serves no sized profile. A sized seat is one seat of a
// group with its memory and compute on that group, which the DRA
// allocator fits per device (consumable capacity). The device-plugin API
// has integer resources only, counted per node and allocated one resource
// at a time:
//
//   - A memory resource in a fixed unit (kyb.ai/gpu-memory-gib, one
//     device per GiB of a group) is counted by the scheduler for the node
//     as a whole: 20 free units may be 10 on each of two groups, where no
//     20 GiB seat fits. The pod is bound and then fails its admission, and
//     its controller's next pod lands there again.
//   - The kubelet allocates a container's resources one after another,
//     in map order, each with its own GetPreferredAllocation and
//     Allocate, neither of which names the pod or the other resources:
//     nothing ties the memory units to the group of the seat, and a seat
//     asked without units (or units without a seat) cannot be refused.
//   - Each resource's Allocate answers with its own environment, and the
//     kubelet keeps the first of two answers for one variable, in map
//     order: the seat's default limits and the units' limits cannot both
//     be given, and which wins is chance.
//
// Equal seats (a profile that is not sized) are what the shim serves
// instead; the sizes need DRA.
const notServedSized = "a sized seat's memory and compute must be on its own group, and the kubelet's integer resources are counted per node and allocated one resource at a time without naming the pod, so no unit resource can be tied to the seat's group; serve sized profiles with the DRA plugin, or use a profile of equal seats here"

// sizedProfiles are the names of the layout's sized profiles.
func sizedProfiles(layout *planner.Plan) []string {
	var out []string
	for _, p := range layout.Profiles {
		if p.Sizes != nil {
			out = append(out, p.Name)
		}
	}
	return out
}
