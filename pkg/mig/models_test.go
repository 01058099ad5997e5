package mig

import (
	"fmt"
	"strings"
	"testing"
)

// row writes a profile as a line of `nvidia-smi mig -lgip` and -lgipp
// would tell it: ID, name, memory and compute slices, MiB, SMs, maximum,
// placements.
func row(p Profile) string {
	me := ""
	if p.MediaExtensions {
		me = " me"
	}
	return fmt.Sprintf("%d %s m%d c%d %dMiB %dSM max%d%s %s", p.ID, p.Name, p.MemorySlices, p.ComputeSlices, p.MemoryMiB, p.SMs, p.MaxInstances, me, formatPlacements(p.Placements))
}

func TestModelTables(t *testing.T) {
	want := map[string][]string{
		"A100-40GB": {
			"19 1g.5gb m1 c1 4864MiB 14SM max7 {0,1,2,3,4,5,6}:1",
			"20 1g.5gb+me m1 c1 4864MiB 14SM max1 me {0,1,2,3,4,5,6}:1",
			"15 1g.10gb m2 c1 9856MiB 14SM max4 {0,2,4,6}:2",
			"14 2g.10gb m2 c2 9856MiB 28SM max3 {0,2,4}:2",
			"9 3g.20gb m4 c3 19968MiB 42SM max2 {0,4}:4",
			"5 4g.20gb m4 c4 19968MiB 56SM max1 {0}:4",
			"0 7g.40gb m8 c7 40192MiB 98SM max1 {0}:8",
		},
		"A100-80GB": {
			"19 1g.10gb m1 c1 9728MiB 14SM max7 {0,1,2,3,4,5,6}:1",
			"20 1g.10gb+me m1 c1 9728MiB 14SM max1 me {0,1,2,3,4,5,6}:1",
			"15 1g.20gb m2 c1 19968MiB 14SM max4 {0,2,4,6}:2",
			"14 2g.20gb m2 c2 19968MiB 28SM max3 {0,2,4}:2",
			"9 3g.40gb m4 c3 40192MiB 42SM max2 {0,4}:4",
			"5 4g.40gb m4 c4 40192MiB 56SM max1 {0}:4",
			"0 7g.80gb m8 c7 80896MiB 98SM max1 {0}:8",
		},
		"H100-80GB": {
			"19 1g.10gb m1 c1 9984MiB 16SM max7 {0,1,2,3,4,5,6}:1",
			"20 1g.10gb+me m1 c1 9984MiB 16SM max1 me {0,1,2,3,4,5,6}:1",
			"15 1g.20gb m2 c1 20096MiB 26SM max4 {0,2,4,6}:2",
			"14 2g.20gb m2 c2 20096MiB 32SM max3 {0,2,4}:2",
			"9 3g.40gb m4 c3 40448MiB 60SM max2 {0,4}:4",
			"5 4g.40gb m4 c4 40448MiB 64SM max1 {0}:4",
			"0 7g.80gb m8 c7 81152MiB 132SM max1 {0}:8",
		},
	}
	models := Models()
	if len(models) != len(want) {
		t.Errorf("%d models, want %d", len(models), len(want))
	}
	for _, m := range models {
		var got []string
		for _, p := range m.Profiles {
			got = append(got, row(p))
		}
		if strings.Join(got, "\n") != strings.Join(want[m.Name], "\n") {
			t.Errorf("%s:\n%s\nwant:\n%s", m.Name, strings.Join(got, "\n"), strings.Join(want[m.Name], "\n"))
		}
		if m.MemorySlices != 8 || m.ComputeSlices != 7 {
			t.Errorf("%s: %d memory and %d compute slices, want 8 and 7", m.Name, m.MemorySlices, m.ComputeSlices)
		}
	}
}

