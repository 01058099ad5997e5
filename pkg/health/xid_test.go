package health

import (
	"strings"
	"testing"
)

func TestXIDClassification(t *testing.T) {
	tests := []struct {
		name     string
		ignored  []int
		critical []int
		// want maps XIDs to whether they make a GPU unhealthy.
		want map[uint64]bool
	}{
		{
			name: "defaults: application faults and the contained ECC error are ignored",
			want: map[uint64]bool{
				13: false, 31: false, 43: false, 45: false, 68: false, 94: false, 109: false,
				8: true, 48: true, 63: true, 64: true, 74: true, 79: true, 92: true, 95: true, 119: true, 120: true, 150: true,
			},
		},
		{
			name:    "ignoredXIDs add to the list",
			ignored: []int{63, 92},
			want:    map[uint64]bool{63: false, 92: false, 13: false, 79: true, 95: true},
		},
		{
			name:     "criticalXIDs remove from the list",
			critical: []int{109, 94},
			want:     map[uint64]bool{109: true, 94: true, 13: false, 31: false, 79: true},
		},
		{
			name:     "a critical XID that was never ignored stays critical",
			ignored:  []int{92},
			critical: []int{79},
			want:     map[uint64]bool{79: true, 92: false, 43: false},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewXIDPolicy(tt.ignored, tt.critical)
			if err != nil {
				t.Fatal(err)
			}
			for xid, want := range tt.want {
				if got := p.Critical(xid); got != want {
					t.Errorf("XID %d critical = %t, want %t", xid, got, want)
				}
			}
		})
	}
}

func TestXIDPolicyRefusesContradictions(t *testing.T) {
	for _, tt := range []struct {
		name              string
		ignored, critical []int
		want              string
	}{
		{"in both lists", []int{48}, []int{48}, "XID 48 is both ignored and critical"},
		{"negative ignored", []int{-1}, nil, "ignored XID -1"},
		{"zero critical", nil, []int{0}, "critical XID 0"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewXIDPolicy(tt.ignored, tt.critical)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestXIDPolicyListsIgnoredXIDsInOrder(t *testing.T) {
	p, err := NewXIDPolicy([]int{200, 1}, []int{45})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := p.String(), "1,13,31,43,68,94,109,200"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestDescribeXID(t *testing.T) {
	for xid, want := range map[uint64]string{
		79:  "XID 79 (GPU has fallen off the bus)",
		95:  "XID 95 (uncontained ECC error)",
		150: "XID 150",
	} {
		if got := describeXID(xid); got != want {
			t.Errorf("XID %d: got %q, want %q", xid, got, want)
		}
	}
}

func TestMemoryFaults(t *testing.T) {
	for _, tt := range []struct {
		f    Fault
		want bool
	}{
		{Fault{Kind: KindECC}, true},
		{Fault{Kind: KindXID, XID: 48}, true},
		{Fault{Kind: KindXID, XID: 63}, true},
		{Fault{Kind: KindXID, XID: 64}, true},
		{Fault{Kind: KindXID, XID: 92}, true},
		{Fault{Kind: KindXID, XID: 94}, true},
		{Fault{Kind: KindXID, XID: 95}, true},
		{Fault{Kind: KindXID, XID: 31}, false}, // an address the application does not own
		{Fault{Kind: KindXID, XID: 13}, false},
		{Fault{Kind: KindXID, XID: 74}, false},
		{Fault{Kind: KindXID, XID: 79}, false},
		{Fault{Kind: KindXID, XID: 119}, false},
		{Fault{Kind: KindUnreachable}, false},
		{Fault{Kind: KindLost}, false},
	} {
		if got := tt.f.Memory(); got != tt.want {
			t.Errorf("%s %d: Memory() = %v, want %v", tt.f.Kind, tt.f.XID, got, tt.want)
		}
	}
}
