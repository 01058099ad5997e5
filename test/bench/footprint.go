package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// FootprintOptions configure the footprint study.
type FootprintOptions struct {
	// Plugin is the plugin binary (bin/kyb-dra-plugin).
	Plugin string
	// Cycles of prepare and unprepare, one claim each.
	Cycles int
	// Held is how many claims are prepared before they are unprepared:
	// they stay prepared until the plugin has written their statuses, a
	// second after the prepare, as a pod's claim does.
	Held int
}

// FootprintGoal is the most resident memory the plugin may use, in MiB.
const FootprintGoal = 40

// Sample is the plugin process's footprint at one moment.
type Sample struct {
	When                     string
	RSSMiB, PeakMiB, HeapMiB float64
	// AnonMiB is the private memory; the rest of RSS is the binary's and
	// libraries' pages, shared with every other process mapping them.
	AnonMiB    float64
	Goroutines int
	// AllocatedMiB is what the Go heap has allocated since start, GCs the
	// collections since start.
	AllocatedMiB float64
	GCs          int
	// CPU is the process's CPU time (user and system) since start.
	CPU time.Duration
}

// FootprintStudy is the plugin's footprint after start and after the
// cycles.
type FootprintStudy struct {
	Options FootprintOptions
	// BinaryMiB is the plugin binary's size.
	BinaryMiB float64
	// GOGC is the plugin's garbage collection target, as its metrics
	// report it.
	GOGC    string
	Samples []Sample
	Elapsed time.Duration
}

// RunFootprint starts the plugin binary on a simulated dgx-h100 node of
// the cluster, as a DaemonSet would (its own process, its own client),
// samples it once its slices are published, drives the prepare/unprepare
// cycles over its socket, and samples it again.
func RunFootprint(ctx context.Context, c *harness.Cluster, opts FootprintOptions) (*FootprintStudy, error) {
	plugin, err := filepath.Abs(opts.Plugin)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(plugin)
	if err != nil {
		return nil, fmt.Errorf("footprint: the plugin binary: %w (make build)", err)
	}
	if err := dropFromPageCache(plugin); err != nil {
		return nil, fmt.Errorf("footprint: %w", err)
	}
	node := c.AddNode(harness.NodeOptions{Name: "footprint-node", Preset: "dgx-h100", NoPlugin: true})
	dir, err := os.MkdirTemp("", "kyb-footprint-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte(PrepareConfig), 0o600); err != nil {
		return nil, err
	}
	port, err := harness.FreePort()
	if err != nil {
		return nil, err
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", port)
	logFile, err := os.Create(filepath.Join(dir, "plugin.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, plugin,
		"--node-name", node.Name, "--kubeconfig", c.Kubeconfig, "--simulate", "dgx-h100", "--config", config,
		"--cdi-root", node.CDIDir, "--kubelet-registrar-directory-path", node.RegistryDir,
		"--kubelet-plugins-directory-path", node.PluginsDir, "--device-plugin-directory-path", node.DevicePluginDir, "--boot-id-file", node.BootIDFile,
		"--metrics-address", metrics, "--kube-api-qps", "100", "--kube-api-burst", "200", "--kube-api-background-qps", "100", "--kube-api-background-burst", "200")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", plugin, err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}()

	start := time.Now()
	var conn drapb.DRAPluginClient
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		conn, err = dialDriver(ctx, node.RegistryDir, driver.Name)
		return err == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("the plugin did not come up: %w (log: %s)", err, tail(logFile.Name()))
	}
	// Slices are published in the background; wait for them.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		m, err := scrape(metrics)
		return err == nil && m["kyb_dra_published_devices"] > 0, nil
	})
	if err != nil {
		return nil, fmt.Errorf("the plugin published nothing: %w", err)
	}
	st := &FootprintStudy{Options: opts, BinaryMiB: float64(fi.Size()) / (1 << 20)}
	settle := func(when string) error {
		time.Sleep(3 * time.Second)
		s, err := sample(cmd.Process.Pid, metrics, when)
		st.Samples = append(st.Samples, s)
		return err
	}
	if err := settle("after start, slices published"); err != nil {
		return nil, err
	}
	if m, err := scrape(metrics); err == nil {
		st.GOGC = fmt.Sprint(m["go_gc_gogc_percent"])
	}

	// Claims allocated on the node and reserved for pods, cycled through.
	plan, inv, _, err := Plan(ctx, "dgx-h100", node.Name, PrepareConfig)
	if err != nil {
		return nil, err
	}
	alloc := schedulertest.New(schedulertest.SchedulerFeatures())
	alloc.AddNode(node.Name, draresources.Resources(plan, inv, node.Name, draresources.LayoutShared), driver.Name)
	alloc.AddClasses(draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{})...)
	class := draresources.DeviceClassName(plan.Profile("1x").Resource)
	e := &prepareEnv{c: c}
	var claims []*benchClaim
	for i := 0; i < max(opts.Held, 1); i++ {
		name := fmt.Sprintf("fp%03d", i)
		r, err := alloc.Allocate(ctx, schedulertest.Claim(name, class, 1), node.Name)
		if err != nil || r == nil {
			return nil, fmt.Errorf("allocate %s: %v", name, err)
		}
		claim := schedulertest.Claim(name, class, 1)
		claim.UID = ""
		claim.Status.Allocation = r
		bc := &benchClaim{claim: claim, pod: footprintPod(name, claim.Name)}
		if err := e.store(ctx, bc); err != nil {
			return nil, err
		}
		claims = append(claims, bc)
	}
	// Twice Cycles cycles, sampled after each half: what the first half
	// adds is warm-up (allocator arenas, the client's connection); a leak
	// grows in the second half as well.
	for half := 1; half <= 2; half++ {
		for done := 0; done < opts.Cycles; {
			k := min(len(claims), opts.Cycles-done)
			if err := footprintRound(ctx, conn, metrics, claims[:k]); err != nil {
				return nil, fmt.Errorf("cycle %d: %w", (half-1)*opts.Cycles+done, err)
			}
			done += k
		}
		if err := settle(fmt.Sprintf("after %d prepare/unprepare cycles", half*opts.Cycles)); err != nil {
			return nil, err
		}
	}
	st.Elapsed = time.Since(start)
	return st, nil
}

