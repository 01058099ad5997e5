package v1alpha1

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
)

func TestSeedConfigMapIsAcceptedAsWritten(t *testing.T) {
	data, err := os.ReadFile("testdata/seed-configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "\t\tprofiles:") {
		t.Fatal("the fixture must keep the seed's tab indentation")
	}
	cfg, src, err := LoadNodeConfig(data, "seed.yaml")
	if err != nil {
		t.Fatalf("seed config refused: %v", err)
	}
	if len(cfg.Profiles) != 2 || cfg.Profiles[0].Name != "1x" || cfg.Profiles[0].Seats() != 4 || cfg.Profiles[0].Size() != 1 ||
		cfg.Profiles[1].Name != "2x" || cfg.Profiles[1].Seats() != 3 || cfg.Profiles[1].Size() != 2 {
		t.Errorf("profiles %+v", cfg.Profiles)
	}
	if len(cfg.Groups) != 2 || cfg.Groups[0].Name != "G01" || len(cfg.Groups[1].GPUs) != 2 || cfg.Groups[1].GPUs[1] != 3 {
		t.Errorf("groups %+v", cfg.Groups)
	}
	if cfg.Grouping != GroupingAuto || cfg.AllocationPolicy != PolicyPack || len(cfg.Attributes) != 4 {
		t.Errorf("defaults not applied: %+v", cfg)
	}
	if len(src.Notes) != 2 {
		t.Errorf("notes %q: the user must learn that tabs were read as spaces", src.Notes)
	}
	// The ConfigMap payload starts below the ConfigMap's own lines.
	if got := src.Line("groups[1].gpus"); got != 16 {
		t.Errorf("groups[1].gpus is on line %d of the file, want 16", got)
	}
}

func TestSeedPayloadAloneIsAccepted(t *testing.T) {
	cfg, _, err := LoadNodeConfig([]byte(`profiles:
  - resource: kyb.ai/gpu-1x-seat
    seatsPerGroup: 4
  - resource: kyb.ai/gpu-2x-seat
    seatsPerGroup: 3
groups:
  - name: G01
    gpus: [0,1]
  - name: G23
    gpus: [2,3]
`), "config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Profiles) != 2 || len(cfg.Groups) != 2 {
		t.Errorf("got %+v", cfg)
	}
}

