package draplugin_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// The crash soak with MIG seats among the claims: the plugin child makes
// and destroys MIG instances on simulated GPUs and is SIGKILLed between
// its NVML calls as well as at the plugin's own steps, beside an instance
// an administrator made before the plugin ever started.
//
// A real GPU keeps its instances when the plugin dies; the simulated one
// lives in the child. The child writes the node's MIG state
// (simnode.MIGState) to a file at every step it may be killed at, every
// MIG step and plugin hook, and at its exit, and the next child restores
// it: what the next child finds is what the GPUs held when the last one
// died. The plugin's NVML calls are serialised, so no call is under way
// when a step is passed.

// migCrashConfig gives GPUs 0 and 1 to 1g.10gb MIG seats beside the
// whole-GPU seats: a GPU's seats of either kind exclude the other kind's
// through the published counters.
const migCrashConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0, 1]}
`

// migStep is the crash point of a step of miginstance (its Options.Step
// names).
func migStep(step string) draplugin.HookPoint { return draplugin.HookPoint("mig: " + step) }

// The steps of making an instance, in order, and of destroying one.
var (
	migPrepareSteps = []string{"SetMigMode", "record creating", "CreateGpuInstanceWithPlacement", "GpuInstance.GetInfo", "record GPU instance",
		"GetComputeInstanceProfileInfo", "record compute instance", "CreateComputeInstance", "ComputeInstance.GetInfo", "read MIG UUID", "record created"}
	migUnprepareSteps = []string{"find GPU instance", "ComputeInstance.Destroy", "GpuInstance.Destroy", "forget destroyed"}
)

// childMIGState is the simulated node's MIG state file in a crash child.
type childMIGState struct {
	sim  *simnode.Node
	file string
	mu   sync.Mutex
}

// childMIG restores the node's MIG state from file, if any was written.
// With file "" it keeps nothing.
func childMIG(sim *simnode.Node, file string) (*childMIGState, error) {
	if file == "" {
		return nil, nil
	}
	raw, err := os.ReadFile(file)
	if err == nil {
		var st simnode.MIGState
		if err := json.Unmarshal(raw, &st); err != nil {
			return nil, fmt.Errorf("MIG state %s: %w", file, err)
		}
		if err := sim.RestoreMIG(st); err != nil {
			return nil, fmt.Errorf("MIG state %s: %w", file, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return &childMIGState{sim: sim, file: file}, nil
}

// save writes the node's MIG state, whole or not at all (a rename).
func (c *childMIGState) save() {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := writeMIGState(c.file, c.sim.MIGState()); err != nil {
		panic(err) // the child's state is the test's: it cannot go on without it
	}
}

func writeMIGState(file string, st simnode.MIGState) error {
	raw, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// migAccount counts, from the GPUs' MIG state and what the containers of
// the live claims were given, the instances no live claim holds (leaked)
// and the administrator's instances that are gone (destroyed).
type migAccount struct {
	file    string
	foreign []string
	leaked  map[string]bool
	gone    map[string]bool
	// fenced counts the prepares refused for a fence (see crashRig.fenced).
	fenced int
}

// fenced plays the kubelet and the user after a prepare refused for a
// fence: a rebuilt checkpoint does not recover a MIG seat from its spec,
// which names the instance and not the GPU (docs/design.md), so such a
// claim is fenced, on every GPU of the node. Its pods are deleted as the
// error asks (the kubelet unprepares it); a claim refused for another
// claim's fence is prepared again once that claim is released. fenced is
// false for any other error.
func (r *crashRig) fenced(c *resourceapi.ResourceClaim, msg string) (ok, fenced bool) {
	r.t.Helper()
	if strings.Contains(msg, "this claim holds could not be recovered after the plugin's checkpoint was lost") {
		r.mig.fenced++
		return r.call("unprepare", c), true
	}
	_, rest, found := strings.Cut(msg, " are fenced by claim ")
	if !found {
		return false, false
	}
	_, rest, _ = strings.Cut(rest, " (")
	uid, _, _ := strings.Cut(rest, ")")
	i := slices.IndexFunc(r.claims, func(o *resourceapi.ResourceClaim) bool { return string(o.UID) == uid })
	if i < 0 {
		r.t.Fatalf("prepare %s: fenced by an unknown claim %q: %s", c.Name, uid, msg)
	}
	r.mig.fenced++
	if !r.call("unprepare", r.claims[i]) {
		return false, true
	}
	return r.call("prepare", c), true
}

// liveMIG are the GPU instances of a MIG state, each keyed "GPU g
// profile p@{start}:size" and its MIG devices' UUIDs, with those UUIDs.
func liveMIG(st simnode.MIGState) map[string][]string {
	out := map[string][]string{}
	for _, g := range st.GPUs {
		for _, gi := range g.Instances {
			key := fmt.Sprintf("GPU %d profile %d@{%d}:%d", g.Index, gi.ProfileID, gi.Start, gi.Size)
			var uuids []string
			for _, ci := range gi.ComputeInstances {
				uuids = append(uuids, ci.UUID)
			}
			out[key+" "+strings.Join(uuids, ",")] = uuids
		}
	}
	return out
}

// withForeignMIG gives the plugin the node's NVML and, before its first
// start, turns MIG mode on on GPU 0 and makes an administrator's 1g.10gb
// instance at {0}:1 with its compute instance, and a bare GPU instance at
// {1}:1, where the claims' allocations do not go.
func withForeignMIG(t testing.TB, r *crashRig) {
	sim, err := simnode.Load(r.spec.Preset, nodeName)
	if err != nil {
		t.Fatal(err)
	}
	dev, _ := sim.NVML().DeviceGetHandleByIndex(0)
	if act, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS || act != nvml.SUCCESS {
		t.Fatal(act, ret)
	}
	info, _ := dev.GetGpuInstanceProfileInfo(nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 1})
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	ciInfo, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if _, ret := gi.CreateComputeInstance(&ciInfo); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 1, Size: 1}); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	for _, c := range r.claims {
		for _, res := range c.Status.Allocation.Devices.Results {
			if strings.HasPrefix(res.Device, "g0-mig-") && (strings.HasSuffix(res.Device, "-0") || strings.HasSuffix(res.Device, "-1")) {
				t.Fatalf("claim %s was allocated %s, where the administrator's instances are", c.Name, res.Device)
			}
		}
	}
	st := sim.MIGState()
	r.spec.MIGState = filepath.Join(r.dir, "mig-state.json")
	if err := writeMIGState(r.spec.MIGState, st); err != nil {
		t.Fatal(err)
	}
	r.mig = &migAccount{file: r.spec.MIGState, leaked: map[string]bool{}, gone: map[string]bool{}}
	for key := range liveMIG(st) {
		r.mig.foreign = append(r.mig.foreign, key)
	}
	slices.Sort(r.mig.foreign)
}

// specMIGDevices are the MIG devices a claim's containers were given.
func (r *crashRig) specMIGDevices(uid types.UID) []string {
	r.t.Helper()
	raw, err := os.ReadFile(filepath.Join(r.spec.CDIDir, cdi.SpecName(uid)+".json"))
	if err != nil {
		r.t.Fatalf("claim %s has no CDI spec: %v", uid, err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, d := range spec.Devices {
		for _, kv := range d.ContainerEdits.Env {
			if v, ok := strings.CutPrefix(kv, "CUDA_VISIBLE_DEVICES="); ok {
				for _, id := range strings.Split(v, ",") {
					if strings.HasPrefix(id, "MIG-") && !slices.Contains(out, id) {
						out = append(out, id)
					}
				}
			}
		}
	}
	return out
}

// checkMIG compares the GPUs' MIG state with the kubelet's view: no
// group the checkpoint holds shares a GPU with a MIG device it holds,
// every MIG device a live claim's container was given exists and was
// given to that claim alone, every instance is a live claim's or the
// administrator's, and the administrator's are all there.
func (r *crashRig) checkMIG(held []*planner.Group, migHeld []string) {
	r.t.Helper()
	migGPU := map[string]int{}
	for _, d := range r.plan.MIGDevices() {
		migGPU[d.DeviceName()] = d.GPU.Index()
	}
	for _, name := range migHeld {
		gpu, ok := migGPU[name]
		if !ok {
			r.t.Fatalf("the checkpoint holds %s, which is neither a group nor a MIG device of the plan", name)
		}
		for _, g := range held {
			if slices.Contains(g.GPUs, gpu) {
				r.t.Fatalf("group %s and MIG device %s share GPU %d but are both in use", g.DeviceName(), name, gpu)
			}
		}
	}
	raw, err := os.ReadFile(r.mig.file)
	if err != nil {
		r.t.Fatal(err)
	}
	var st simnode.MIGState
	if err := json.Unmarshal(raw, &st); err != nil {
		r.t.Fatal(err)
	}
	live := liveMIG(st)
	exists := map[string]bool{}
	for _, uuids := range live {
		for _, u := range uuids {
			exists[u] = true
		}
	}
	given := map[string]types.UID{}
	for uid := range r.prepared {
		for _, u := range r.specMIGDevices(uid) {
			if other, twice := given[u]; twice && other != uid {
				r.doubled++
				r.t.Errorf("MIG device %s was given to claims %s and %s", u, other, uid)
			}
			given[u] = uid
			if !exists[u] {
				r.lost++
				r.t.Errorf("claim %s's container was given MIG device %s, which the GPUs do not have", uid, u)
			}
		}
	}
	for _, key := range r.mig.foreign {
		if _, ok := live[key]; !ok && !r.mig.gone[key] {
			r.mig.gone[key] = true
			r.t.Errorf("the administrator's instance %s was destroyed", key)
		}
	}
	for key, uuids := range live {
		if slices.Contains(r.mig.foreign, key) || slices.ContainsFunc(uuids, func(u string) bool { _, ok := given[u]; return ok }) {
			continue
		}
		if !r.mig.leaked[key] {
			r.mig.leaked[key] = true
			r.t.Errorf("instance %s is held by no live claim", key)
		}
	}
}

// TestRandomMIGCrashes is TestRandomCrashes on a node whose GPUs 0 and 1
// have MIG seats beside whole-GPU seats, with crashes between the NVML
// calls that make and destroy the instances as well, beside an
// administrator's instances. KYB_MIG_CRASH_ITERATIONS sets the count
// (make soak runs 300), KYB_CRASH_SEED the seed. It ends with the seats doubled and lost (MIG devices given to
// two live claims, or that do not exist, among them), the instances no
// live claim holds (leaked) and the administrator's instances destroyed:
// all must be 0.
func TestRandomMIGCrashes(t *testing.T) {
	iterations := 40
	if s := os.Getenv("KYB_MIG_CRASH_ITERATIONS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("KYB_MIG_CRASH_ITERATIONS=%q: %v", s, err)
		}
		iterations = n
	}
	seed := time.Now().UnixNano()
	if s := os.Getenv("KYB_CRASH_SEED"); s != "" {
		seed, _ = strconv.ParseInt(s, 10, 64)
	}
	t.Logf("seed %d (set KYB_CRASH_SEED to repeat)", seed)
	r := newCrashRigOn(t, crashNode{preset: "dgx-h100", config: migCrashConfig, mig: withForeignMIG,
		classes: []string{classMIG1g, classMIG1g, class1x, classMIG1g, class1x, classMIG1g, class1x, classMIG1g, class1x, classMIG1g},
		// Three MIG seats on GPU 0, beside the administrator's instances,
		// and three on GPU 1, whose MIG mode the first of them turns on.
		claim: func(i int, c *resourceapi.ResourceClaim) {
			gpu := map[int]string{0: "1", 3: "1", 7: "1", 1: "0", 5: "0", 9: "0"}[i]
			if gpu == "" {
				return
			}
			req := c.Spec.Devices.Requests[0].Exactly
			req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.attributes["gpu.kyb.ai"].gpuIndices == "` + gpu + `"`}})
		}})
	prepare, unprepare := slices.Clone(prepareCrashPoints), slices.Clone(unprepareCrashPoints)
	for _, s := range migPrepareSteps {
		prepare = append(prepare, migStep(s))
	}
	for _, s := range migUnprepareSteps {
		unprepare = append(unprepare, migStep(s))
	}
	r.soak(rand.New(rand.NewSource(seed)), iterations, prepare, unprepare)
	// The last child's exit writes the GPUs' state as it left them.
	r.stop()
	r.check()
	t.Logf("prepares refused for a claim fenced by a rebuilt checkpoint (its pods then deleted): %d", r.mig.fenced)
	t.Logf("seats doubled: %d, seats lost: %d, MIG instances leaked: %d, foreign instances destroyed: %d",
		r.doubled, r.lost, len(r.mig.leaked), len(r.mig.gone))
}