// clockTicks is the kernel's USER_HZ, the unit of /proc's CPU times: 100
// on every Linux architecture Go supports.
const clockTicks = 100

// footprintRound prepares claims one call each, waits until the plugin
// has written their statuses, and unprepares them: a cycle per claim.
func footprintRound(ctx context.Context, conn drapb.DRAPluginClient, metrics string, claims []*benchClaim) error {
	before, err := scrape(metrics)
	if err != nil {
		return err
	}
	for _, bc := range claims {
		resp, err := conn.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claimRef(bc)}})
		if err != nil {
			return fmt.Errorf("prepare: %w", err)
		}
		if err := checkPrepared(resp, bc); err != nil {
			return err
		}
	}
	const written = "kyb_dra_claim_statuses_written_total"
	want := before[written] + float64(len(claims))
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, false, func(ctx context.Context) (bool, error) {
		m, err := scrape(metrics)
		return err == nil && m[written] >= want, nil
	})
	if err != nil {
		return fmt.Errorf("the plugin did not write the statuses of %d claims: %w", len(claims), err)
	}
	for _, bc := range claims {
		un, err := conn.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{claimRef(bc)}})
		if err != nil {
			return fmt.Errorf("unprepare: %w", err)
		}
		if r := un.Claims[string(bc.claim.UID)]; r == nil || r.Error != "" {
			return fmt.Errorf("unprepare: %v", r)
		}
	}
	return nil
}