func TestNodeConfigErrorsNameFileLineAndField(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []string
	}{
		{"seats at least one", `profiles:
- resource: kyb.ai/gpu-1x-seat
- resource: kyb.ai/gpu-2x-seat
  seatsPerGroup: 0
`, []string{"c.yaml:4: profiles[1].seatsPerGroup: must be at least 1, not 0"}},
		{"unknown field", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatPerGroup: 4
`, []string{`c.yaml:3: profiles[0].seatPerGroup: unknown field`}},
		{"unknown top-level field and a bad value together", `profile: []
allocationPolicy: tight
unavailableGroups: drop
`, []string{`c.yaml:1: profile: unknown field`, `c.yaml:2: allocationPolicy: must be "pack" or "spread", not "tight"`, `c.yaml:3: unavailableGroups: must be "publish" or "hideBlocked", not "drop"`}},
		{"wrong type", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: four
`, []string{"c.yaml:3: profiles[0].seatsPerGroup: expected an integer, got a string"}},
		{"wrong type of the first item of a list", `profiles:
- kyb.ai/gpu-1x-seat
`, []string{"c.yaml:2: profiles[0]: expected a mapping, got a string"}},
		{"wrong type of a later item of a list", `groups:
- name: G0
  gpus: [0, one]
`, []string{"c.yaml:3: groups[0].gpus[1]: expected an integer, got a string"}},
		{"wrong type of the first item of a nested list", `groups:
- name: G0
  gpus: [0]
- name: G1
  gpus:
  - [1]
`, []string{"c.yaml:6: groups[1].gpus[0]: expected an integer, got a list"}},
		{"wrong type of a list item that should be a string", `attributes: [profile, {group: 1}]
`, []string{"c.yaml:1: attributes[1]: expected a string, got a mapping"}},
		{"wrong type inside a value with its own decoding", `health:
  recoveryPeriod: [5m]
`, []string{"c.yaml:2: health.recoveryPeriod: expected a string, got a list"}},
		{"size not derivable", `profiles:
- resource: kyb.ai/inference
`, []string{`c.yaml:2: profiles[0].gpusPerGroup: required: the resource name "kyb.ai/inference" does not carry the group size`}},
		{"size contradicts resource", `profiles:
- resource: kyb.ai/gpu-2x-seat
  gpusPerGroup: 4
`, []string{`c.yaml:3: profiles[0].gpusPerGroup: 4 contradicts the resource name "kyb.ai/gpu-2x-seat", which says 2`}},
		{"invalid size", `profiles:
- resource: kyb.ai/gpu-3x-seat
`, []string{`c.yaml:2: profiles[0].resource: "kyb.ai/gpu-3x-seat" names groups of 3 GPUs; a group has 1, 2, 4 or 8`}},
		{"duplicate profile", `profiles:
- resource: kyb.ai/gpu-1x-seat
- resource: kyb.ai/gpu-1x-seat
`, []string{`c.yaml:3: profiles[1].resource: "kyb.ai/gpu-1x-seat" is already used by profiles[0]`}},
		{"reserved domain", `profiles:
- resource: kubernetes.io/gpu-1x-seat
`, []string{`profiles[0].resource: "kubernetes.io/gpu-1x-seat": the kubernetes.io domain is reserved`}},
		{"group problems", `groups:
- name: G01
  gpus: [0, 0]
- name: g01
  gpus: [1, 2, 3]
- gpus: [4]
`, []string{
			"c.yaml:3: groups[0].gpus[1]: GPU 0 is listed twice (also at [0])",
			`c.yaml:4: groups[1].name: group name "g01" is already used by groups[0]`,
			"c.yaml:5: groups[1].gpus: a group has 1, 2, 4 or 8 GPUs, not 3",
			"c.yaml:6: groups[2].name: required",
		}},
		{"attributes", `attributes: [group, color]
`, []string{`attributes[1]: unknown attribute "color"`, `attributes: must include "profile"`}},
		{"empty profiles list", `profiles: []
`, []string{"c.yaml:1: profiles: must list at least one profile"}},
		{"wrong kind", `apiVersion: kyb.ai/v1alpha1
kind: NodeTopology
`, []string{`c.yaml:2: kind: must be "NodeConfig", not "NodeTopology"`}},
		{"health", `health:
  criticalXIDs: [48, -1]
  ignoredXIDs: [48]
  recoveryPeriod: 10ms
  gpuLostEffect: Evict
`, []string{
			"health.criticalXIDs[0]: XID 48 is also in ignoredXIDs",
			"health.criticalXIDs[1]: an XID is a positive number, not -1",
			"health.recoveryPeriod: must be at least 1s, not 10ms",
			`health.gpuLostEffect: must be NoSchedule or NoExecute, not "Evict"`,
		}},
		{"sharing strategy unknown", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  sharing:
    strategy: mig
`, []string{`c.yaml:5: profiles[0].sharing.strategy: must be "timeSlicing" or "mps", not "mig"`}},
		{"mps needs seats, refuses overprovisioning and time slices", `profiles:
- resource: kyb.ai/gpu-1x-seat
  allowOverprovision: true
  sharing:
    strategy: mps
    timeSlicing: {interval: Long}
`, []string{
			"c.yaml:5: profiles[0].sharing.strategy: \"mps\" shares a group between seats: set seatsPerGroup to 2 or more",
			"profiles[0].sharing.strategy: \"mps\" cannot be combined with allowOverprovision",
			"c.yaml:6: profiles[0].sharing.timeSlicing: applies to strategy \"timeSlicing\" only",
		}},
		{"mps options without mps, and an unknown compute mode", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 2
  sharing:
    mps: {computeMode: keep}
- resource: kyb.ai/gpu-2x-seat
  seatsPerGroup: 2
  sharing:
    strategy: mps
    mps:
      computeMode: Exclusive_Process
- resource: kyb.ai/gpu-4x-seat
  seatsPerGroup: 2
  sharing:
    strategy: mps
    mps: {computeMode: keep, exclusive: false}
`, []string{
			`c.yaml:5: profiles[0].sharing.mps: applies to strategy "mps" only; strategy is "timeSlicing"`,
			`c.yaml:11: profiles[1].sharing.mps.computeMode: must be "exclusiveProcess" or "keep", not "Exclusive_Process"`,
			`c.yaml:16: profiles[2].sharing.mps.exclusive: unknown field`,
		}},
		{"bad interval", `profiles:
- resource: kyb.ai/gpu-1x-seat
  sharing:
    timeSlicing: {interval: Forever}
`, []string{`c.yaml:4: profiles[0].sharing.timeSlicing.interval: must be Default, Short, Medium or Long, not "Forever"`}},
		{"mps beside an overprovisioning profile on the same GPUs", `profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  sharing: {strategy: mps}
- resource: kyb.ai/gpu-2x-seat
  allowOverprovision: true
  gpus: [0, 1]
`, []string{"c.yaml:5: profiles[1].sharing: profiles[0] and profiles[1] may be in use on the same GPU at once"}},
		{"two intervals on GPUs in use at once", `profiles:
- resource: kyb.ai/gpu-1x-seat
  allowOverprovision: true
  sharing: {timeSlicing: {interval: Short}}
- resource: kyb.ai/gpu-2x-seat
  sharing: {timeSlicing: {interval: Long}}
`, []string{"profiles[1].sharing.timeSlicing.interval: Long contradicts profiles[0]'s Short"}},
		{"two documents", "profiles: []\n---\ngroups: []\n", []string{"c.yaml: line 2: a second document starts here"}},
		{"not YAML", "profiles: [\n", []string{"c.yaml: "}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := LoadNodeConfig([]byte(tc.doc), "c.yaml")
			if err == nil {
				t.Fatal("expected an error")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error:\n%s\ndoes not contain %q", err, want)
				}
			}
		})
	}
}

