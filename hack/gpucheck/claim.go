//go:build gpucheck

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-dra-plugin/app"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cdisandbox"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cudaprobe"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/kubelettest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sandbox"
)

// claimRun is the plugin of steps 4 to 6, started in this process as its
// command line starts it, and the claim it prepared.
type claimRun struct {
	cancel context.CancelFunc
	exited chan struct{}
	code   int
	// out is what the plugin printed (on failure only); read once it
	// exited.
	out bytes.Buffer

	kubelet *kubelettest.Kubelet
	claim   *resourceapi.ResourceClaim
	group   *planner.Group
	ids     []string
	spec    string
	// cdi is the plugin's CDI root.
	cdi  string
	once sync.Once
}

// stop stops the plugin and waits for it, at most 30 seconds.
func (r *claimRun) stop() {
	r.once.Do(func() {
		if r.kubelet != nil {
			r.kubelet.Close()
		}
		r.cancel()
		select {
		case <-r.exited:
		case <-time.After(30 * time.Second):
		}
	})
}

// firstOneGPUGroup is the first group of the plan's first profile of
// one-GPU groups.
func firstOneGPUGroup(plan *planner.Plan) (*planner.Group, error) {
	for _, p := range plan.Profiles {
		if p.Size == 1 && len(p.Groups) > 0 {
			return p.Groups[0], nil
		}
	}
	return nil, errors.New("the plan has no profile of one-GPU groups")
}

// startClaim starts the plugin with the node's flags, dirs' and extra,
// registered by this process as the kubelet registers it, and makes a
// claim for a seat of group (of plan, the plugin's plan under those
// flags), which a fake API server holds allocated. The run it returns is
// set even on failure, so that it can be stopped; line is the plugin's
// command line.
func (c *check) startClaim(ctx context.Context, dirs pluginDirs, plan *planner.Plan, group *planner.Group, extra []string) (r *claimRun, line string, err error) {
	uid := uuid.NewUUID()
	claim, err := kubelettest.AllocatedClaim(ctx, plan, c.node.Inv, c.o.node.NodeName, group, "gpu-check", uid)
	if err != nil {
		return nil, "", err
	}
	api := kubelettest.API(c.o.node.NodeName)
	if _, err := api.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		return nil, "", err
	}
	pctx, cancel := context.WithCancel(ctx)
	r = &claimRun{cancel: cancel, exited: make(chan struct{}), claim: claim, group: group,
		spec: filepath.Join(dirs.cdi, cdi.SpecName(uid)+".json"), cdi: dirs.cdi}
	args := slices.Concat(c.nodeArgs(), dirs.args(), []string{"--pod-resources-socket", "", "--container-runtime-socket", ""}, extra)
	line = commandLine("kyb-dra-plugin", args) + " (in this process, with a fake API server)"
	go func() {
		defer close(r.exited)
		r.code = app.RunWithClients(pctx, app.Clients{Prepare: api, Background: api}, args, func(string) string { return "" }, &r.out, &r.out)
	}()
	regCtx, regCancel := context.WithCancel(ctx)
	defer regCancel()
	go func() {
		select {
		case <-r.exited:
			regCancel()
		case <-regCtx.Done():
		}
	}()
	r.kubelet, err = kubelettest.Register(regCtx, dirs.registry, driver.Name, time.Minute)
	select {
	case <-r.exited:
		return r, line, fmt.Errorf("the plugin exited (%d): %s", r.code, strings.TrimSpace(r.out.String()))
	default:
	}
	return r, line, err
}

// prepareClaim prepares the run's claim over the plugin's socket and says
// how long it took.
func (r *claimRun) prepareClaim(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	ids, err := r.kubelet.Prepare(ctx, r.claim)
	if err != nil {
		return 0, err
	}
	r.ids = ids
	return time.Since(start), nil
}

// prepare is step 4: the plugin started on this node, and a claim for a
// seat of the node's first one-GPU group prepared over its socket; then
// what the claim's container sees.
func (c *check) prepare(ctx context.Context) (outcome, error) {
	o := outcome{hardware: "the plugin on the driver's NVML; the probe through the driver's libcuda.so.1 in the claim's container"}
	group, err := firstOneGPUGroup(c.node.Plan)
	if err != nil {
		return o, err
	}
	r, line, err := c.startClaim(ctx, c.dirs, c.node.Plan, group, nil)
	c.claim, o.command = r, line
	if err != nil {
		return o, err
	}
	took, err := r.prepareClaim(ctx)
	if err != nil {
		return o, err
	}
	want := c.groupUUIDs(group)
	o.details = append(o.details,
		fmt.Sprintf("claim %s/%s (%s): a seat of %s (%s), GPUs %v", r.claim.Namespace, r.claim.Name, r.claim.UID, group.Name, group.DeviceName(), want),
		fmt.Sprintf("prepared in %s; CDI devices the kubelet would pass: %s", took.Round(time.Millisecond), strings.Join(r.ids, " ")))

	out, cfg, err := c.sandbox(ctx, r, nil)
	if err != nil {
		return o, fmt.Errorf("probe the claim's container: %w", err)
	}
	res, err := parseProbe(out)
	if err != nil {
		return o, err
	}
	o.details = append(o.details, probeDetails(cfg, res)...)
	o.output, o.logOnly = string(out), true
	if err := seesExactly(res, want); err != nil {
		return o, err
	}
	o.summary = fmt.Sprintf("claim for a seat of %s prepared in %s; its container sees exactly %v and allocates on it", group.DeviceName(), took.Round(time.Millisecond), want)
	return o, nil
}