// TestProfileIndexes: the NVML_GPU_INSTANCE_PROFILE_* constant each
// profile is asked for by.
func TestProfileIndexes(t *testing.T) {
	want := map[int]int{19: 0x0, 20: 0x7, 15: 0x9, 14: 0x1, 9: 0x2, 5: 0x3, 0: 0x4}
	for _, m := range Models() {
		for _, p := range m.Profiles {
			if p.Index != want[p.ID] {
				t.Errorf("%s %s: index %d, want %d", m.Name, p.Name, p.Index, want[p.ID])
			}
		}
	}
}

func TestProfileLookup(t *testing.T) {
	for _, tt := range []struct {
		model, profile string
		wantID         int
		err            string
	}{
		{model: "H100-80GB", profile: "1g.10gb", wantID: 19},
		{model: "H100-80GB", profile: "1g.20gb", wantID: 15},
		{model: "A100-40GB", profile: "1g.10gb", wantID: 15},
		{model: "A100-40GB", profile: "7g.40gb", wantID: 0},
		{model: "A100-80GB", profile: "1g.10gb+me", wantID: 20},
		{model: "H100-80GB", profile: "2g.10gb",
			err: `MIG profile "2g.10gb" is not one of H100-80GB's: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb`},
		{model: "A100-40GB", profile: "MIG 1g.5gb",
			err: `MIG profile "MIG 1g.5gb" is not one of A100-40GB's: 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb`},
	} {
		t.Run(tt.model+"/"+tt.profile, func(t *testing.T) {
			m := mustModel(t, tt.model)
			p, err := m.Profile(tt.profile)
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || p.ID != tt.wantID {
				t.Fatalf("got ID %d, %v; want %d", p.ID, err, tt.wantID)
			}
			byID, err := m.ProfileByID(tt.wantID)
			if err != nil || byID.Name != tt.profile {
				t.Fatalf("ProfileByID(%d) = %s, %v; want %s", tt.wantID, byID.Name, err, tt.profile)
			}
		})
	}
	if _, err := mustModel(t, "H100-80GB").ProfileByID(7); err == nil || !strings.Contains(err.Error(), "MIG profile ID 7 is not one of H100-80GB's: 19 (1g.10gb), 20 (1g.10gb+me)") {
		t.Errorf("ProfileByID(7): %v", err)
	}
}

func TestModelForProduct(t *testing.T) {
	for _, tt := range []struct {
		product, want, err string
	}{
		{product: "NVIDIA A100-SXM4-40GB", want: "A100-40GB"},
		{product: "NVIDIA A100-PCIE-40GB", want: "A100-40GB"},
		{product: "NVIDIA A100-SXM4-80GB", want: "A100-80GB"},
		{product: "NVIDIA A100 80GB PCIe", want: "A100-80GB"},
		{product: "NVIDIA H100 80GB HBM3", want: "H100-80GB"},
		{product: "NVIDIA H100 PCIe", err: `no MIG geometry for GPU "NVIDIA H100 PCIe"`},
		{product: "NVIDIA H200", err: `no MIG geometry for GPU "NVIDIA H200"`},
		{product: "NVIDIA L4", err: `no MIG geometry for GPU "NVIDIA L4"; known models are A100-40GB, A100-80GB and H100-80GB (SXM)`},
	} {
		t.Run(tt.product, func(t *testing.T) {
			m, err := ModelForProduct(tt.product)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || m.Name != tt.want {
				t.Fatalf("got %s, %v; want %s", m.Name, err, tt.want)
			}
		})
	}
	if _, err := ModelByName("B200"); err == nil || err.Error() != `no MIG geometry for GPU model "B200"; known models are A100-40GB, A100-80GB, H100-80GB` {
		t.Errorf("ModelByName(B200): %v", err)
	}
}

// TestModelsAreCopies: a caller that changes its tables changes no one
// else's.
func TestModelsAreCopies(t *testing.T) {
	a := Models()
	a[0].Profiles[0].Placements[0].Start = 5
	a[0].Profiles[0].Name = "changed"
	if b := Models(); b[0].Profiles[0].Placements[0].Start != 0 || b[0].Profiles[0].Name != "1g.5gb" {
		t.Fatalf("Models() gave a changed table: %+v", b[0].Profiles[0])
	}
}
