package room

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"sigs.k8s.io/yaml"
)

// Args are the plugin's arguments (pluginConfig, name KybPreemption):
// DefaultPreemption's, with its defaults. They bound how many nodes a
// preemption dry-runs: the larger of the percentage of the nodes and the
// absolute number.
//
//	pluginConfig:
//	- name: KybPreemption
//	  args:
//	    minCandidateNodesPercentage: 10
//	    minCandidateNodesAbsolute: 100
type Args struct {
	MinCandidateNodesPercentage *int32 `json:"minCandidateNodesPercentage,omitempty"`
	MinCandidateNodesAbsolute   *int32 `json:"minCandidateNodesAbsolute,omitempty"`
}

// DecodeArgs reads the arguments the scheduler's configuration gives the
// plugin (nil: none) into DefaultPreemption's. Unknown fields are errors.
func DecodeArgs(obj runtime.Object) (*config.DefaultPreemptionArgs, error) {
	var args Args
	if obj != nil {
		u, ok := obj.(*runtime.Unknown)
		if !ok {
			return nil, fmt.Errorf("%s args: want runtime.Unknown, got %T", Name, obj)
		}
		if len(u.Raw) > 0 {
			if err := yaml.UnmarshalStrict(u.Raw, &args); err != nil {
				return nil, fmt.Errorf("%s args: %w", Name, err)
			}
		}
	}
	// kube-scheduler's defaults for DefaultPreemption.
	out := &config.DefaultPreemptionArgs{MinCandidateNodesPercentage: 10, MinCandidateNodesAbsolute: 100}
	if args.MinCandidateNodesPercentage != nil {
		out.MinCandidateNodesPercentage = *args.MinCandidateNodesPercentage
	}
	if args.MinCandidateNodesAbsolute != nil {
		out.MinCandidateNodesAbsolute = *args.MinCandidateNodesAbsolute
	}
	return out, nil
}
