package mps_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

// The boot ID the manager is given (the plugin reads --boot-id-file once)
// is the one a daemon's record carries and is judged by, not the one in
// /proc: a manager of the same boot adopts the daemon, and one of the
// next boot takes its record for a daemon of an earlier boot, which no
// longer runs, and starts the group's daemon anew.
func TestDaemonRecordsFollowTheBootIDGiven(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	control := mpstest.Build(t)
	root := mpstest.Root(t)
	md := &modes{exclusive: map[string]bool{}}
	manager := func(boot string) *mps.Manager {
		m, err := mps.NewManager(mps.Options{Root: root, Control: []string{control}, SetExclusive: md.set, BootID: boot, ShmTmpfsMiB: mps.DefaultShmTmpfsMiB})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	g := mps.Group{Name: "g0-1x", UUIDs: []string{"GPU-a"}}
	limits := mps.Share(1, 2, []int64{40960})
	first := manager("boot-given-1")
	t.Cleanup(func() { _ = manager("boot-given-2").Settle(context.Background(), g, mps.Unused()) })
	if err := first.Ensure(ctx, g, mps.Fixed(limits)); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, g.Name, "daemon.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		BootID string `json:"bootID"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil || rec.BootID != "boot-given-1" {
		t.Fatalf("the daemon's record %s (%v) carries boot %q, want the one given, boot-given-1", raw, err, rec.BootID)
	}
	if restarted, err := manager("boot-given-1").Revive(ctx, g, mps.Fixed(limits)); err != nil || restarted {
		t.Fatalf("a manager of the same boot: Revive = %v, %v; want the running daemon adopted", restarted, err)
	}
	if restarted, err := manager("boot-given-2").Revive(ctx, g, mps.Fixed(limits)); err != nil || !restarted {
		t.Fatalf("a manager of the next boot: Revive = %v, %v; want the daemon of the earlier boot taken as ended and started anew", restarted, err)
	}
	log, err := os.ReadFile(filepath.Join(root, g.Name, mps.LogDir, "control.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "Control daemon started"); n != 2 {
		t.Errorf("the daemon was started %d times, want twice (once per boot):\n%s", n, log)
	}
}
