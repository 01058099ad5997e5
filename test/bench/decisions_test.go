package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// patchedBench is kyb-bench built against the patched allocator: the one
// make e2e built (KYB_PATCHED_BENCH), or one built here.
func patchedBench(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("KYB_PATCHED_BENCH"); bin != "" {
		return bin
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(root, "hack/allocator-patch.sh")).Output()
	if err != nil {
		t.Fatalf("hack/allocator-patch.sh: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "kyb-bench-patched")
	build := exec.Command("go", "build", "-modfile="+strings.TrimSpace(string(out)), "-o", bin, "./cmd/kyb-bench")
	build.Dir = filepath.Join(root, "test")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the patched kyb-bench: %v\n%s", err, out)
	}
	return bin
}

// The patch of test/allocpatch must change what the allocator costs, never
// what it decides: random clusters of our nodes, generic partitionable
// nodes and upstream's basic nodes, random pods and releases, every node's
// answer for every pod compared line by line between this stock build and
// the patched one.
func TestPatchedAllocatorDecidesAsStock(t *testing.T) {
	ctx := context.Background()
	opts := PatchOptions{Patched: patchedBench(t), Seed: 1, Streams: 300, Steps: 40}
	st, err := CompareDecisions(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", st)
	if st.Placed < 2000 || st.Refused < 2000 || st.Releases < 1000 || st.Errors == 0 {
		t.Errorf("the streams prove little: %+v", st)
	}
	// The patched build must really be patched: it skips devices before
	// their selectors, which the stock module never does.
	if st.SkippedBeforeSelectors == 0 || st.PoolsSkippedBeforeSelectors == 0 {
		t.Errorf("%s skipped %d devices and %d pools before their selectors: is it the stock allocator?", opts.Patched, st.SkippedBeforeSelectors, st.PoolsSkippedBeforeSelectors)
	}
	var stock strings.Builder
	own, err := Decisions(ctx, &stock, opts.Seed, opts.Streams, opts.Steps)
	if err != nil {
		t.Fatal(err)
	}
	if own.SkippedBeforeSelectors != 0 || own.PoolsSkippedBeforeSelectors != 0 {
		t.Errorf("this build skipped %d devices and %d pools before their selectors: it should be the stock allocator", own.SkippedBeforeSelectors, own.PoolsSkippedBeforeSelectors)
	}

	// The comparison can fail: another seed's decisions differ.
	opts.Seed = 2
	raw, err := runPatched(ctx, opts, "decisions")
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := splitDecisions(raw)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(other, "\n")+"\n" == stock.String() {
		t.Error("seeds 1 and 2 gave the same decisions: the comparison proves nothing")
	}
}
