package deviceplugin

import (
	"slices"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func ids(devices []*pluginapi.Device) string {
	out := make([]string, len(devices))
	for i, d := range devices {
		out[i] = d.ID
	}
	return strings.Join(out, " ")
}

// The kubelet counts each resource on its own, so the shim exports the
// exclusive layout: no GPU serves two profiles that exclude each other.
func TestExportsTheExclusiveLayoutOverRealSockets(t *testing.T) {
	tests := []struct {
		name   string
		preset string
		config string
		// want maps each served resource to the seats it lists.
		want map[string]string
		why  string
	}{
		{
			name: "dgx-h100 defaults", preset: "dgx-h100",
			want: map[string]string{
				"kyb.ai/gpu-4x-seat": "g0123-4x-seat-0",
				"kyb.ai/gpu-2x-seat": "g45-2x-seat-0",
				"kyb.ai/gpu-1x-seat": "g6-1x-seat-0 g7-1x-seat-0",
			},
			why: "4x gets G0123; 2x gets G45; 1x gets G6 G7",
		},
		{
			name: "profiles[].gpus steer the layout", preset: "dgx-h100",
			config: `
profiles:
- {resource: kyb.ai/gpu-1x-seat, gpus: [0, 1, 2, 3]}
- {resource: kyb.ai/gpu-2x-seat, gpus: [4, 5, 6, 7]}
`,
			want: map[string]string{
				"kyb.ai/gpu-2x-seat": "g45-2x-seat-0 g67-2x-seat-0",
				"kyb.ai/gpu-1x-seat": "g0-1x-seat-0 g1-1x-seat-0 g2-1x-seat-0 g3-1x-seat-0",
			},
			why: "2x gets G45 G67; 1x gets G0 G1 G2 G3",
		},
		{
			name: "a profile left without GPUs is not served", preset: "dgx-h100",
			config: `
profiles:
- {resource: kyb.ai/gpu-2x-seat, gpus: [0, 1, 2, 3]}
- {resource: kyb.ai/gpu-4x-seat, gpus: [0, 1, 2, 3]}
`,
			want: map[string]string{"kyb.ai/gpu-4x-seat": "g0123-4x-seat-0"},
			why:  "4x gets G0123; 2x gets no GPUs",
		},
		{
			name: "overprovisioning profiles keep every group", preset: "nvlink-2x4",
			config: `
profiles:
- {resource: kyb.ai/gpu-1x-seat, allowOverprovision: true}
- {resource: kyb.ai/gpu-4x-seat}
`,
			want: map[string]string{
				"kyb.ai/gpu-4x-seat": "g0123-4x-seat-0 g4567-4x-seat-0",
				"kyb.ai/gpu-1x-seat": "g0-1x-seat-0 g1-1x-seat-0 g2-1x-seat-0 g3-1x-seat-0 g4-1x-seat-0 g5-1x-seat-0 g6-1x-seat-0 g7-1x-seat-0",
			},
			why: "4x gets G0123 G4567",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.preset, tc.config)
			e.start()
			var wantResources []string
			for r, w := range tc.want {
				wantResources = append(wantResources, r)
				if got := ids(e.kubelet.listsOf(r)[0]); got != w {
					t.Errorf("%s lists %s, want %s", r, got, w)
				}
			}
			slices.Sort(wantResources)
			if got := e.kubelet.registered(); !slices.Equal(got, wantResources) {
				t.Errorf("registered %v, want %v", got, wantResources)
			}
			if _, why := e.plugin.Layout(); !strings.Contains(why, tc.why) {
				t.Errorf("layout explained as %q, want it to say %q", why, tc.why)
			}
		})
	}
}
