package placement

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/fragmentation"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatview"
)

// onGPUs selects the group of exactly these GPUs.
func onGPUs(gpus string) func(*resourceapi.DeviceRequest) {
	return schedulertest.WithSelector(`device.attributes["gpu.kyb.ai"].gpuIndices == "` + gpus + `"`)
}

// gauges scrapes reg: each kyb_placement gauge's value by name and node
// label ("" for the cluster's).
func gauges(t *testing.T, reg metrics.KubeRegistry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, fam := range families {
		for _, m := range fam.GetMetric() {
			if m.GetGauge() == nil {
				continue
			}
			node := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "node" {
					node = l.GetValue()
				}
			}
			out[fam.GetName()+"/"+node] = m.GetGauge().GetValue()
		}
	}
	return out
}

// The metrics report each node's fragmentation and the cluster's, under
// the scheduler's allocations (in flight included), as they are when
// scraped.
func TestFragmentationMetricsFollowTheAllocations(t *testing.T) {
	reg := metrics.NewKubeRegistry()
	m := NewMetrics()
	reg.CustomMustRegister(m.StableCollectors()...)
	f := newFixture(t, Args{DefaultPolicy: Pack}, threeNodes()...)
	if got := gauges(t, reg); len(got) != 0 {
		t.Errorf("before the scheduler made its plugin: %v, want nothing", got)
	}
	m.measureFrom(klog.FromContext(f.ctx), f.plugin)

	// node-a: seats written on GPUs 0 and 5, both four-GPU groups broken.
	for _, gpu := range []string{"0", "5"} {
		_, claim := f.seatPod(class1x, 1, onGPUs(gpu))
		f.allocate(claim, "node-a", true)
	}
	// node-b: a pair on GPUs 0 and 1, in flight: 4567 still whole.
	_, pair := f.seatPod(class2x, 1, onGPUs("0,1"))
	f.allocate(pair, "node-b", false)
	want := map[string]float64{
		"kyb_placement_free_gpus/node-a": 6, "kyb_placement_fragmented_gpus/node-a": 6, "kyb_placement_largest_group_gpus/node-a": 4,
		"kyb_placement_free_gpus/node-b": 6, "kyb_placement_fragmented_gpus/node-b": 2, "kyb_placement_largest_group_gpus/node-b": 4,
		"kyb_placement_free_gpus/node-c": 8, "kyb_placement_fragmented_gpus/node-c": 0, "kyb_placement_largest_group_gpus/node-c": 4,
		"kyb_placement_cluster_free_gpus/": 20, "kyb_placement_cluster_fragmented_gpus/": 8,
	}
	if got := gauges(t, reg); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("scraped\n%v\nwant\n%v", got, want)
	}

	// A seat on node-c's GPU 3 breaks 0123 there: the next scrape says so.
	_, claim := f.seatPod(class1x, 1, onGPUs("3"))
	f.allocate(claim, "node-c", true)
	want["kyb_placement_free_gpus/node-c"], want["kyb_placement_fragmented_gpus/node-c"] = 7, 3
	want["kyb_placement_cluster_free_gpus/"], want["kyb_placement_cluster_fragmented_gpus/"] = 19, 11
	if got := gauges(t, reg); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after a seat on node-c's GPU 3, scraped\n%v\nwant\n%v", got, want)
	}
}

// Scrapes read the pool cache and the claim tracker while cycles run
// (the race detector watches): the last scrape after the cycles sees
// every seat they placed.
func TestScrapesBesideSchedulingCycles(t *testing.T) {
	reg := metrics.NewKubeRegistry()
	m := NewMetrics()
	reg.CustomMustRegister(m.StableCollectors()...)
	f := newFixture(t, Args{DefaultPolicy: Pack}, threeNodes()...)
	m.measureFrom(klog.FromContext(f.ctx), f.plugin)
	done := make(chan struct{})
	scraped := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-done:
				scraped <- n
				return
			default:
			}
			if _, err := reg.Gather(); err != nil {
				t.Error(err)
			}
			n++
		}
	}()
	placeSeats(t, f, 10, class1x, nil)
	close(done)
	if n := <-scraped; n == 0 {
		t.Error("no scrape ran beside the cycles")
	}
	// Pack: eight seats fill one node, two go to the next.
	if got := gauges(t, reg); got["kyb_placement_cluster_free_gpus/"] != 14 {
		t.Errorf("after ten seats scraped %v, want 14 GPUs free", got)
	}
}

// migAndPairs gives every GPU 1x groups, NVLink pairs, and MIG instances
// on GPU 0.
const migAndPairs = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb, seatsPerGPU: 4}, gpus: [0]}
`

// overprovisioned gives every GPU a 1x group of two seats that consumes
// no counter, beside pairs and four-GPU groups.
const overprovisioned = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2, allowOverprovision: true}
- {resource: kyb.ai/gpu-2x-seat}
- {resource: kyb.ai/gpu-4x-seat}
`

