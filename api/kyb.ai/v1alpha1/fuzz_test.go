package v1alpha1

import (
	"os"
	"strings"
	"testing"
)

// Hostile input never panics, and every rejection says what is wrong.

func FuzzLoadNodeConfig(f *testing.F) {
	seed, _ := os.ReadFile("testdata/seed-configmap.yaml")
	f.Add(seed)
	f.Add([]byte("profiles:\n- resource: kyb.ai/gpu-2x-seat\n  seatsPerGroup: 3\ngroups: [{name: G01, gpus: [0, 1]}]\n"))
	f.Add([]byte("apiVersion: v1\nkind: ConfigMap\ndata:\n  config.yaml: |\n    grouping: explicit\n"))
	f.Add([]byte("health: {ignoredXIDs: [94], recoveryPeriod: 2s}\nattributes: [profile, group]\n"))
	f.Add([]byte("\t\tprofiles: [{resource: \"\"}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, src, err := LoadNodeConfig(data, "fuzz.yaml")
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("a rejection without a message")
			}
			return
		}
		if cfg == nil || src == nil {
			t.Fatal("no config and no error")
		}
		// What was accepted is valid after defaulting, too.
		for i := range cfg.Profiles {
			if cfg.Profiles[i].Size() == 0 || cfg.Profiles[i].Seats() < 1 {
				t.Fatalf("accepted profile %d without a size or seats: %+v", i, cfg.Profiles[i])
			}
		}
	})
}

func FuzzLoadNodeTopology(f *testing.F) {
	for _, p := range []string{"dgx-h100", "nvlink-2x4", "single-gpu"} {
		if b, err := os.ReadFile("../../../pkg/simnode/presets/" + p + ".yaml"); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("gpus: [{index: 0, productName: x, architecture: ada, cudaComputeCapability: '8.9', memoryMiB: 1, nvlinks: [{peer: 0, links: 1}]}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		topo, err := LoadNodeTopology(data, "fuzz.yaml")
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("a rejection without a message")
			}
			return
		}
		seen := map[int]bool{}
		for _, g := range topo.GPUs {
			if seen[g.Index] || g.Index < 0 || g.Index >= len(topo.GPUs) || g.Minor == nil || g.NUMANode == nil {
				t.Fatalf("accepted a contradictory topology: %+v", g)
			}
			seen[g.Index] = true
		}
	})
}

func FuzzDecodeSeatConfig(f *testing.F) {
	f.Add([]byte(`{"apiVersion":"kyb.ai/v1alpha1","kind":"SeatConfig","visibleDevices":"index"}`))
	f.Add([]byte(`{"apiVersion":"kyb.ai/v1alpha1","kind":"SeatConfig"}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := DecodeSeatConfig(data)
		if err != nil {
			if strings.TrimSpace(err.Error()) == "" {
				t.Fatal("a rejection without a message")
			}
			return
		}
		if cfg.VisibleDevices != VisibleDevicesUUID && cfg.VisibleDevices != VisibleDevicesIndex {
			t.Fatalf("accepted visibleDevices %q", cfg.VisibleDevices)
		}
	})
}
