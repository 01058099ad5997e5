package draresources_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	sigsyaml "sigs.k8s.io/yaml"
)

// Kueue's DRA quota rules (sigs.k8s.io/kueue v0.19, pkg/dra: claims.go,
// counters.go, capacity.go and the workload controller's handleDRA), as
// far as a ResourceClaimTemplate of this driver's classes meets them.
// Kueue's module cannot be imported: it is built against Kubernetes 1.36
// modules and this module is on 1.37 (docs/quotas.md, "Why no end-to-end
// test runs Kueue"). What is left out: requests with CEL selectors of
// their own (Kueue checks that enough devices match them, a refusal only),
// admin-access requests (charged nothing), and the extended-resource path.

// kueueCapacityGate turns Kueue's capacity path on (alpha in v0.19: off by
// default; Kueue refuses a capacity source at start without it).
const kueueCapacityGate = "KueueDRAIntegrationConsumableCapacity"

// kueueConfiguration is the part of Kueue's Configuration
// (config.kueue.x-k8s.io/v1beta2) that maps DeviceClasses to quota.
type kueueConfiguration struct {
	APIVersion   string          `json:"apiVersion"`
	Kind         string          `json:"kind"`
	FeatureGates map[string]bool `json:"featureGates,omitempty"`
	Resources    struct {
		DeviceClassMappings []kueueMapping `json:"deviceClassMappings"`
	} `json:"resources"`
}

type kueueMapping struct {
	Name             string        `json:"name"`
	DeviceClassNames []string      `json:"deviceClassNames"`
	Sources          []kueueSource `json:"sources,omitempty"`
}

// kueueSource is one of a counter and a capacity source: the counter or
// capacity Name on devices of Driver that DeviceSelector matches.
type kueueSource struct {
	Counter  *kueueSourceSpec `json:"counter,omitempty"`
	Capacity *kueueSourceSpec `json:"capacity,omitempty"`
}

type kueueSourceSpec struct {
	Name           string                     `json:"name"`
	Driver         string                     `json:"driver"`
	DeviceSelector resourceapi.DeviceSelector `json:"deviceSelector"`
}

// kueuePath names a mapping's accounting path by its sources.
func (m kueueMapping) path() string {
	for _, s := range m.Sources {
		switch {
		case s.Capacity != nil:
			return "capacity"
		case s.Counter != nil:
			return "counter"
		}
	}
	return "device count"
}

var yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// documentedYAML returns the YAML blocks of docs/quotas.md that hold an
// object of kind.
func documentedYAML(t *testing.T, kind string) [][]byte {
	t.Helper()
	doc, err := os.ReadFile("../../docs/quotas.md")
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, m := range yamlBlock.FindAllSubmatch(doc, -1) {
		for _, obj := range bytes.Split(m[1], []byte("\n---\n")) {
			var meta struct{ Kind string }
			if err := sigsyaml.Unmarshal(obj, &meta); err == nil && meta.Kind == kind {
				out = append(out, obj)
			}
		}
	}
	return out
}

// documentedKueueConfigurations reads the Kueue Configurations that
// docs/quotas.md shows, by accounting path: the tests count with the
// mappings users copy.
func documentedKueueConfigurations(t *testing.T) map[string]kueueConfiguration {
	t.Helper()
	out := map[string]kueueConfiguration{}
	for _, block := range documentedYAML(t, "Configuration") {
		var cfg kueueConfiguration
		if err := sigsyaml.UnmarshalStrict(block, &cfg); err != nil {
			t.Fatalf("docs/quotas.md: a Kueue Configuration: %v\n%s", err, block)
		}
		if cfg.APIVersion != "config.kueue.x-k8s.io/v1beta2" || len(cfg.Resources.DeviceClassMappings) == 0 {
			t.Fatalf("docs/quotas.md: a Kueue Configuration of %s with %d mappings", cfg.APIVersion, len(cfg.Resources.DeviceClassMappings))
		}
		path := cfg.Resources.DeviceClassMappings[0].path()
		if _, dup := out[path]; dup {
			t.Fatalf("docs/quotas.md: two Kueue Configurations of the %s path", path)
		}
		out[path] = cfg
	}
	return out
}

// kueue counts claims as Kueue's workload controller does, over the
// published slices and classes of a cluster.
type kueue struct {
	cfg     kueueConfiguration
	slices  []*resourceapi.ResourceSlice
	classes map[string]*resourceapi.DeviceClass
	// Kueue compiles every selector without the consumable-capacity
	// fields (dracel.Features{}), and its devices carry no
	// allowMultipleAllocations: a selector that reads it does not compile.
	cel *cel.Cache
}

