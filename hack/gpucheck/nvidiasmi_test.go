//go:build gpucheck

package main

import (
	"os"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The MIG geometry the plugin reads through NVML, put beside nvidia-smi's
// tables. testdata holds -lgip and -lgipp as nvidia-smi prints them for
// one H200 (the numbers a real H200 answered); the plugin reads the
// simulated H200's.
func TestMIGGeometryBesideNVIDIASMI(t *testing.T) {
	_, h200 := simnodetest.Inventory(t, "dgx-h200", "node-1")
	_, l4 := simnodetest.Inventory(t, "single-gpu", "node-1")
	lgip, lgipp := readFile(t, "testdata/h200-lgip.txt"), readFile(t, "testdata/h200-lgipp.txt")
	tests := []struct {
		name         string
		lgip, lgipp  string
		gpus         []inventory.GPU
		lines, diffs []string
		err          string
	}{{
		name: "agree", lgip: lgip, lgipp: lgipp, gpus: h200.GPUs[:1],
		lines: []string{"GPU 0: 7 profiles agree: 1g.18gb (ID 19, 7, 16.00 GiB, {0,1,2,3,4,5,6}:1), 1g.18gb+me (ID 20, 1, 16.00 GiB, {0,1,2,3,4,5,6}:1), " +
			"1g.35gb (ID 15, 4, 32.50 GiB, {0,2,4,6}:2), 2g.35gb (ID 14, 3, 32.50 GiB, {0,2,4}:2), 3g.71gb (ID 9, 2, 69.75 GiB, {0,4}:4), " +
			"4g.71gb (ID 5, 1, 69.75 GiB, {0}:4), 7g.141gb (ID 0, 1, 140.00 GiB, {0}:8)"},
	}, {
		name:  "a profile they disagree on",
		lgip:  strings.Replace(lgip, "MIG 1g.35gb         15     4/4        32.50      No     26", "MIG 1g.36gb         15     4/4        33.50      No     28", 1),
		lgipp: strings.Replace(lgipp, "{0,2,4,6}:2", "{0,2,4}:2", 1), gpus: h200.GPUs[:1],
		diffs: []string{"GPU 0 profile ID 15: name: the plugin 1g.35gb, nvidia-smi 1g.36gb; memory: the plugin 33280 MiB (32.500 GiB), nvidia-smi 33.50 GiB; " +
			"SMs: the plugin 26, nvidia-smi 28; placements: the plugin {0,2,4,6}:2, nvidia-smi {0,2,4}:2"},
	}, {
		name:  "a profile nvidia-smi does not list, and one the plugin does not read",
		lgip:  strings.Replace(lgip, "MIG 1g.18gb+me      20", "MIG 1g.18gb+me      21", 1),
		lgipp: strings.Replace(lgipp, "Profile ID 20", "Profile ID 21", 1), gpus: h200.GPUs[:1],
		diffs: []string{
			"GPU 0: the plugin reads profile 1g.18gb+me (ID 20), nvidia-smi lists no profile ID 20",
			"GPU 0: nvidia-smi lists MIG 1g.18gb+me (ID 21), the plugin reads no such profile",
		},
	}, {
		name: "a GPU nvidia-smi lists nothing for", lgip: lgip, lgipp: lgipp, gpus: h200.GPUs[:2],
		lines: []string{"GPU 0: 7 profiles agree: "},
		diffs: []string{"GPU 1: the plugin reads 7 profiles (1g.18gb, 1g.18gb+me, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb), nvidia-smi lists none"},
	}, {
		name: "no MIG", lgip: "No MIG-supported devices found.\n", lgipp: "No MIG-supported devices found.\n", gpus: l4.GPUs,
		lines: []string{"GPU 0: no MIG: not MIG-capable: GetMigMode: ERROR_NOT_SUPPORTED; nvidia-smi lists no profile either"},
	}, {
		name: "a table nvidia-smi printed otherwise",
		lgip: strings.Replace(lgip, "16.00      No     16     1     0   |", "16.00      No     16     1     0     0   |", 1), lgipp: lgipp, gpus: h200.GPUs[:1],
		err: `nvidia-smi mig -lgip, line 6: cannot read "|   0  MIG 1g.18gb         19     7/7        16.00      No     16     1     0     0   |"`,
	}, {
		name: "placements of a profile -lgip does not list", lgip: lgip, lgipp: lgipp + "GPU  0 Profile ID 3 Placements: {0}:2\n", gpus: h200.GPUs[:1],
		err: "nvidia-smi mig -lgipp, line 8: GPU 0 profile ID 3, which -lgip does not list",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			smi, err := parseNVIDIASMI(tc.lgip, tc.lgipp)
			if got := errString(err); got != tc.err {
				t.Fatalf("parse: %q, want %q", got, tc.err)
			}
			if err != nil {
				return
			}
			lines, diffs := compareMIG(tc.gpus, smi)
			if !slices.Equal(diffs, tc.diffs) {
				t.Errorf("disagreements:\n%s\nwant:\n%s", strings.Join(diffs, "\n"), strings.Join(tc.diffs, "\n"))
			}
			if len(lines) != len(tc.lines) {
				t.Fatalf("lines:\n%s\nwant %d starting:\n%s", strings.Join(lines, "\n"), len(tc.lines), strings.Join(tc.lines, "\n"))
			}
			for i := range lines {
				if !strings.HasPrefix(lines[i], tc.lines[i]) {
					t.Errorf("line %q, want it to start %q", lines[i], tc.lines[i])
				}
			}
		})
	}
}

