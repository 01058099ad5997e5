package draplugin_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
)

// mixedMIGNode is a node whose GPU 0 has MIG but a product the simulated
// node has no table of (NVML describes none of its profiles) and whose
// GPU 1 is an H100.
const mixedMIGNode = `apiVersion: kyb.ai/v1alpha1
kind: NodeTopology
gpus:
- {index: 0, productName: NVIDIA A30, architecture: ampere, cudaComputeCapability: "8.0", memoryMiB: 24576}
- {index: 1, productName: NVIDIA H100 80GB HBM3, architecture: hopper, cudaComputeCapability: "9.0", memoryMiB: 81559}
`

// TestMIGProfileOnGPUsWithoutGeometry starts the plugin over its real
// sockets where the configuration gives a MIG profile to GPUs NVML gives
// no MIG geometry for: the node starts, those GPUs publish no MIG device
// and their whole-GPU groups, the other GPUs their MIG devices, and a log
// line and a Warning Node event say which GPUs and why.
func TestMIGProfileOnGPUsWithoutGeometry(t *testing.T) {
	dir := t.TempDir()
	mixed := filepath.Join(dir, "mixed.yaml")
	if err := os.WriteFile(mixed, []byte(mixedMIGNode), 0o644); err != nil {
		t.Fatal(err)
	}
	config := `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}}
`
	for _, tc := range []struct {
		name, preset    string
		present, absent []string
		event           []string
		errorLine       string
		warnOnly        bool
	}{
		{
			name: "GPUs without MIG", preset: "pcie-8gpu",
			present:  []string{"g0-1x", "g7-1x"},
			absent:   []string{"g0-mig-1g-10gb-0"},
			event:    []string{"GPU 0, 1, 2, 3, 4, 5, 6, 7 (NVIDIA L40S), given to MIG profile mig-1g-10gb, publish no MIG device", "(not MIG-capable: GetMigMode: ERROR_NOT_SUPPORTED)", "leave them out of the profile's gpus"},
			warnOnly: true,
		},
		{
			name: "a MIG GPU whose geometry NVML will not give", preset: mixed,
			present:   []string{"g0-1x", "g1-1x", "g1-mig-1g-10gb-0", "g1-mig-1g-10gb-6"},
			absent:    []string{"g0-mig-1g-10gb-0"},
			event:     []string{"GPU 0 (NVIDIA A30), given to MIG profile mig-1g-10gb, publish no MIG device", "(no GPU-instance profile: GetGpuInstanceProfileInfo answered ERROR_NOT_SUPPORTED for every one)", "nvidia-smi mig -lgip", "restart the plugin pod"},
			errorLine: `ERROR GPUs given to a MIG profile have MIG, but NVML gives no MIG geometry for them; they publish no MIG device until the plugin restarts gpus="0" product="NVIDIA A30" `,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			e := newEnv(t, tc.preset, config, withMIG(&crashPoint{}), func(e *env) { e.ctx = klog.NewContext(e.ctx, logger) })
			waitFor(t, "the slices to publish "+strings.Join(tc.present, ", "), func() bool {
				pub := publishedDevices(t, e)
				return !slices.ContainsFunc(tc.present, func(d string) bool { return !slices.Contains(pub, d) })
			})
			pub := publishedDevices(t, e)
			for _, d := range tc.absent {
				if slices.Contains(pub, d) {
					t.Errorf("%s is published; its GPU has no MIG geometry", d)
				}
			}
			waitFor(t, "the Node event "+nodeevents.ReasonNoMIGGeometry, func() bool { return nodeEvent(t, e, nodeevents.ReasonNoMIGGeometry) != "" })
			note := nodeEvent(t, e, nodeevents.ReasonNoMIGGeometry)
			for _, want := range tc.event {
				if !strings.Contains(note, want) {
					t.Errorf("Node event %s: %q, want it to say %q", nodeevents.ReasonNoMIGGeometry, note, want)
				}
			}
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			hasError := strings.Contains(logs, "ERROR GPUs given to a MIG profile have MIG")
			if tc.warnOnly && hasError {
				t.Errorf("an error log line for GPUs without MIG, which a mixed fleet expects:\n%s", logs)
			}
			if tc.errorLine != "" && !slices.ContainsFunc(strings.Split(logs, "\n"), func(l string) bool { return strings.HasPrefix(l, tc.errorLine) }) {
				t.Errorf("no log line starts with %q:\n%s", tc.errorLine, logs)
			}
		})
	}
}
