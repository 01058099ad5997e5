package app

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/kubernetes/cmd/kube-scheduler/app/options"
	"k8s.io/kubernetes/pkg/features"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/latest"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/names"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-scheduler/placement"
	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-scheduler/room"
)

// With no --config, kyb-scheduler runs one valid profile, kyb-scheduler:
// kube-scheduler's plugins (gang scheduling among them), the placement
// score at its weight with pack, KybPreemption in DefaultPreemption's
// place, NodeResourcesFit scoring MostAllocated,
// and a leader election lease of its own.
func TestDefaultConfiguration(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.GenericWorkload, true)
	RegisterDefaults(scheme.Scheme)
	cfg, err := latest.Default()
	if err != nil {
		t.Fatal(err)
	}
	if err := validation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		t.Fatalf("the default configuration is invalid: %v", err)
	}
	if len(cfg.Profiles) != 1 || cfg.Profiles[0].SchedulerName != SchedulerName {
		t.Fatalf("profiles %+v, want one named %s", cfg.Profiles, SchedulerName)
	}
	if cfg.LeaderElection.ResourceName != SchedulerName {
		t.Errorf("leader election lease %q, want %q: the default scheduler's would make the two take turns", cfg.LeaderElection.ResourceName, SchedulerName)
	}
	checkKybProfile(t, cfg.Profiles[0])
}

func checkKybProfile(t *testing.T, p config.KubeSchedulerProfile) {
	t.Helper()
	enabled := map[string]int32{}
	for _, pl := range p.Plugins.MultiPoint.Enabled {
		enabled[pl.Name] = pl.Weight
	}
	for name, weight := range map[string]int32{placement.Name: PlacementWeight, names.DynamicResources: 2, names.NodeResourcesFit: 1} {
		if got, ok := enabled[name]; !ok || got != weight {
			t.Errorf("plugin %s: enabled %t, weight %d; want weight %d", name, ok, got, weight)
		}
	}
	if _, ok := enabled[names.GangScheduling]; !ok {
		t.Errorf("GangScheduling is not enabled: %v", enabled)
	}
	// Preemption that frees devices, in DefaultPreemption's place.
	if _, ok := enabled[room.Name]; !ok {
		t.Errorf("%s is not enabled: %v", room.Name, enabled)
	}
	if _, ok := enabled[names.DefaultPreemption]; ok {
		t.Errorf("%s is enabled beside %s: two PostFilters would preempt", names.DefaultPreemption, room.Name)
	}
	for _, pc := range p.PluginConfig {
		switch pc.Name {
		case names.NodeResourcesFit:
			args, ok := pc.Args.(*config.NodeResourcesFitArgs)
			if !ok || args.ScoringStrategy == nil || args.ScoringStrategy.Type != config.MostAllocated {
				t.Errorf("NodeResourcesFit args %+v, want MostAllocated scoring", pc.Args)
			}
		case placement.Name:
			args, err := placement.DecodeArgs(pc.Args)
			if err != nil || args.DefaultPolicy != placement.Pack {
				t.Errorf("%s args %+v (%v), want pack", placement.Name, args, err)
			}
		}
	}
}

// A --config file without profiles gets kyb-scheduler's profile; one with
// profiles keeps them as written, and its lease name if it sets one.
func TestConfigFileDefaults(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.GenericWorkload, true)
	RegisterDefaults(scheme.Scheme)
	logger, _ := ktesting.NewTestContext(t)
	load := func(yaml string) *config.KubeSchedulerConfiguration {
		t.Helper()
		file := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(file, []byte("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"+yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := options.LoadConfigFromFile(logger, file)
		if err != nil {
			t.Fatal(err)
		}
		if err := validation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
			t.Fatal(err)
		}
		return cfg
	}

	cfg := load("clientConnection: {kubeconfig: /etc/kubeconfig}\n")
	if len(cfg.Profiles) != 1 || cfg.Profiles[0].SchedulerName != SchedulerName || cfg.LeaderElection.ResourceName != SchedulerName {
		t.Errorf("a file without profiles: profiles %v, lease %q; want kyb-scheduler's", profileNames(cfg), cfg.LeaderElection.ResourceName)
	} else {
		checkKybProfile(t, cfg.Profiles[0])
	}

	cfg = load(`leaderElection: {resourceName: gpu-scheduler}
profiles:
- schedulerName: gpu-scheduler
  plugins:
    multiPoint:
      enabled: [{name: KybPlacement, weight: 3}]
  pluginConfig:
  - name: KybPlacement
    args: {defaultPolicy: topology}
`)
	if got := profileNames(cfg); !slices.Equal(got, []string{"gpu-scheduler"}) || cfg.LeaderElection.ResourceName != "gpu-scheduler" {
		t.Fatalf("a file with profiles: profiles %v, lease %q; want gpu-scheduler's own", got, cfg.LeaderElection.ResourceName)
	}
	for _, pc := range cfg.Profiles[0].PluginConfig {
		if pc.Name != placement.Name {
			continue
		}
		if args, err := placement.DecodeArgs(pc.Args); err != nil || args.DefaultPolicy != placement.Topology {
			u, _ := pc.Args.(*runtime.Unknown)
			raw, _ := json.Marshal(u)
			t.Errorf("the file's %s args decode to %+v (%v) from %s, want topology", placement.Name, args, err, raw)
		}
	}
}

