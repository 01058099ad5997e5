// Package app is kyb-scheduler: kube-scheduler's own command
// (k8s.io/kubernetes/cmd/kube-scheduler/app), built against the patched
// allocator and scheduler (hack/kyb-scheduler-patch.sh), with the
// KybPlacement score and KybPreemption (preemption that frees devices)
// registered, gang scheduling on, and defaults that make
// `schedulerName: kyb-scheduler` work without a configuration file.
// Every kube-scheduler flag works as it does there.
//
// Why a scheduler build and not an extender: the score must see the
// allocations of pods reserved but not yet bound, which only the
// scheduler's own claim tracker holds, and it runs on the scheduler's
// snapshot with no network hop. The build is tied to one Kubernetes
// minor version, hence a module of its own.
package app

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/component-base/featuregate"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-scheduler/placement"
	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-scheduler/room"
)

// DefaultGates are the feature gates kyb-scheduler turns on where
// kube-scheduler 1.37 leaves them off; --feature-gates still sets them
// either way. GenericWorkload (beta, off by default upstream) is gang
// scheduling: the Workload and PodGroup API (scheduling.k8s.io/v1beta1)
// and the scheduler's pod group cycle and GangScheduling plugin. The API
// server must serve that API too: --feature-gates=GenericWorkload=true
// and --runtime-config=scheduling.k8s.io/v1beta1=true.
var DefaultGates = map[featuregate.Feature]bool{
	features.GenericWorkload: true,
}

// NewCommand returns kyb-scheduler's command. It changes two process-wide
// defaults, as a component's main does: the feature gates' (DefaultGates)
// and the scheduler configuration's (RegisterDefaults). Its score records
// its cost in m (main registers it where kube-scheduler serves /metrics).
// Call it once, before the command parses its flags.
func NewCommand(m *placement.Metrics) (*cobra.Command, error) {
	cmd, _, err := newCommand(m)
	return cmd, err
}

// newCommand is NewCommand, with the defragmentation its flags set.
func newCommand(m *placement.Metrics) (*cobra.Command, *room.Defragmentation, error) {
	for name, on := range DefaultGates {
		if err := utilfeature.DefaultMutableFeatureGate.OverrideDefault(name, on); err != nil {
			return nil, nil, fmt.Errorf("default feature gate %s=%t: %w", name, on, err)
		}
	}
	RegisterDefaults(scheme.Scheme)
	// KybPreemption's defragmentation, set by flags of kyb-scheduler's
	// own, which its factory reads when the scheduler makes its plugins.
	defrag := &room.Defragmentation{}
	defragFlags := pflag.NewFlagSet("defragmentation", pflag.ContinueOnError)
	defrag.AddFlags(defragFlags)
	cmd := schedulerapp.NewSchedulerCommand(
		schedulerapp.WithPlugin(placement.Name, placement.Factory(m)),
		schedulerapp.WithPlugin(room.Name, room.FactoryWith(defrag)),
	)
	cmd.Use = "kyb-scheduler"
	cmd.Flags().AddFlagSet(defragFlags)
	addUsage(cmd, "Defragmentation flags", defragFlags)
	// The command line's feature gates are set in PersistentPreRunE;
	// gang scheduling then follows what the API server serves, checked
	// where kube-scheduler would start, not for --version or
	// --write-config-to.
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if err := defrag.Validate(); err != nil {
			return err
		}
		if !offline(c) {
			ctx := c.Context()
			if ctx == nil {
				ctx = context.Background()
			}
			if err := gangGateFollowsTheAPI(ctx, c, discoverGangAPI(c)); err != nil {
				return err
			}
		}
		return run(c, args)
	}
	return cmd, defrag, nil
}

// addUsage appends a flag set of kyb-scheduler's own to the command's
// usage and help, which list kube-scheduler's named flag sets.
func addUsage(cmd *cobra.Command, title string, fs *pflag.FlagSet) {
	usage, help := cmd.UsageFunc(), cmd.HelpFunc()
	section := func(c *cobra.Command) {
		fmt.Fprintf(c.OutOrStdout(), "\n%s:\n\n%s", title, fs.FlagUsages())
	}
	cmd.SetUsageFunc(func(c *cobra.Command) error {
		if err := usage(c); err != nil {
			return err
		}
		section(c)
		return nil
	})
	cmd.SetHelpFunc(func(c *cobra.Command, args []string) {
		help(c, args)
		section(c)
	})
}
