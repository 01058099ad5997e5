package draplugin_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/migseats"
)

// These tests start the plugin over its real sockets on simulated nodes
// whose GPU 0, given to a MIG profile, is not in MIG mode.

const migModeConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.5gb, mig: {profile: 1g.5gb}, gpus: [0]}
`

// TestMIGModeOffAtStart: on Ampere, where turning MIG mode on waits for a
// GPU reset, GPU 0's MIG devices are not published, its whole-GPU group
// is, and an error log line and a Warning Node event say what to do; on
// Hopper, where a prepare turns the mode on, nothing is withdrawn or
// reported.
func TestMIGModeOffAtStart(t *testing.T) {
	for _, tc := range []struct {
		name, preset, config string
		// pending sets MIG mode on before the start; on Ampere it waits
		// for a reset.
		pending bool
		// withdrawn are the devices not published, present those that
		// are; event is what the Node event says (none when empty).
		withdrawn, present []string
		event              []string
		eventNot           string
		// logLine starts the log line that reports GPU 0, and logHas is
		// what that line says.
		logLine string
		logHas  []string
	}{
		{
			name: "ampere, MIG off", preset: "dgx-a100", config: migModeConfig,
			withdrawn: []string{"g0-mig-1g-5gb-0", "g0-mig-1g-5gb-3", "g0-mig-1g-5gb-6"},
			present:   []string{"g0-1x", "g1-1x"},
			event:     []string{"GPU 0 (ampere, ", "not in MIG mode", "its MIG devices are not published", "nvidia-smi -i 0 -mig 1", "nvidia-smi -i 0 --gpu-reset", "restart the plugin pod"},
			logLine:   "ERROR GPU given to a MIG profile is not in MIG mode, and turning it on needs a GPU reset the plugin does not do; its MIG devices are not published gpu=0 ",
			logHas:    []string{`architecture="ampere"`, "migPending=false", "drain the GPU, then run `nvidia-smi -i 0 -mig 1` and `nvidia-smi -i 0 --gpu-reset`"},
		},
		{
			name: "ampere, MIG pending", preset: "dgx-a100", config: migModeConfig, pending: true,
			withdrawn: []string{"g0-mig-1g-5gb-0", "g0-mig-1g-5gb-6"},
			present:   []string{"g0-1x", "g1-1x"},
			event:     []string{"GPU 0 (ampere, ", "MIG mode is pending", "nvidia-smi -i 0 --gpu-reset"},
			eventNot:  "-mig 1",
			logLine:   "ERROR GPU given to a MIG profile is not in MIG mode, and turning it on needs a GPU reset the plugin does not do; its MIG devices are not published gpu=0 ",
			logHas:    []string{"migPending=true", "MIG mode is pending: reset the GPU: drain it, then run `nvidia-smi -i 0 --gpu-reset`"},
		},
		{
			name: "hopper, MIG off", preset: "dgx-h100", config: migConfig,
			present: []string{"g0-1x", "g0-mig-1g-10gb-0", "g0-mig-1g-10gb-6", "g0-mig-2g-20gb-4", "g1-1x"},
			logLine: `INFO GPU given to a MIG profile is not in MIG mode; the first MIG claim's prepare turns it on gpu=0 architecture="hopper"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			e := newEnv(t, tc.preset, tc.config, withMIG(&crashPoint{}), func(e *env) {
				e.ctx = klog.NewContext(e.ctx, logger)
				if !tc.pending {
					return
				}
				dev, _ := e.sim.NVML().DeviceGetHandleByIndex(0)
				if _, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
					t.Fatal(ret)
				}
			})
			waitFor(t, "the slices to publish "+strings.Join(tc.present, ", "), func() bool {
				pub := publishedDevices(t, e)
				return !slices.ContainsFunc(tc.present, func(d string) bool { return !slices.Contains(pub, d) })
			})
			pub := publishedDevices(t, e)
			for _, d := range tc.withdrawn {
				if slices.Contains(pub, d) {
					t.Errorf("%s is published; GPU 0 cannot make it until a reset", d)
				}
			}
			if n := countPrefix(pub, "g0-mig-"); len(tc.withdrawn) > 0 && n != 0 {
				t.Errorf("%d MIG devices of GPU 0 published, want none: %v", n, pub)
			}
			note := nodeEvent(t, e, migseats.ReasonMIGModeNeedsReset)
			if len(tc.event) == 0 && note != "" {
				t.Errorf("Node event %s: %q, want none", migseats.ReasonMIGModeNeedsReset, note)
			}
			for _, want := range tc.event {
				if !strings.Contains(note, want) {
					t.Errorf("Node event %s: %q, want it to say %q", migseats.ReasonMIGModeNeedsReset, note, want)
				}
			}
			if tc.eventNot != "" && strings.Contains(note, tc.eventNot) {
				t.Errorf("Node event %s: %q, want no %q", migseats.ReasonMIGModeNeedsReset, note, tc.eventNot)
			}
			logs := logger.GetSink().(ktesting.Underlier).GetBuffer().String()
			lines := strings.Split(logs, "\n")
			i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, tc.logLine) })
			if i < 0 {
				t.Fatalf("no log line starts with %q:\n%s", tc.logLine, logs)
			}
			line := lines[i]
			for _, want := range tc.logHas {
				if !strings.Contains(line, want) {
					t.Errorf("log line %q does not say %q", line, want)
				}
			}
		})
	}
}

func countPrefix(names []string, prefix string) int {
	n := 0
	for _, s := range names {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}
