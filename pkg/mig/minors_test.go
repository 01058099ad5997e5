package mig

import (
	"strings"
	"testing"
)

func TestParseMinors(t *testing.T) {
	data := `config 1
monitor 2
gpu0/gi0/access 3
gpu0/gi0/ci0/access 4
gpu0/gi1/access 12
gpu0/gi1/ci0/access 13
gpu0/gi2/access 21
gpu0/gi2/ci0/access 22

gpu1/gi2/ci7/access 164
`
	m, err := ParseMinors([]byte(data), "mig-minors")
	if err != nil {
		t.Fatal(err)
	}
	if m.Config != 1 || m.Monitor != 2 || m.Len() != 7 {
		t.Errorf("config %d, monitor %d, %d access capabilities; want 1, 2, 7", m.Config, m.Monitor, m.Len())
	}
	for _, tt := range []struct {
		gpu, gi, ci int
		want        int
		ok          bool
	}{
		{0, 1, -1, 12, true},
		{0, 1, 0, 13, true},
		{0, 2, -1, 21, true},
		{0, 2, 0, 22, true},
		{1, 2, 7, 164, true},
		{0, 3, -1, 0, false},
		{1, 2, 0, 0, false},
	} {
		var got int
		var ok bool
		if tt.ci < 0 {
			got, ok = m.GPUInstance(tt.gpu, tt.gi)
		} else {
			got, ok = m.ComputeInstance(tt.gpu, tt.gi, tt.ci)
		}
		if got != tt.want || ok != tt.ok {
			t.Errorf("gpu%d gi%d ci%d: %d, %v; want %d, %v", tt.gpu, tt.gi, tt.ci, got, ok, tt.want, tt.ok)
		}
	}
}

func TestParseMinorsErrors(t *testing.T) {
	for _, tt := range []struct {
		name, data, err string
	}{
		{"no minor", "config 1\ngpu0/gi1/access\n", "mig-minors:2: want a capability and a minor, got \"gpu0/gi1/access\""},
		{"minor not a number", "gpu0/gi1/access twelve\n", "mig-minors:1: minor \"twelve\" is not a number"},
		{"negative minor", "gpu0/gi1/access -3\n", "mig-minors:1: minor \"-3\" is not a number"},
		{"not access", "config 1\nmonitor 2\ngpu0/gi1/ci0/read 13\n", "mig-minors:3: capability \"gpu0/gi1/ci0/read\" is not config, monitor"},
		{"bad gpu", "gpuX/gi1/access 12\n", "mig-minors:1: capability \"gpuX/gi1/access\": \"gpuX\" is not gpu followed by a number"},
		{"bad ci", "gpu0/gi1/c0/access 12\n", "mig-minors:1: capability \"gpu0/gi1/c0/access\": \"c0\" is not ci followed by a number"},
		{"padded number", "gpu0/gi01/access 12\n", "\"gi01\" is not gi followed by a number"},
		{"minor twice", "gpu0/gi1/access 12\ngpu0/gi2/access 12\n", "mig-minors:2: minor 12 is gpu0/gi1/access's already"},
		{"capability twice", "gpu0/gi1/access 12\ngpu0/gi1/access 13\n", "mig-minors:2: gpu0/gi1/access is listed twice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseMinors([]byte(tt.data), "mig-minors")
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("error %v, want %q", err, tt.err)
			}
		})
	}
}
