package draplugin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/bootid"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/migseats"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// The crash tests run the plugin in a child process: this test binary,
// started again with KYB_CRASH_CHILD set. The child serves the plugin on
// the directories it is given, with a fake API server holding the claims
// the parent wrote, and kills itself with SIGKILL (no deferred code, no
// flushing: a real crash) the Nth time it passes the chosen step.

// childSpec is what the parent tells the child.
type childSpec struct {
	Preset      string                      `json:"preset"`
	Config      string                      `json:"config"`
	RegDir      string                      `json:"regDir"`
	PluginDir   string                      `json:"pluginDir"`
	CDIDir      string                      `json:"cdiDir"`
	BootIDFile  string                      `json:"bootIDFile"`
	Claims      []resourceapi.ResourceClaim `json:"claims"`
	CrashAt     draplugin.HookPoint         `json:"crashAt,omitempty"`
	CrashOnPass int                         `json:"crashOnPass,omitempty"`
	// MIGState, where set, gives the plugin the simulated node's NVML to
	// make MIG instances with, and is the file the node's MIG state lives
	// in from one child to the next (see migsoak_crash_test.go). CrashAt
	// may then name a step of the making or destruction of an instance
	// (migStep).
	MIGState string `json:"migState,omitempty"`
}

func TestMain(m *testing.M) {
	if spec := os.Getenv("KYB_CRASH_CHILD"); spec != "" {
		os.Exit(runCrashChild(spec))
	}
	os.Exit(m.Run())
}

func runCrashChild(specFile string) int {
	raw, err := os.ReadFile(specFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var spec childSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())
	sim, err := simnode.Load(spec.Preset, nodeName)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	inv, err := inventory.Discover(ctx, sim.NVML(), sim.PCIe())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	cfg, _, err := v1alpha1.LoadNodeConfig([]byte(spec.Config), "config")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	plan, err := planner.New(inv, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	objs := []runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "node-uid"}}}
	for i := range spec.Claims {
		objs = append(objs, &spec.Claims[i])
	}
	gpus, err := childMIG(sim, spec.MIGState)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	passes := 0
	hook := func(p draplugin.HookPoint) {
		gpus.save()
		if p != spec.CrashAt {
			return
		}
		if passes++; passes == spec.CrashOnPass {
			if err := syscall.Kill(os.Getpid(), syscall.SIGKILL); err != nil {
				panic(err)
			}
			select {} // never returns
		}
	}
	boot, err := bootid.Read(spec.BootIDFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	opts := draplugin.Options{
		NodeName: nodeName, Client: newFakeClient(objs...), Inventory: inv, Plan: plan,
		Containers: draplugin.ContainerOptions{Edits: containeredits.Options{DeviceNumbers: sim.DeviceNumbers}},
		Dirs:       draplugin.Dirs{CDI: spec.CDIDir, PluginData: spec.PluginDir, Registrar: spec.RegDir}, BootID: boot,
		Hooks: hook,
	}
	if spec.MIGState != "" {
		opts.MIG = migseats.Options{NVML: sim.NVML(), Minors: func() ([]byte, error) { return sim.MIGMinorsFile(), nil },
			Step: func(step string) bool { hook(migStep(step)); return false }}
	}
	d, err := draplugin.Start(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready " + strconv.Itoa(os.Getpid()))
	<-ctx.Done()
	d.Stop()
	gpus.save()
	return 0
}