// The plan's seats are read per GPU; a GPU given a MIG profile that the
// plan gives no seat is a failure that names it.
func TestMIGSeatsOfThePlan(t *testing.T) {
	const plan = `{"profiles": [
{"name": "gpu-1x", "mig": ""},
{"name": "mig-1g-10gb", "mig": "1g.10gb", "migGPUs": [{"gpu": 0, "model": "NVIDIA H100 80GB HBM3", "seats": 7}, {"gpu": 1, "model": "NVIDIA H100 80GB HBM3", "seats": 7}]}],
"warnings": ["profile mig-1g-10gb (MIG 1g.10gb): GPU 2 (x) publish no MIG device"]}`
	seats, warnings, err := migSeats(plan, []string{"1g.10gb"}, map[string][]int{"1g.10gb": {0, 1}})
	want := []gpuSeats{{0, "NVIDIA H100 80GB HBM3", 7, "1g.10gb"}, {1, "NVIDIA H100 80GB HBM3", 7, "1g.10gb"}}
	if err != nil || !slices.Equal(seats, want) || len(warnings) != 1 || !strings.HasPrefix(warnings[0], "plan warning: profile mig-1g-10gb") {
		t.Errorf("seats %v, warnings %q, %v; want %v", seats, warnings, err, want)
	}
	if got, want := seatsSummary(append(seats, gpuSeats{2, "NVIDIA A100-SXM4-40GB", 7, "1g.5gb"})),
		"GPU 0, 1 (NVIDIA H100 80GB HBM3): 7 seats of 1g.10gb each; GPU 2 (NVIDIA A100-SXM4-40GB): 7 seats of 1g.5gb each"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
	_, _, err = migSeats(plan, []string{"1g.10gb", "1g.18gb"}, map[string][]int{"1g.10gb": {0, 1, 3}, "1g.18gb": {4}})
	if got, want := errString(err), "GPU 3 offers no seat of 1g.10gb; the plan has no profile of MIG 1g.18gb"; got != want {
		t.Errorf("error %q, want %q", got, want)
	}
}

// On a node whose GPUs have no MIG, neither MIG step runs, and each says
// why: no nvidia-smi describes a simulated node, and no GPU has a MIG
// profile to plan, with the reason per GPU.
func TestMIGStepsOnANodeWithoutMIG(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	sim, inv := simnodetest.Inventory(t, "workstation-2gpu", "node-1")
	c := &check{o: options{out: t.TempDir()}, report: &report{},
		node: &nodesetup.Node{Host: &gpuhost.Host{NVML: sim.NVML(), PCIe: sim.PCIe(), Simulated: sim}, Inv: inv}}
	c.migGeometry(ctx, "8")
	c.migPlan(ctx, "9")
	want := []string{
		"not run: no nvidia-smi (a simulated node, which no nvidia-smi describes)",
		"not run: no GPU has MIG geometry (GPU 0, 1 (NVIDIA RTX 6000 Ada Generation): no MIG: not MIG-capable: GetMigMode: ERROR_NOT_SUPPORTED)",
	}
	var got []string
	for _, s := range c.report.steps {
		got = append(got, s.skipped)
	}
	if !slices.Equal(got, want) {
		t.Errorf("skipped:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