func newKueue(cfg kueueConfiguration, slices []*resourceapi.ResourceSlice, classes []*resourceapi.DeviceClass) *kueue {
	k := &kueue{cfg: cfg, slices: slices, classes: map[string]*resourceapi.DeviceClass{}, cel: cel.NewCache(10, cel.Features{})}
	for _, c := range classes {
		k.classes[c.Name] = c
	}
	return k
}

// charge is what Kueue adds to a pod's requests for one claim spec, by
// quota resource (in the smallest unit: bytes, claims), or why it refuses
// the workload.
func (k *kueue) charge(ctx context.Context, spec resourceapi.ResourceClaimSpec) (map[string]int64, error) {
	out := map[string]int64{}
	// The device-count path walks every request first: it refuses what
	// Kueue does not support and classes no mapping names.
	for i, r := range spec.Devices.Requests {
		switch {
		case r.FirstAvailable != nil:
			return nil, fmt.Errorf("devices.requests[%d]: FirstAvailable device selection is not supported", i)
		case r.Exactly == nil:
			return nil, fmt.Errorf("devices.requests[%d]: Exactly must be set if FirstAvailable is nil", i)
		case r.Exactly.AllocationMode != resourceapi.DeviceAllocationModeExactCount:
			return nil, fmt.Errorf("devices.requests[%d]: AllocationMode %q is not supported", i, r.Exactly.AllocationMode)
		}
		if k.mapping(r.Exactly.DeviceClassName) == nil {
			return nil, fmt.Errorf("DeviceClass %s is not mapped in DRA configuration", r.Exactly.DeviceClassName)
		}
	}
	for _, r := range spec.Devices.Requests {
		m := k.mapping(r.Exactly.DeviceClassName)
		if len(m.Sources) == 0 {
			out[m.Name] += r.Exactly.Count
			continue
		}
		for _, s := range m.Sources {
			if s.Capacity != nil && !k.cfg.FeatureGates[kueueCapacityGate] {
				return nil, fmt.Errorf("mapping %s: capacity sources require %s to be enabled", m.Name, kueueCapacityGate)
			}
			v, err := k.sourceCharge(ctx, s, r.Exactly)
			if err != nil {
				return nil, fmt.Errorf("mapping %s: %w", m.Name, err)
			}
			out[m.Name] += v
		}
	}
	return out, nil
}

func (k *kueue) mapping(class string) *kueueMapping {
	for i, m := range k.cfg.Resources.DeviceClassMappings {
		if slices.Contains(m.DeviceClassNames, class) {
			return &k.cfg.Resources.DeviceClassMappings[i]
		}
	}
	return nil
}

// sourceCharge is one source's charge for a request: the largest value
// among every matching device of the cluster (Kueue charges before the
// scheduler picks one), times the request's count.
func (k *kueue) sourceCharge(ctx context.Context, s kueueSource, req *resourceapi.ExactDeviceRequest) (int64, error) {
	spec := s.Counter
	if spec == nil {
		spec = s.Capacity
	}
	matched, err := k.match(ctx, spec, req)
	if err != nil {
		return 0, err
	}
	if int64(len(matched)) < req.Count {
		return 0, fmt.Errorf("insufficient matching devices: %d device(s) match but %d requested", len(matched), req.Count)
	}
	var largest int64
	found := false
	for _, d := range matched {
		v, ok, err := deviceCharge(d, s, req)
		if err != nil || !ok {
			continue
		}
		if !found || v > largest {
			largest, found = v, true
		}
	}
	if !found {
		if s.Counter != nil {
			return 0, fmt.Errorf("matched devices have no consumesCounters entry for counter %q", spec.Name)
		}
		return 0, fmt.Errorf("matched devices have no capacity dimension %q, or none whose request policy admits the request", spec.Name)
	}
	return largest * req.Count, nil
}

// deviceCharge is a device's value for a source: the counter it consumes,
// or the capacity the request would consume by the device's request
// policy. false where the device has neither.
func deviceCharge(d resourceapi.Device, s kueueSource, req *resourceapi.ExactDeviceRequest) (int64, bool, error) {
	if s.Counter != nil {
		var v int64
		found := false
		for _, c := range d.ConsumesCounters {
			if q, ok := c.Counters[s.Counter.Name]; ok && (!found || q.Value.Value() > v) {
				v, found = q.Value.Value(), true
			}
		}
		return v, found, nil
	}
	name := resourceapi.QualifiedName(s.Capacity.Name)
	c, ok := d.Capacity[name]
	if !ok {
		return 0, false, nil
	}
	base := c.Value
	switch {
	case req.Capacity != nil && hasKey(req.Capacity.Requests, name):
		base = req.Capacity.Requests[name]
	case c.RequestPolicy != nil && c.RequestPolicy.Default != nil:
		base = *c.RequestPolicy.Default
	}
	v, err := roundToPolicy(base.Value(), c.RequestPolicy)
	return v, err == nil, err
}

