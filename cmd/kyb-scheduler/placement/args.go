package placement

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// Policy is how the score ranks the nodes that fit a pod's seats.
type Policy string

const (
	// Pack prefers the nodes with the most GPUs in use, then a node where
	// the pod takes a seat of a group already in use: whole groups stay
	// free on the other nodes for the requests that need them.
	Pack Policy = "pack"
	// Topology prefers the node where the group the allocator would take
	// breaks the fewest free larger groups (an NVLink pair or island
	// whose GPUs are all idle), and packs among equals.
	Topology Policy = "topology"
	// Spread prefers the nodes with the fewest GPUs in use.
	Spread Policy = "spread"
)

// Policies are the policies, in the order messages list them.
var Policies = []Policy{Pack, Topology, Spread}

// PolicyAnnotation on a pod chooses its policy over the configuration's,
// as HAMi's and Volcano's GPU annotations do.
const PolicyAnnotation = driver.Name + "/placement"

// Args are the plugin's arguments in the scheduler's configuration
// (pluginConfig, name KybPlacement):
//
//	pluginConfig:
//	- name: KybPlacement
//	  args:
//	    defaultPolicy: pack
//	    deviceClassPolicies:
//	      gpu-4x-seat.kyb.ai: topology
type Args struct {
	// DefaultPolicy applies to a pod that neither annotates its own
	// (PolicyAnnotation) nor asks for a DeviceClass listed in
	// DeviceClassPolicies. Default: pack.
	DefaultPolicy Policy `json:"defaultPolicy,omitempty"`
	// DeviceClassPolicies maps DeviceClass names to a policy, for pods
	// whose first request of our devices asks for that class.
	DeviceClassPolicies map[string]Policy `json:"deviceClassPolicies,omitempty"`
}

// DecodeArgs reads the arguments the scheduler's configuration gives the
// plugin (nil: none) and checks them. Unknown fields are errors: a typo
// must not silently leave the default in place.
func DecodeArgs(obj runtime.Object) (Args, error) {
	var args Args
	if obj != nil {
		u, ok := obj.(*runtime.Unknown)
		if !ok {
			return Args{}, fmt.Errorf("%s args: want runtime.Unknown, got %T", Name, obj)
		}
		if len(u.Raw) > 0 {
			if err := yaml.UnmarshalStrict(u.Raw, &args); err != nil {
				return Args{}, fmt.Errorf("%s args: %w", Name, err)
			}
		}
	}
	if args.DefaultPolicy == "" {
		args.DefaultPolicy = Pack
	}
	if err := args.validate(); err != nil {
		return Args{}, fmt.Errorf("%s args: %w", Name, err)
	}
	return args, nil
}

func (a Args) validate() error {
	var errs field.ErrorList
	if err := checkPolicy(a.DefaultPolicy, field.NewPath("defaultPolicy")); err != nil {
		errs = append(errs, err)
	}
	classes := field.NewPath("deviceClassPolicies")
	for _, class := range slices.Sorted(maps.Keys(a.DeviceClassPolicies)) {
		if class == "" {
			errs = append(errs, field.Invalid(classes, class, "a DeviceClass name may not be empty"))
			continue
		}
		if err := checkPolicy(a.DeviceClassPolicies[class], classes.Key(class)); err != nil {
			errs = append(errs, err)
		}
	}
	return errs.ToAggregate()
}

func checkPolicy(p Policy, path *field.Path) *field.Error {
	if slices.Contains(Policies, p) {
		return nil
	}
	names := make([]string, len(Policies))
	for i, p := range Policies {
		names[i] = string(p)
	}
	return field.NotSupported(path, p, names)
}

// podPolicy is the policy for a pod: its annotation, else the policy of
// the first class of ours it asks for that has one, else the default.
func (a Args) podPolicy(annotations map[string]string, classes []string) (Policy, error) {
	if v, ok := annotations[PolicyAnnotation]; ok {
		p := Policy(strings.TrimSpace(v))
		if err := checkPolicy(p, field.NewPath("metadata", "annotations").Key(PolicyAnnotation)); err != nil {
			return "", utilerrors.NewAggregate([]error{err})
		}
		return p, nil
	}
	for _, c := range classes {
		if p, ok := a.DeviceClassPolicies[c]; ok {
			return p, nil
		}
	}
	return a.DefaultPolicy, nil
}
