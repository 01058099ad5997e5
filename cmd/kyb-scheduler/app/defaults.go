package app

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	configv1 "k8s.io/kube-scheduler/config/v1"
	schedulerv1 "k8s.io/kubernetes/pkg/scheduler/apis/config/v1"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-scheduler/placement"
	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-scheduler/room"
)

// SchedulerName is the profile pods name in spec.schedulerName, and the
// lease kyb-scheduler's replicas elect a leader on: the default
// scheduler's ("kube-scheduler") would make the two schedulers take
// turns instead of running side by side.
const SchedulerName = "kyb-scheduler"

// PlacementWeight is the score's weight. The framework adds each score
// plugin's normalized score (0..100) times its weight; the placement
// score puts the best node by its policy at 100 and the worst at 0, so at
// 5 the policy outweighs any single default score (TaintToleration 3;
// NodeAffinity, PodTopologySpread, InterPodAffinity and DynamicResources
// 2; NodeResourcesFit, NodeResourcesBalancedAllocation and ImageLocality
// 1) but not a user's preferences combined, which can still choose among
// nodes the policy ranks close. docs/kyb-scheduler.md explains the
// choice.
const PlacementWeight = 5

// DefaultProfile is the profile kyb-scheduler runs where the
// configuration names none (no --config, or a file without profiles):
// kube-scheduler's default plugins, the placement score at
// PlacementWeight with the pack policy (its PreFilter before the others'),
// KybPreemption in DefaultPreemption's place, and NodeResourcesFit scoring
// MostAllocated. Its default, LeastAllocated, spreads pods by CPU and
// memory, counting a pod without requests at 100m and 200Mi: on nodes
// alike it would send consecutive seat pods to different nodes, the
// opposite of pack. MostAllocated packs CPU and memory the same way; at
// weight 1 it only breaks ties under the spread policy.
func DefaultProfile() configv1.KubeSchedulerProfile {
	args := fmt.Appendf(nil, `{"defaultPolicy":%q}`, placement.Pack)
	return configv1.KubeSchedulerProfile{
		SchedulerName: ptr.To(SchedulerName),
		Plugins: &configv1.Plugins{
			MultiPoint: configv1.PluginSet{
				Enabled: []configv1.Plugin{
					{Name: placement.Name, Weight: ptr.To[int32](PlacementWeight)},
					// DefaultPreemption's preemption, with a victim search
					// that frees devices (room/plugin.go).
					{Name: room.Name},
				},
				Disabled: []configv1.Plugin{{Name: names.DefaultPreemption}},
			},
			// Named at PreFilter too, so that its PreFilter runs first: it
			// leaves the device order the DynamicResources plugin's
			// PreFilter hands the allocator (placement/order.go).
			PreFilter: configv1.PluginSet{Enabled: []configv1.Plugin{{Name: placement.Name}}},
		},
		PluginConfig: []configv1.PluginConfig{
			{Name: names.NodeResourcesFit, Args: runtime.RawExtension{Object: &configv1.NodeResourcesFitArgs{
				ScoringStrategy: &configv1.ScoringStrategy{Type: configv1.MostAllocated},
			}}},
			{Name: placement.Name, Args: runtime.RawExtension{Object: &runtime.Unknown{Raw: args, ContentType: runtime.ContentTypeJSON}}},
		},
	}
}

// RegisterDefaults makes kyb-scheduler's defaults part of the scheduler
// configuration's defaulting in s (the scheduler's configuration scheme):
// a configuration without profiles gets DefaultProfile, one without a
// leader election lease name gets SchedulerName's; then kube-scheduler's
// own defaults apply. Both the built-in configuration (no --config) and
// a --config file go through it, and every flag keeps its meaning.
func RegisterDefaults(s *runtime.Scheme) {
	s.AddTypeDefaultingFunc(&configv1.KubeSchedulerConfiguration{}, func(obj any) {
		cfg := obj.(*configv1.KubeSchedulerConfiguration)
		SetDefaults(cfg)
		schedulerv1.SetObjectDefaults_KubeSchedulerConfiguration(cfg)
	})
}

// SetDefaults applies kyb-scheduler's defaults to a configuration, before
// kube-scheduler's.
func SetDefaults(cfg *configv1.KubeSchedulerConfiguration) {
	if len(cfg.Profiles) == 0 {
		cfg.Profiles = []configv1.KubeSchedulerProfile{DefaultProfile()}
	}
	if cfg.LeaderElection.ResourceName == "" {
		cfg.LeaderElection.ResourceName = SchedulerName
	}
}