func TestSharingThatHasAMeaningIsAccepted(t *testing.T) {
	cfg, _, err := LoadNodeConfig([]byte(`profiles:
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 4
  gpus: [0, 1, 2, 3]
  sharing: {strategy: mps}
- resource: kyb.ai/gpu-2x-seat
  seatsPerGroup: 2
  allowOverprovision: true
  gpus: [4, 5, 6, 7]
  sharing: {timeSlicing: {interval: Long}}
- resource: kyb.ai/gpu-4x-seat
- resource: kyb.ai/gpu-1x-mps
  name: 1x-mps
  seatsPerGroup: 4
  gpus: [0, 1]
  sharing: {strategy: mps, mps: {computeMode: keep}}
- resource: kyb.ai/gpu-2x-mps
  name: 2x-mps
  seatsPerGroup: 2
  gpus: [2, 3]
  sharing: {strategy: mps, mps: {computeMode: exclusiveProcess}}
`), "c.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []MPSComputeMode{MPSComputeModeExclusiveProcess, MPSComputeModeExclusiveProcess, MPSComputeModeExclusiveProcess, MPSComputeModeKeep, MPSComputeModeExclusiveProcess} {
		if got := cfg.Profiles[i].MPSComputeMode(); got != want {
			t.Errorf("profiles[%d] MPS compute mode %q, want %q", i, got, want)
		}
	}
	if got := cfg.Profiles[0].SharingStrategy(); got != SharingMPS {
		t.Errorf("profiles[0] strategy %q, want mps", got)
	}
	if got := cfg.Profiles[1].TimeSliceInterval(); got != TimeSliceLong {
		t.Errorf("profiles[1] interval %q, want Long", got)
	}
	if got := cfg.Profiles[2].SharingStrategy(); got != SharingTimeSlicing {
		t.Errorf("profiles[2] strategy %q, want the default timeSlicing", got)
	}
}

func TestAnnotatedErrorsKeepTheirStructure(t *testing.T) {
	_, _, err := LoadNodeConfig([]byte("profiles:\n- resource: kyb.ai/gpu-1x-seat\n  seatsPerGroup: 0\n"), "c.yaml")
	var list FieldErrors
	if !errors.As(err, &list) || len(list) != 1 || list[0].Path != "profiles[0].seatsPerGroup" {
		t.Fatalf("errors.As(FieldErrors) = %v", list)
	}
}

func TestEmptyConfigGivesDefaults(t *testing.T) {
	cfg, _, err := LoadNodeConfig([]byte("{}\n"), "c.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Profiles) != 0 || cfg.Grouping != GroupingAuto || cfg.AllocationPolicy != PolicyPack {
		t.Errorf("got %+v", cfg)
	}
	if _, _, err := LoadNodeConfig([]byte(""), "c.yaml"); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("an empty file must be refused as empty, got %v", err)
	}
}