func profileNames(cfg *config.KubeSchedulerConfiguration) []string {
	var out []string
	for _, p := range cfg.Profiles {
		out = append(out, p.SchedulerName)
	}
	return out
}

// The command turns gang scheduling on by default; --feature-gates still
// turns it off. (The only test that builds the command: building it
// twice in one process would change the gates' defaults twice.)
func TestCommandGates(t *testing.T) {
	cmd, _ := command(t)
	if cmd.Use != "kyb-scheduler" {
		t.Errorf("command %q", cmd.Use)
	}
	if err := cmd.PersistentPreRunE(cmd, nil); err != nil {
		t.Fatal(err)
	}
	if !utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload) {
		t.Error("GenericWorkload is off by default")
	}
	if err := cmd.ParseFlags([]string{"--feature-gates=GenericWorkload=false"}); err != nil {
		t.Fatal(err)
	}
	if err := cmd.PersistentPreRunE(cmd, nil); err != nil {
		t.Fatal(err)
	}
	if utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload) {
		t.Error("--feature-gates=GenericWorkload=false left it on")
	}
}

// Defragmentation is off unless a flag turns it on; its flags reach the
// plugin's configuration, and bad ones stop the command before it runs.
func TestDefragmentationFlags(t *testing.T) {
	cmd, defrag := command(t)
	want := room.Defragmentation{Mode: room.Off, EvictionsPerCycle: room.DefaultEvictionsPerCycle}
	if *defrag != want {
		t.Errorf("without flags: %+v, want %+v", *defrag, want)
	}
	if err := cmd.ParseFlags([]string{"--defragmentation=dry-run", "--defragmentation-period=5m", "--defragmentation-evictions-per-cycle=3"}); err != nil {
		t.Fatal(err)
	}
	want = room.Defragmentation{Mode: room.DryRun, Period: 5 * time.Minute, EvictionsPerCycle: 3}
	if *defrag != want {
		t.Errorf("with flags: %+v, want %+v", *defrag, want)
	}
	if err := cmd.ParseFlags([]string{"--defragmentation=aggressive"}); err == nil || !strings.Contains(err.Error(), "want off, on or dry-run") {
		t.Errorf("--defragmentation=aggressive: %v, want an error naming the modes", err)
	}
	if err := cmd.ParseFlags([]string{"--defragmentation=on", "--defragmentation-evictions-per-cycle=0"}); err != nil {
		t.Fatal(err)
	}
	if err := cmd.RunE(cmd, nil); err == nil || !strings.Contains(err.Error(), "--defragmentation-evictions-per-cycle=0") {
		t.Errorf("run with --defragmentation-evictions-per-cycle=0: %v, want an error naming the flag", err)
	}
}

// theCommand is kyb-scheduler's command, made once per process, as
// NewCommand must be (it changes the process's default feature gates).
var theCommand = sync.OnceValues(func() (*commandAndDefrag, error) {
	cmd, defrag, err := newCommand(placement.NewMetrics())
	return &commandAndDefrag{cmd, defrag}, err
})

type commandAndDefrag struct {
	cmd    *cobra.Command
	defrag *room.Defragmentation
}

func command(t *testing.T) (*cobra.Command, *room.Defragmentation) {
	t.Helper()
	c, err := theCommand()
	if err != nil {
		t.Fatal(err)
	}
	return c.cmd, c.defrag
}