// sample reads the process's memory from /proc and the runtime's figures
// from its metrics endpoint, if it has one ("" for none).
func sample(pid int, metrics, when string) (Sample, error) {
	s := Sample{When: when}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, val, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(val)
		if len(fields) == 0 {
			continue
		}
		kb, _ := strconv.ParseFloat(fields[0], 64)
		switch key {
		case "VmRSS":
			s.RSSMiB = kb / 1024
		case "VmHWM":
			s.PeakMiB = kb / 1024
		case "RssAnon":
			s.AnonMiB = kb / 1024
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// Fields 14 and 15 (utime, stime) in clock ticks, counted after the
	// command name, which may hold spaces but ends with the last ')'.
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 {
		if f := strings.Fields(string(stat[i+1:])); len(f) > 12 {
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			s.CPU = time.Duration(ut+st) * time.Second / clockTicks
		}
	}
	if metrics == "" {
		// A binary without a metrics endpoint (the shim): /proc only.
		return s, nil
	}
	m, err := scrape(metrics)
	if err != nil {
		return s, err
	}
	s.Goroutines = int(m["go_goroutines"])
	s.AllocatedMiB = m["go_memstats_alloc_bytes_total"] / (1 << 20)
	s.GCs = int(m["go_gc_duration_seconds_count"])
	s.HeapMiB = m["go_memstats_heap_inuse_bytes"] / (1 << 20)
	return s, nil
}

// scrape reads the unlabelled samples of a metrics endpoint.
func scrape(addr string) (map[string]float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err == nil {
			out[name] += v
		}
	}
	return out, sc.Err()
}

// dropFromPageCache writes the file out and drops its pages from the page
// cache, so that the plugin starts as on a node that has just pulled it.
// Most of the plugin's RSS is its binary's pages, and how many of them a
// start maps depends on how they came into the cache: a binary fresh from
// the linker, still dirty in the cache, measured up to 8 MiB more than the
// same binary read from the disk.
func dropFromPageCache(file string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write %s out: %w", file, err)
	}
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("drop %s from the page cache: %w", file, err)
	}
	return nil
}

func tail(file string) string {
	data, _ := os.ReadFile(file)
	if len(data) > 2000 {
		data = data[len(data)-2000:]
	}
	return string(data)
}

// Table summarises the study.
func (st *FootprintStudy) Table() *Table {
	t := &Table{
		Title:  fmt.Sprintf("Plugin footprint (bin/kyb-dra-plugin, %.1f MiB, started from a cold page cache; simulated dgx-h100, 64 one-GPU seats)", st.BinaryMiB),
		Header: []string{"when", "RSS", "of it private (anon)", "peak RSS", "Go heap in use", "goroutines", "goal RSS ≤ 40 MiB"},
	}
	for _, s := range st.Samples {
		t.Rows = append(t.Rows, []string{s.When, fmt.Sprintf("%.1f MiB", s.RSSMiB), fmt.Sprintf("%.1f MiB", s.AnonMiB), fmt.Sprintf("%.1f MiB", s.PeakMiB),
			fmt.Sprintf("%.1f MiB", s.HeapMiB), fmt.Sprint(s.Goroutines), Verdict(s.RSSMiB <= FootprintGoal)})
	}
	if n := len(st.Samples); n == 3 {
		a, b, c := st.Samples[0], st.Samples[1], st.Samples[2]
		t.Notes = append(t.Notes, fmt.Sprintf("Growth over the first %d cycles: RSS %+.1f MiB, heap %+.1f MiB, goroutines %+d; "+
			"over the next %d: RSS %+.1f MiB, heap %+.1f MiB, goroutines %+d. "+
			"Each cycle prepares one claim over the plugin's socket (checkpoint, CDI spec) and unprepares it once the plugin has written its status; %d claims are held at a time. "+
			"Over the second %d cycles the plugin used %s of CPU per cycle, allocated %.0f KiB per cycle and collected garbage %d times (GOGC %s).",
			st.Options.Cycles, b.RSSMiB-a.RSSMiB, b.HeapMiB-a.HeapMiB, b.Goroutines-a.Goroutines,
			st.Options.Cycles, c.RSSMiB-b.RSSMiB, c.HeapMiB-b.HeapMiB, c.Goroutines-b.Goroutines, st.Options.Held,
			st.Options.Cycles, Dur((c.CPU-b.CPU)/time.Duration(st.Options.Cycles)), (c.AllocatedMiB-b.AllocatedMiB)*1024/float64(st.Options.Cycles), c.GCs-b.GCs, st.GOGC))
	}
	return t
}

// footprintPod is the pod a footprint claim is reserved for: bound to a
// node without a kubelet, so nothing runs it.
func footprintPod(name, claim string) *v1.Pod {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p" + name, Namespace: "default"}}
	pod.Spec.NodeName = "no-kubelet"
	pod.Spec.Containers = []v1.Container{{Name: "c", Image: "pause"}}
	pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}}
	return pod
}