func TestProfileDefaults(t *testing.T) {
	tests := []struct {
		resource string
		name     string
		size     int
	}{
		{"kyb.ai/gpu-1x-seat", "1x", 1},
		{"kyb.ai/gpu-8x-seat", "8x", 8},
		{"example.com/gpu-2x-train", "2x-train", 2},
		{"kyb.ai/4x", "4x", 4},
	}
	for _, tc := range tests {
		p := Profile{Resource: tc.resource}
		p.SetDefaults()
		if p.Name != tc.name || p.Size() != tc.size || p.Seats() != 1 {
			t.Errorf("%s: name %q size %d seats %d, want %q %d 1", tc.resource, p.Name, p.Size(), p.Seats(), tc.name, tc.size)
		}
	}
}

func TestConfigMapWithoutConfig(t *testing.T) {
	_, _, err := LoadNodeConfig([]byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata:\n  a: b\n  c: d\n"), "cm.yaml")
	if err == nil || !strings.Contains(err.Error(), `has keys a, c but no "config.yaml"`) {
		t.Errorf("got %v", err)
	}
}

// A nested alias bomb ("billion laughs") is refused before it expands.
func TestNestedAliasBombIsRefused(t *testing.T) {
	doc := "a: &a [x, x, x, x, x, x, x, x, x]\n"
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
		doc += n + ": &" + n + " [*" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + "]\n"
		prev = n
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, _, err := LoadNodeConfig([]byte(doc), "bomb.yaml")
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "once its aliases are expanded the document grows beyond 4 MiB") {
		t.Errorf("LoadNodeConfig: %v", err)
	}
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 16<<20 {
		t.Errorf("refusing the bomb allocated %d MiB; it must not expand it", allocated>>20)
	}
}

// aliasBomb is a "flat" alias bomb: one anchor of 100 KB, repeated by
// aliases. go-yaml's own check lets it through; expanded, it is 130 MB of
// text, and decoding it took 4.4 GB and 19 s.
func aliasBomb() []byte {
	var b strings.Builder
	b.WriteString("s: &s \"" + strings.Repeat("x", 100_000) + "\"\nprofiles: [")
	for i := range 1300 {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("*s")
	}
	b.WriteString("]\n")
	return []byte(b.String())
}

func TestAliasBombIsRefusedBeforeItExpands(t *testing.T) {
	bomb := aliasBomb()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, _, err := LoadNodeConfig(bomb, "bomb.yaml")
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "bomb.yaml: line 2: once its aliases are expanded the document grows beyond 4 MiB") {
		t.Fatalf("LoadNodeConfig: %v", err)
	}
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 16<<20 {
		t.Errorf("refusing the bomb allocated %d MiB; it must not expand it", allocated>>20)
	}
	// Aliases that stay small are still fine.
	small := "p: &p {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 2}\nprofiles: [*p]\n"
	if _, _, err := LoadNodeConfig([]byte(small), "small.yaml"); err == nil || !strings.Contains(err.Error(), "p: unknown field") {
		t.Errorf("a small alias: %v, want the decoder to get as far as the unknown field p", err)
	}
}

func BenchmarkRefuseAliasBomb(b *testing.B) {
	bomb := aliasBomb()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := LoadNodeConfig(bomb, "bomb.yaml"); err == nil {
			b.Fatal("the bomb was accepted")
		}
	}
}

// The default publishes every group; the former default "hide" still
// loads, as hideBlocked, and says so.
func TestUnavailableGroupsModes(t *testing.T) {
	for _, tt := range []struct {
		doc  string
		want UnavailableGroupsMode
		note string
	}{
		{"allocationPolicy: pack\n", UnavailableGroupsPublish, ""},
		{"unavailableGroups: publish\n", UnavailableGroupsPublish, ""},
		{"unavailableGroups: hideBlocked\n", UnavailableGroupsHideBlocked, ""},
		{"allocationPolicy: pack\nunavailableGroups: hide\n", UnavailableGroupsHideBlocked, "c.yaml:2: unavailableGroups: hide is read as hideBlocked"},
	} {
		cfg, src, err := LoadNodeConfig([]byte(tt.doc), "c.yaml")
		if err != nil {
			t.Fatalf("%q: %v", tt.doc, err)
		}
		if cfg.UnavailableGroups != tt.want {
			t.Errorf("%q: unavailableGroups %q, want %q", tt.doc, cfg.UnavailableGroups, tt.want)
		}
		notes := strings.Join(src.Notes, "\n")
		if (tt.note == "") != (notes == "") || !strings.Contains(notes, tt.note) {
			t.Errorf("%q: notes %q, want %q", tt.doc, notes, tt.note)
		}
	}
}
