package containerclaims

import "testing"

// The scheduler names an extended-resource claim's requests
// container-<i>-request-<j>; any other name is not one container's.
func TestExtendedRequestContainer(t *testing.T) {
	for _, tc := range []struct {
		name string
		i    int
		ok   bool
	}{
		{"container-0-request-0", 0, true},
		{"container-12-request-3", 12, true},
		{"container--request-0", 0, false},
		{"container-1-request-", 0, false},
		{"container-+1-request-0", 0, false},
		{"container-1-request-0-x", 0, false},
		{"gpu", 0, false},
	} {
		if i, ok := extendedRequestContainer(tc.name); i != tc.i || ok != tc.ok {
			t.Errorf("%q: %d, %v; want %d, %v", tc.name, i, ok, tc.i, tc.ok)
		}
	}
}
