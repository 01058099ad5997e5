package bench

import (
	"testing"
	"time"
)

func TestDur(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{4070 * time.Nanosecond, "4.07 µs"},
		{47200 * time.Nanosecond, "47.2 µs"},
		{999600 * time.Nanosecond, "1.00 ms"},
		{1740 * time.Microsecond, "1.74 ms"},
		{324 * time.Millisecond, "324 ms"},
		{999700 * time.Microsecond, "1.00 s"},
		{2500 * time.Millisecond, "2.50 s"},
	} {
		if got := Dur(tc.d); got != tc.want {
			t.Errorf("Dur(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
