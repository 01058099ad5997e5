package mps

import (
	"testing"
)

func TestShareIsSeatsOverSeatsRoundedDown(t *testing.T) {
	tests := []struct {
		name     string
		k, seats int
		mem      []int64
		wantPct  int
		wantEnv  string
	}{
		{"one seat of four on an 80 GB H100", 1, 4, []int64{81559}, 25, "0=20389M"},
		{"two seats of four on a pair", 2, 4, []int64{81559, 81559}, 50, "0=40779M,1=40779M"},
		{"one seat of three", 1, 3, []int64{40960}, 33, "0=13653M"},
		{"every seat", 3, 3, []int64{40960}, 100, "0=40960M"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := Share(tc.k, tc.seats, tc.mem)
			if l.ActiveThreadPercentage != tc.wantPct || l.MemLimitEnv() != tc.wantEnv {
				t.Errorf("Share(%d, %d) = %d%% %s, want %d%% %s", tc.k, tc.seats, l.ActiveThreadPercentage, l.MemLimitEnv(), tc.wantPct, tc.wantEnv)
			}
		})
	}
}

func TestParseMemLimit(t *testing.T) {
	got, err := ParseMemLimit("0=20389M,1=2G")
	if err != nil || got[0] != 20389 || got[1] != 2048 || len(got) != 2 {
		t.Errorf("ParseMemLimit = %v, %v", got, err)
	}
	for _, bad := range []string{"0=20389", "x=1G", "0:1G", "-1=1G"} {
		if _, err := ParseMemLimit(bad); err == nil {
			t.Errorf("ParseMemLimit(%q) accepted", bad)
		}
	}
}

func TestSizedLimitsAreTheSizeOnEachGPUOfTheGroup(t *testing.T) {
	tests := []struct {
		name            string
		memory, compute int64
		gpus            int
		wantPct         int
		wantEnv         string
	}{
		{"20Gi and 25 % of one GPU", 20 << 30, 25, 1, 25, "0=20480M"},
		{"20Gi and 25 % of a pair: 20Gi on each", 20 << 30, 25, 2, 25, "0=20480M,1=20480M"},
		{"a part of a MiB is not given", 20<<30 + 1<<19, 1, 1, 1, "0=20480M"},
		{"two seats' compute past all SMs", 8 << 30, 120, 1, 100, "0=8192M"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := Sized(tc.memory, tc.compute, tc.gpus)
			if l.ActiveThreadPercentage != tc.wantPct || l.MemLimitEnv() != tc.wantEnv {
				t.Errorf("Sized = %d%% %s, want %d%% %s", l.ActiveThreadPercentage, l.MemLimitEnv(), tc.wantPct, tc.wantEnv)
			}
		})
	}
}
