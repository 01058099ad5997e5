//go:build charttest

package charttest

import (
	"strings"
	"testing"
)

// Bad values are refused before anything reaches a cluster, with a message
// that names the value and what is wrong with it.
func TestBadValuesAreRefusedReadably(t *testing.T) {
	helmBinary(t)
	for _, tc := range []struct {
		name  string
		ns    string
		extra []string
		set   []string
		want  []string
	}{
		{
			name: "a misspelt key (schema: additionalProperties)",
			set:  []string{"nodeConfig.profiles[0].resource=kyb.ai/gpu-1x-seat", "nodeConfig.profiles[0].seatPerGroup=4"},
			want: []string{"values don't meet the specifications of the schema", "at '/nodeConfig/profiles/0': additional properties 'seatPerGroup' not allowed"},
		},
		{
			name: "no seats (schema: minimum)",
			set:  []string{"nodeConfig.profiles[0].resource=kyb.ai/gpu-1x-seat", "nodeConfig.profiles[0].seatsPerGroup=0"},
			want: []string{"at '/nodeConfig/profiles/0/seatsPerGroup': minimum: got 0, want 1"},
		},
		{
			name: "an unknown mode and policy (schema: enum)",
			set:  []string{"mode=both", "nodeConfig.allocationPolicy=packed"},
			want: []string{"at '/mode': value must be one of 'dra', 'device-plugin'", "at '/nodeConfig/allocationPolicy': value must be one of '', 'pack', 'spread'"},
		},
		{
			name: "attributes without profile (schema: contains)",
			set:  []string{"nodeConfig.attributes={group}"},
			want: []string{"at '/nodeConfig/attributes'"},
		},
		{
			name: "a group of three GPUs (schema: not)",
			set:  []string{"nodeConfig.groups[0].name=G012", "nodeConfig.groups[0].gpus={0,1,2}"},
			want: []string{"at '/nodeConfig/groups/0/gpus'"},
		},
		{
			name: "a relative kubelet directory (schema: pattern)",
			set:  []string{"kubeletRootDir=var/lib/kubelet"},
			want: []string{"at '/kubeletRootDir': 'var/lib/kubelet' does not match pattern '^/'"},
		},
		{
			name: "the default namespace",
			ns:   "default",
			want: []string{`refusing to install into the "default" namespace`, "allowDefaultNamespace=true"},
		},
		{
			name:  "DRA on Kubernetes 1.33",
			extra: []string{"--kube-version", "1.33.4"},
			want:  []string{`mode "dra" needs Kubernetes 1.34 or newer`, "this cluster is v1.33.4", "mode=device-plugin"},
		},
		{
			name: "two profiles with one name",
			set:  []string{"nodeConfig.profiles[0].resource=kyb.ai/gpu-2x-seat", "nodeConfig.profiles[1].resource=example.com/gpu-2x-seat"},
			want: []string{`nodeConfig.profiles[1] has the profile name "2x" of profiles[0]; set a distinct name`},
		},
		{
			name: "metrics on the health port",
			set:  []string{"metrics.port=51515"},
			want: []string{"metrics.port and kubeletPlugin.healthcheckPort are both 51515"},
		},
		{
			name: "mps without the pods it needs",
			set:  []string{"nodeConfig.profiles[0].resource=kyb.ai/gpu-1x-seat", "nodeConfig.profiles[0].seatsPerGroup=4", "nodeConfig.profiles[0].sharing.strategy=mps"},
			want: []string{"nodeConfig.profiles[0].sharing.strategy is mps, which needs mps.enabled=true"},
		},
		{
			name: "MPS shm directories of 0 MiB (schema: oneOf)",
			set:  []string{"mps.enabled=true", "mps.shmSizeMiB=0"},
			want: []string{"at '/mps/shmSizeMiB'"},
		},
		{
			name: "a sharing strategy the driver does not know",
			set:  []string{"nodeConfig.profiles[0].resource=kyb.ai/gpu-1x-seat", "nodeConfig.profiles[0].sharing.strategy=vgpu"},
			want: []string{"at '/nodeConfig/profiles/0/sharing/strategy': value must be one of 'timeSlicing', 'mps'"},
		},
		{
			name: "a driver subdirectory outside the root",
			set:  []string{"nvidiaDriver.mountSubdirectories={../etc}"},
			want: []string{`nvidiaDriver.mountSubdirectories[0] "../etc" must be a path inside nvidiaDriver.root`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.ns
			if ns == "" {
				ns = namespace
			}
			extra := tc.extra
			if extra == nil {
				extra = []string{"--kube-version", kubeVersion}
			}
			msg := renderError(t, ns, extra, tc.set...)
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("helm's message lacks %q:\n%s", w, msg)
				}
			}
		})
	}
}
