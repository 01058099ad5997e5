package bench

import (
	"fmt"
	"slices"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// PrepareGoal is how much slower than the no-op driver our p99 may be.
const PrepareGoal = 1.5

// Table summarises the study: per path and concurrency, both drivers'
// p50 and p99 over the samples of every round, and the range of the
// per-round p99 ratios. The drivers took turns pass by pass, so pooling
// their samples compares them under the same conditions, and a p99 over
// several hundred samples is steadier than any one round's.
func (s *PrepareStudy) Table() *Table {
	t := &Table{
		Title: fmt.Sprintf("Prepare latency: ours against a no-op driver (%d rounds pooled)", len(s.Rounds)),
		Header: []string{"path", "claims at once", "samples each", "ours p50", "ours p99", "no-op p50", "no-op p99",
			"p50 ratio", "p99 ratio", "rounds' p99 ratios", "goal ≤ 1.5x", "our batches per pass"},
	}
	type key struct {
		path Path
		n    int
	}
	var keys []key
	for _, l := range s.Rounds[0] {
		k := key{l.Path, l.Concurrent}
		if len(keys) == 0 || keys[len(keys)-1] != k {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		var ours, noop []time.Duration
		var ratios, batches []float64
		for _, round := range s.Rounds {
			var o, n *Latency
			for i := range round {
				l := &round[i]
				if l.Path != k.path || l.Concurrent != k.n {
					continue
				}
				if l.Driver == driver.Name {
					o = l
				} else {
					n = l
				}
			}
			batches = append(batches, float64(o.Batches)/float64(max(o.Passes, 1)))
			ours = append(ours, o.Samples...)
			noop = append(noop, n.Samples...)
			ratios = append(ratios, float64(Percentile(o.Samples, 99))/float64(Percentile(n.Samples, 99)))
		}
		r50 := float64(Percentile(ours, 50)) / float64(Percentile(noop, 50))
		r99 := float64(Percentile(ours, 99)) / float64(Percentile(noop, 99))
		t.Rows = append(t.Rows, []string{string(k.path), fmt.Sprint(k.n), fmt.Sprint(len(ours)),
			Dur(Percentile(ours, 50)), Dur(Percentile(ours, 99)), Dur(Percentile(noop, 50)), Dur(Percentile(noop, 99)),
			Ratio(r50), Ratio(r99), fmt.Sprintf("%.2f–%.2f", slices.Min(ratios), slices.Max(ratios)),
			Verdict(r99 <= PrepareGoal), fmt.Sprintf("%.1f", Median(batches))})
	}
	t.Notes = append(t.Notes, fmt.Sprintf("Both drivers register through the kubeletplugin helper with the same client rate limits (QPS %g, burst %d). "+
		"socket: NodePrepareResources on the driver's socket, one claim per call; kubelet: the kubelet DRA manager's PrepareResources for a pod with one claim. "+
		"1 claim at once: %d passes of %d calls one after the other (the claims unprepared between passes); %d at once: %d bursts, p99 over their %d samples. "+
		"The drivers take turns pass by pass, the first alternating; p50 and p99 pool a driver's samples of all rounds.",
		s.Options.QPS, s.Options.Burst, max(s.Options.Passes, 1), s.Options.Single, s.Options.Concurrent, max(s.Options.Bursts, 1), max(s.Options.Bursts, 1)*s.Options.Concurrent))
	if s.CDIOnTmpfs {
		t.Notes = append(t.Notes, "Our CDI specs go to a tmpfs (/dev/shm), as on a node, where /var/run/cdi is one; the checkpoint to the disk.")
	} else {
		t.Notes = append(t.Notes, "This machine has no /dev/shm: our CDI specs go to the disk, which a node's /var/run/cdi (a tmpfs) does not.")
	}
	return t
}

// StepTable is where the time of one of our prepares goes.
func (s *PrepareStudy) StepTable() *Table {
	t := &Table{Title: "Where one prepare's time goes (ours, socket, one claim at a time)", Header: []string{"step", "mean", "p50", "p99"}}
	for _, st := range s.Steps {
		t.Rows = append(t.Rows, []string{st.Name, Dur(st.Mean), Dur(st.P50), Dur(st.P99)})
	}
	return t
}
