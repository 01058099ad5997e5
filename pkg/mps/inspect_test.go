package mps_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

// A reader that only looks (the doctor) reads what the plugin recorded of
// a daemon: its process and the limits last set, and nothing once the
// daemon is stopped; it refuses a link planted for the daemon's directory
// as the plugin does.
func TestReadRecordSaysTheLimitsLastSet(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	m, _, root := newManager(t, mpstest.Build(t))
	g := mps.Group{Name: "g0-1x-sized", UUIDs: []string{"GPU-a"}}
	t.Cleanup(func() { _ = m.Settle(context.Background(), g, mps.Unused()) })

	if r, err := mps.ReadRecord(root, g.Name); r != nil || err != nil {
		t.Fatalf("before any daemon: %+v, %v", r, err)
	}
	for _, l := range []mps.Limits{mps.Sized(20<<30, 25, 1), mps.Sized(40<<30, 30, 1)} {
		if err := m.Ensure(ctx, g, mps.Fixed(l)); err != nil {
			t.Fatal(err)
		}
		r, err := mps.ReadRecord(root, g.Name)
		if err != nil || r == nil || r.PID <= 0 || r.Limits == nil || !r.Limits.Equal(l) {
			t.Fatalf("after limits %+v were set: %+v, %v", l, r, err)
		}
	}
	if err := m.Settle(ctx, g, mps.Unused()); err != nil {
		t.Fatal(err)
	}
	if r, err := mps.ReadRecord(root, g.Name); r != nil || err != nil {
		t.Errorf("after the daemon stopped: %+v, %v", r, err)
	}

	if err := os.Symlink(t.TempDir(), filepath.Join(root, "g1-1x-sized")); err != nil {
		t.Fatal(err)
	}
	if _, err := mps.ReadRecord(root, "g1-1x-sized"); err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Errorf("a link for the daemon's directory: %v", err)
	}
	if _, err := mps.ReadRecord(root, "../etc"); err == nil {
		t.Error("a name out of the root is read")
	}
	if r, err := mps.ReadRecord(filepath.Join(root, "none"), g.Name); r != nil || err != nil {
		t.Errorf("no MPS root: %+v, %v", r, err)
	}
}
