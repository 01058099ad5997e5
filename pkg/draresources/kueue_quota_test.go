package draresources_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// What Kueue's quota charges for sized seats on each of its DRA paths,
// with the mappings docs/quotas.md shows, over the slices and classes the
// plugin publishes, beside what the scheduler's allocator consumes for the
// same claims.

const (
	quotaMemory   = "kyb.ai/gpu-memory"
	quotaMemory2x = "kyb.ai/gpu-memory-2x"
	// Two sized groups of one GPU, so that a request for two seats fits
	// on one node (the allocator gives one request's seats distinct
	// devices), and one of two. An H200 has 143771 MiB.
	quotaConfig = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 8
  gpus: [0, 1]
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-2x-sized
  seatsPerGroup: 4
  gpus: [2, 3]
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  gpus: [4]
  sharing: {strategy: mps}
`
)

// quotaNode is a simulated node of a cluster: its name, preset and node
// configuration.
type quotaNode struct{ name, preset, config string }

func (n quotaNode) with(config string) quotaNode { n.config = config; return n }

// quotaCluster is a cluster of simulated nodes as the plugin publishes
// them, and the DeviceClasses of their profiles.
type quotaCluster struct {
	*schedulertest.Cluster
	classes []*resourceapi.DeviceClass
}

// newQuotaCluster publishes nodes, which share their profiles (the first
// node's make the classes).
func newQuotaCluster(t *testing.T, nodes ...quotaNode) quotaCluster {
	t.Helper()
	c := quotaCluster{Cluster: schedulertest.New(schedulertest.SchedulerFeatures())}
	for i, n := range nodes {
		sn := simnodetest.New(t, n.preset, n.config)
		c.AddNode(n.name, draresources.Resources(sn.Plan, sn.Inv, n.name, draresources.LayoutShared), driver.Name)
		if i == 0 {
			c.classes = draresources.DeviceClasses(sn.Plan.Profiles, draresources.DeviceClassOptions{ExtendedResources: true})
			c.AddClasses(c.classes...)
		}
	}
	return c
}

// kueue counts with the documented configuration of a path over what the
// cluster publishes.
func (c quotaCluster) kueue(t *testing.T, path string) *kueue {
	t.Helper()
	cfg, ok := documentedKueueConfigurations(t)[path]
	if !ok {
		t.Fatalf("docs/quotas.md shows no Kueue Configuration of the %s path", path)
	}
	return newKueue(cfg, c.Slices(), c.classes)
}

var (
	h200 = quotaNode{"node-1", "dgx-h200", quotaConfig}
	h100 = quotaNode{"node-2", "dgx-h100", quotaConfig}
)

// sizedClaim is a claim of the tests: its class, its count and what its
// request asks of each capacity ("" for nothing).
type sizedClaim struct {
	class           string
	count           int64
	memory, compute string
}

func (s sizedClaim) claim(name string) *resourceapi.ResourceClaim {
	return schedulertest.Claim(name, s.class, s.count, size(s.memory, s.compute)...)
}

// consumedMemory is the memory an allocation's results consumed, summed.
func consumedMemory(t *testing.T, r *resourceapi.AllocationResult) int64 {
	t.Helper()
	var sum int64
	for _, d := range r.Devices.Results {
		q, ok := d.ConsumedCapacity[draresources.MemoryCapacity]
		if !ok {
			t.Fatalf("%s: the allocation result names no consumed memory", d.Device)
		}
		sum += q.Value()
	}
	return sum
}

func gib(s string) int64 { q := resource.MustParse(s); return q.Value() }

// render writes a charge by quota resource in binary units, sorted:
// "kyb.ai/gpu-memory=20Gi".
func render(charge map[string]int64) string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(charge)) {
		out = append(out, fmt.Sprintf("%s=%s", name, resource.NewQuantity(charge[name], resource.BinarySI).String()))
	}
	return strings.Join(out, " ")
}

// The capacity path charges each claim the memory the allocator gives it,
// to the byte, off the step and below the minimum included: the test that
// fails when what the driver publishes and the mapping part.
func TestKueueCapacityPathChargesWhatTheAllocatorConsumes(t *testing.T) {
	c := newQuotaCluster(t, h200)
	k := c.kueue(t, "capacity")
	tests := []struct {
		name  string
		claim sizedClaim
		want  string // Kueue's charge, written out by hand
	}{
		{"as asked", sizedClaim{classSized, 1, "20Gi", "25"}, quotaMemory + "=20Gi"},
		{"nothing asked: the default, the equal share", sizedClaim{classSized, 1, "", ""}, quotaMemory + "=17Gi"},
		{"memory only", sizedClaim{classSized, 1, "8Gi", ""}, quotaMemory + "=8Gi"},
		{"off the step: rounded up by both", sizedClaim{classSized, 1, "20.5Gi", "12.5"}, quotaMemory + "=21Gi"},
		{"below the minimum: the minimum", sizedClaim{classSized, 1, "100Mi", ""}, quotaMemory + "=1Gi"},
		{"two seats, on two groups", sizedClaim{classSized, 2, "10Gi", ""}, quotaMemory + "=20Gi"},
		{"a 2x group: memory per GPU", sizedClaim{classSized2x, 1, "30Gi", "50"}, quotaMemory2x + "=30Gi"},
		{"a 2x group, nothing asked", sizedClaim{classSized2x, 1, "", ""}, quotaMemory2x + "=35Gi"},
	}
	charged, consumed := map[string]int64{}, map[string]int64{}
	for i, tc := range tests {
		claim := tc.claim.claim(fmt.Sprintf("c%d", i))
		charge, err := k.charge(ctx, claim.Spec)
		if err != nil {
			t.Fatalf("%s: Kueue refuses: %v", tc.name, err)
		}
		r, err := c.Allocate(ctx, claim, "node-1")
		if err != nil || r == nil {
			t.Fatalf("%s: does not fit (%v)", tc.name, err)
		}
		if got := render(charge); got != tc.want {
			t.Errorf("%s: Kueue charges %s, want %s", tc.name, got, tc.want)
		}
		for name, v := range charge {
			if used := consumedMemory(t, r); v != used {
				t.Errorf("%s: Kueue charges %s %d bytes, the allocator consumed %d", tc.name, name, v, used)
			}
			charged[name] += v
			consumed[name] += consumedMemory(t, r)
		}
	}
	want := map[string]int64{quotaMemory: gib("87Gi"), quotaMemory2x: gib("65Gi")}
	for name, v := range want {
		if charged[name] != v || consumed[name] != v {
			t.Errorf("%s: Kueue charged %d bytes in all, the allocator consumed %d, want %d", name, charged[name], consumed[name], v)
		}
	}
}

// The other paths count claims, not sizes, and the counter path cannot
// even do that for a group without the counter it names.
func TestKueuePathsCountSizedSeatsAsDocumented(t *testing.T) {
	c := newQuotaCluster(t, h200)
	claims := []sizedClaim{
		{classSized, 1, "20Gi", "25"},
		{classSized, 1, "", ""},
		{classSized, 1, "100Gi", "75"},
		{classSized, 2, "10Gi", ""},
		{classSized2x, 1, "30Gi", "50"},
	}
	tests := []struct {
		path string
		want []string
	}{
		{"device count", []string{
			"kyb.ai/gpu-1x-sized=1", "kyb.ai/gpu-1x-sized=1", "kyb.ai/gpu-1x-sized=1", "kyb.ai/gpu-1x-sized=2",
			"kyb.ai/gpu-2x-sized=1",
		}},
		{"counter", []string{
			"kyb.ai/gpu0=1", "kyb.ai/gpu0=1", "kyb.ai/gpu0=1", "kyb.ai/gpu0=2",
			`refused: mapping kyb.ai/gpu0: matched devices have no consumesCounters entry for counter "gpu0"`,
		}},
		{"capacity", []string{
			quotaMemory + "=20Gi", quotaMemory + "=17Gi", quotaMemory + "=100Gi", quotaMemory + "=20Gi",
			quotaMemory2x + "=30Gi",
		}},
	}
	for _, tc := range tests {
		k := c.kueue(t, tc.path)
		for i, cl := range claims {
			got := "refused: "
			charge, err := k.charge(ctx, cl.claim("c").Spec)
			if err == nil {
				got = render(charge)
			} else {
				got += err.Error()
			}
			if got != tc.want[i] {
				t.Errorf("%s path, claim %+v: %s, want %s", tc.path, cl, got, tc.want[i])
			}
		}
	}
}

// Kueue charges before the scheduler picks a device: a claim that names
// no memory is charged the largest default among the class's devices of
// the whole cluster. Where nodes publish different defaults, that is more
// than the claim holds on a smaller GPU; a default set in the node
// configuration is the same everywhere, and so is a size the claim names.
func TestKueueChargesTheLargestDefaultInTheCluster(t *testing.T) {
	fixedDefault := strings.Replace(quotaConfig, "sharing: {strategy: mps, sized: true}\n- resource: kyb.ai/gpu-2x-sized",
		"sharing: {strategy: mps, sized: true, sizes: {memory: {default: 8Gi}}}\n- resource: kyb.ai/gpu-2x-sized", 1)
	if fixedDefault == quotaConfig {
		t.Fatal("the 1x profile of the configuration moved: set its default again")
	}
	tests := []struct {
		name           string
		nodes          []quotaNode
		claim          sizedClaim
		charge         string
		onH200, onH100 string // what the allocator consumes on node-1 and on node-2
	}{
		{"equal shares of an H200 and an H100", []quotaNode{h200, h100}, sizedClaim{classSized, 1, "", ""}, "17Gi", "17Gi", "9Gi"},
		{"a default in the configuration", []quotaNode{h200.with(fixedDefault), h100.with(fixedDefault)}, sizedClaim{classSized, 1, "", ""}, "8Gi", "8Gi", "8Gi"},
		{"a size the claim names", []quotaNode{h200, h100}, sizedClaim{classSized, 1, "12Gi", ""}, "12Gi", "12Gi", "12Gi"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newQuotaCluster(t, tc.nodes...)
			charge, err := c.kueue(t, "capacity").charge(ctx, tc.claim.claim("a").Spec)
			if err != nil {
				t.Fatal(err)
			}
			if got := resource.NewQuantity(charge[quotaMemory], resource.BinarySI).String(); got != tc.charge {
				t.Errorf("Kueue charges %s, want %s", got, tc.charge)
			}
			for node, want := range map[string]string{"node-1": tc.onH200, "node-2": tc.onH100} {
				r, err := c.Allocate(ctx, tc.claim.claim("on-"+node), node)
				if err != nil || r == nil {
					t.Fatalf("%s: does not fit (%v)", node, err)
				}
				if got := resource.NewQuantity(consumedMemory(t, r), resource.BinarySI).String(); got != want {
					t.Errorf("%s: the allocator consumed %s, want %s", node, got, want)
				}
			}
		})
	}
}

// The capacity's name is matched literally, in the slices and in the
// claim: this driver publishes memory without a domain.
func TestKueueCapacityNameIsTheUnqualifiedOne(t *testing.T) {
	c := newQuotaCluster(t, h200)
	k := c.kueue(t, "capacity")
	qualified := string(driver.Name) + "/" + string(draresources.MemoryCapacity)
	for i := range k.cfg.Resources.DeviceClassMappings {
		for j := range k.cfg.Resources.DeviceClassMappings[i].Sources {
			k.cfg.Resources.DeviceClassMappings[i].Sources[j].Capacity.Name = qualified
		}
	}
	claim := sizedClaim{classSized, 1, "20Gi", ""}.claim("a")
	if _, err := k.charge(ctx, claim.Spec); err == nil || !strings.Contains(err.Error(), `no capacity dimension "gpu.kyb.ai/memory"`) {
		t.Errorf("a mapping of %s: %v, want a refusal", qualified, err)
	}
	asked := schedulertest.Claim("b", classSized, 1, schedulertest.WithCapacity(qualified, "20Gi"))
	if r, err := c.Allocate(ctx, asked, "node-1"); err != nil || r != nil {
		t.Errorf("a claim asking %s: %+v (%v), want no fit", qualified, r, err)
	}
	// The documented mapping charges it the default: it names no memory.
	charge, err := c.kueue(t, "capacity").charge(ctx, asked.Spec)
	if got := render(charge); err != nil || got != quotaMemory+"=17Gi" {
		t.Errorf("a claim asking %s: Kueue charges %s (%v), want the default, 17Gi", qualified, got, err)
	}
}

// The ClusterQueue the page shows covers each resource its capacity
// mapping charges.
func TestDocumentedClusterQueueCoversTheMapping(t *testing.T) {
	cfg := documentedKueueConfigurations(t)["capacity"]
	if !cfg.FeatureGates[kueueCapacityGate] {
		t.Errorf("the capacity path's Configuration does not turn on %s", kueueCapacityGate)
	}
	covered := map[string]bool{}
	for _, block := range documentedYAML(t, "ClusterQueue") {
		var cq struct {
			Spec struct {
				ResourceGroups []struct {
					CoveredResources []string `json:"coveredResources"`
				} `json:"resourceGroups"`
			} `json:"spec"`
		}
		if err := sigsyaml.Unmarshal(block, &cq); err != nil {
			t.Fatal(err)
		}
		for _, g := range cq.Spec.ResourceGroups {
			for _, r := range g.CoveredResources {
				covered[r] = true
			}
		}
	}
	for _, m := range cfg.Resources.DeviceClassMappings {
		if !covered[m.Name] {
			t.Errorf("the ClusterQueue does not cover %s", m.Name)
		}
	}
}