// The scheduler measures what kubectl kyb seats measures, from the same
// slices and claims: each through its own reading of the API objects, one
// definition (package fragmentation).
func TestFragmentationIsKubectlKybSeats(t *testing.T) {
	f := newFixture(t, Args{DefaultPolicy: Pack},
		nodeSpec{"node-a", "dgx-h100", threeProfiles}, nodeSpec{"node-m", "dgx-h100", migAndPairs}, nodeSpec{"node-o", "nvlink-2x4", overprovisioned})
	f.waitFor("the MIG class", func() bool { return f.dra.DeviceClassResolver().GetDeviceClass("kyb.ai/mig-1g.10gb") != nil })
	mig := f.dra.DeviceClassResolver().GetDeviceClass("kyb.ai/mig-1g.10gb").Name
	for _, a := range []struct {
		node, class, gpus string
	}{
		{"node-a", class1x, "0"}, {"node-a", class1x, "5"},
		// A MIG instance holds GPU 0, so that the pair 01 is broken.
		{"node-m", mig, ""}, {"node-m", class2x, "4,5"},
		// Two seats of GPU 0's overprovisioned group hold no GPU.
		{"node-o", class1x, "0"}, {"node-o", class1x, "0"}, {"node-o", class2x, "6,7"},
	} {
		var pin []func(*resourceapi.DeviceRequest)
		if a.gpus != "" {
			pin = append(pin, onGPUs(a.gpus))
		}
		_, claim := f.seatPod(a.class, 1, pin...)
		f.allocate(claim, a.node, true)
	}
	want := map[string]fragmentation.Measure{
		"node-a": {Free: 6, Largest: 4, Inside: 0, Fragmented: 6},
		// GPUs 1, 2, 3, 6, 7 free; pairs 23 and 67 free; GPU 1 outside.
		"node-m": {Free: 5, Largest: 2, Inside: 4, Fragmented: 1},
		// GPUs 0..5 free; 0123 free; 4 and 5 outside.
		"node-o": {Free: 6, Largest: 4, Inside: 4, Fragmented: 2},
	}
	nodes, cluster, err := f.plugin.Fragmentation(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(nodes) != fmt.Sprint(want) || cluster != (fragmentation.Measure{Free: 17, Largest: 4, Inside: 8, Fragmented: 9}) {
		t.Errorf("kyb-scheduler measured %+v, cluster %+v; want %+v", nodes, cluster, want)
	}

	resourceSlices, err := f.client.ResourceV1().ResourceSlices().List(f.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claims, err := f.client.ResourceV1().ResourceClaims("").List(f.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v := seatview.Build(resourceSlices.Items, claims.Items, seatview.Options{})
	for _, n := range v.Nodes {
		if n.Fragmentation != nodes[n.Name] {
			t.Errorf("%s: kubectl kyb seats measures %+v, kyb-scheduler %+v", n.Name, n.Fragmentation, nodes[n.Name])
		}
	}
	if v.Fragmentation != cluster || len(v.Nodes) != len(nodes) {
		t.Errorf("cluster: kubectl kyb seats measures %+v over %d nodes, kyb-scheduler %+v over %d", v.Fragmentation, len(v.Nodes), cluster, len(nodes))
	}
}

// BenchmarkFragmentation is one scrape's measure of the fragmentation on
// clusters of half-full dgx-h100 nodes (four of eight one-GPU seats
// allocated on each): the work of the scrape's goroutine, none of it in a
// scheduling cycle.
func BenchmarkFragmentation(b *testing.B) {
	for _, n := range []int{100, 500} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			f := halfFull(b, n, nil)
			reg := metrics.NewKubeRegistry()
			m := NewMetrics()
			reg.CustomMustRegister(m.StableCollectors()...)
			m.measureFrom(klog.FromContext(f.ctx), f.plugin)
			for b.Loop() {
				families, err := reg.Gather()
				if err != nil {
					b.Fatal(err)
				}
				if len(families) != 5 {
					b.Fatalf("%d families", len(families))
				}
			}
		})
	}
}

// Every kyb-scheduler metric the chart's Grafana dashboard queries
// (kyb_placement_*) is one it serves, with the labels the queries select
// on; the plugin's own test checks the others.
func TestTheDashboardQueriesWhatKybSchedulerServes(t *testing.T) {
	raw, err := os.ReadFile("../../../deployments/helm/kyb-dra-driver/dashboards/kyb-gpu-seats.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	reg := metrics.NewKubeRegistry()
	m := NewMetrics()
	reg.MustRegister(m.Collectors()...)
	reg.CustomMustRegister(m.StableCollectors()...)
	f := newFixture(t, Args{DefaultPolicy: Pack}, threeNodes()...)
	f.plugin.metrics = m
	m.measureFrom(klog.FromContext(f.ctx), f.plugin)
	// A cycle, so that the score's histogram has series too.
	pod, claim := f.seatPod(class1x, 1)
	f.schedule(pod, claim, true)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]map[string]bool{}
	for _, fam := range families {
		set := map[string]bool{"le": true}
		for _, s := range fam.GetMetric() {
			for _, l := range s.GetLabel() {
				set[l.GetName()] = true
			}
		}
		labels[fam.GetName()] = set
	}
	metric := regexp.MustCompile(`\b(kyb_placement_[a-z_]+)(\{([^}]*)\})?`)
	label := regexp.MustCompile(`([a-z_]+)\s*(=~|!=|=)`)
	queries := 0
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			for _, match := range metric.FindAllStringSubmatch(q.Expr, -1) {
				queries++
				name := strings.TrimSuffix(match[1], "_bucket")
				set, ok := labels[name]
				if !ok {
					t.Errorf("panel %q queries %s, which kyb-scheduler does not serve", p.Title, match[1])
					continue
				}
				for _, l := range label.FindAllStringSubmatch(match[3], -1) {
					if !set[l[1]] {
						t.Errorf("panel %q selects %s on label %s, which it does not have", p.Title, name, l[1])
					}
				}
			}
		}
	}
	if queries < 3 {
		t.Errorf("the dashboard queries kyb-scheduler's metrics %d times, want the fragmentation panels' 3 at least", queries)
	}
}