// seesExactly checks that the probe saw exactly the GPUs want (sorted
// UUIDs) and allocated on each.
func seesExactly(res *cudaprobe.Result, want []string) error {
	saw := make([]string, 0, len(res.Devices))
	for _, d := range res.Devices {
		saw = append(saw, d.UUID)
		if d.MemAlloc != "ok" {
			return fmt.Errorf("the claim's container sees %s but cannot allocate on it: %s", d.UUID, d.MemAlloc)
		}
	}
	slices.Sort(saw)
	switch {
	case res.Error != "":
		return fmt.Errorf("the claim's container sees no GPU: %s", res.Error)
	case !slices.Equal(saw, want):
		return fmt.Errorf("the claim's container sees %v, want its group's %v", saw, want)
	}
	return nil
}

// groupUUIDs are the UUIDs of a group's GPUs, sorted.
func (c *check) groupUUIDs(g *planner.Group) []string {
	var out []string
	for _, x := range g.GPUs {
		out = append(out, c.node.Inv.GPUs[x].UUID)
	}
	slices.Sort(out)
	return out
}

// imageEnv is the environment of a plain image, as the doctor's sandbox
// gives it.
var imageEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// sandbox runs kyb-cuda-probe in the doctor's sandbox, built from the CDI
// devices the plugin answered with (NVIDIA's among them, where the plugin
// takes the driver's files from NVIDIA's spec), with env besides the
// image's.
func (c *check) sandbox(ctx context.Context, r *claimRun, env []string) ([]byte, *sandbox.Config, error) {
	specs := []string{r.spec}
	if slices.ContainsFunc(r.ids, func(id string) bool { return !strings.HasPrefix(id, cdi.Vendor+"/"+cdi.Class+"=") }) {
		for _, dir := range nodesetup.NVIDIACDIDirs(r.cdi) {
			for _, pattern := range []string{"*.json", "*.yaml"} {
				m, _ := filepath.Glob(filepath.Join(dir, pattern))
				specs = append(specs, m...)
			}
		}
	}
	return cdisandbox.Run(ctx, cdisandbox.Options{Specs: specs, Devices: r.ids, Program: filepath.Join(c.o.bin, "kyb-cuda-probe"), BaseEnv: append(slices.Clone(imageEnv), env...)})
}

func parseProbe(out []byte) (*cudaprobe.Result, error) {
	var r cudaprobe.Result
	if err := json.NewDecoder(bytes.NewReader(out)).Decode(&r); err != nil {
		return nil, fmt.Errorf("the probe's output is not its JSON: %w: %.200s", err, out)
	}
	return &r, nil
}

func probeDetails(cfg *sandbox.Config, r *cudaprobe.Result) []string {
	out := []string{"container: " + strings.Join(cfg.Targets(), " ")}
	for _, h := range cfg.Hooks {
		out = append(out, "CDI hook not run: "+h)
	}
	return append(out, r.Lines()...)
}

// unprepare is step 6: the claim unprepared over the socket, its spec
// gone, and the plugin stopped as SIGTERM stops it.
func (c *check) unprepare(ctx context.Context) (outcome, error) {
	if err := c.claim.release(ctx); err != nil {
		return outcome{}, err
	}
	if out, err := c.claim.finish(); err != nil {
		return outcome{output: out}, err
	}
	return outcome{summary: "unprepared; its CDI spec removed; the plugin stopped cleanly"}, nil
}

// release unprepares the run's claim over the socket and checks that its
// CDI spec is gone.
func (r *claimRun) release(ctx context.Context) error {
	if err := r.kubelet.Unprepare(ctx, r.claim); err != nil {
		return err
	}
	if _, err := os.Stat(r.spec); err == nil {
		return fmt.Errorf("the claim's CDI spec %s is still there", r.spec)
	}
	return nil
}

// finish stops the plugin as SIGTERM stops it and checks that it exited
// cleanly; on failure it returns what the plugin printed.
func (r *claimRun) finish() (string, error) {
	r.stop()
	select {
	case <-r.exited:
	default:
		return "", errors.New("the claim is unprepared, but the plugin did not stop within 30s")
	}
	if r.code != 0 {
		return r.out.String(), fmt.Errorf("the claim is unprepared, but the plugin exited %d", r.code)
	}
	return "", nil
}