func hasKey(m map[resourceapi.QualifiedName]resource.Quantity, k resourceapi.QualifiedName) bool {
	_, ok := m[k]
	return ok
}

// roundToPolicy rounds a charge as Kueue does: up to the first valid value,
// or to at least min and then up to min plus whole steps, refused above
// max. Integer arithmetic: Quantity.Value rounds a fraction up first.
func roundToPolicy(v int64, p *resourceapi.CapacityRequestPolicy) (int64, error) {
	switch {
	case p == nil:
		return v, nil
	case len(p.ValidValues) > 0:
		for _, valid := range p.ValidValues {
			if valid.Value() >= v {
				return valid.Value(), nil
			}
		}
		return 0, fmt.Errorf("request %d exceeds all valid values", v)
	case p.ValidRange != nil:
		r := p.ValidRange
		if r.Min != nil {
			v = max(v, r.Min.Value())
			if r.Step != nil && r.Step.Value() > 0 {
				if off := v - r.Min.Value(); off%r.Step.Value() != 0 {
					v = r.Min.Value() + (off/r.Step.Value()+1)*r.Step.Value()
				}
			}
		}
		if r.Max != nil && v > r.Max.Value() {
			return 0, fmt.Errorf("rounded value %d exceeds max %d", v, r.Max.Value())
		}
	}
	return v, nil
}

// match returns the devices of the source's driver, in complete pools at
// their newest generation, that the source's selector, the request's class
// and the request's own selectors all match.
func (k *kueue) match(ctx context.Context, spec *kueueSourceSpec, req *resourceapi.ExactDeviceRequest) ([]resourceapi.Device, error) {
	class, ok := k.classes[req.DeviceClassName]
	if !ok {
		return nil, fmt.Errorf("get DeviceClass %s: not found", req.DeviceClassName)
	}
	selectors := append([]resourceapi.DeviceSelector{spec.DeviceSelector}, class.Spec.Selectors...)
	selectors = append(selectors, req.Selectors...)
	var out []resourceapi.Device
	for _, d := range k.devices(spec.Driver) {
		ok, err := k.matches(ctx, selectors, cel.Device{Driver: spec.Driver, Attributes: d.Attributes, Capacity: d.Capacity})
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", d.Name, err)
		}
		if ok {
			out = append(out, d)
		}
	}
	return out, nil
}

func (k *kueue) matches(ctx context.Context, selectors []resourceapi.DeviceSelector, d cel.Device) (bool, error) {
	for _, s := range selectors {
		if s.CEL == nil {
			continue
		}
		prog := k.cel.GetOrCompile(s.CEL.Expression)
		if prog.Error != nil {
			return false, fmt.Errorf("compile %q: %w", s.CEL.Expression, prog.Error)
		}
		ok, _, err := prog.DeviceMatches(ctx, d)
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// devices are the devices of a driver's pools that are complete at their
// highest generation.
func (k *kueue) devices(driver string) []resourceapi.Device {
	type pool struct {
		generation, count int64
		slices            []*resourceapi.ResourceSlice
	}
	pools := map[string]*pool{}
	var names []string
	for _, s := range k.slices {
		if s.Spec.Driver != driver {
			continue
		}
		p, ok := pools[s.Spec.Pool.Name]
		switch {
		case !ok:
			names = append(names, s.Spec.Pool.Name)
			fallthrough
		case s.Spec.Pool.Generation > p.generation:
			pools[s.Spec.Pool.Name] = &pool{generation: s.Spec.Pool.Generation, count: s.Spec.Pool.ResourceSliceCount, slices: []*resourceapi.ResourceSlice{s}}
		case s.Spec.Pool.Generation == p.generation:
			p.slices = append(p.slices, s)
		}
	}
	var out []resourceapi.Device
	for _, name := range names {
		if p := pools[name]; int64(len(p.slices)) == p.count {
			for _, s := range p.slices {
				out = append(out, s.Spec.Devices...)
			}
		}
	}
	return out
}
