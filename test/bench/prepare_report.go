package bench

import (
	"fmt"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
)

// PrepareGoal is how much slower than the no-op driver our p99 may be.
const PrepareGoal = 1.5

// Table summarises the study: per path and concurrency, the medians over
// rounds of both drivers' p50 and p99 and of the per-round p99 ratio.
func (s *PrepareStudy) Table() *Table {
	t := &Table{
		Title:  fmt.Sprintf("Prepare latency: ours against a no-op driver (median of %d rounds)", len(s.Rounds)),
		Header: []string{"path", "claims at once", "ours p50", "ours p99", "no-op p50", "no-op p99", "p99 ratio", "goal ≤ 1.5x", "our batches per pass"},
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
		var o50, o99, n50, n99 []time.Duration
		var ratios, batches []float64
		for _, round := range s.Rounds {
			var ours, noop *Latency
			for i := range round {
				l := &round[i]
				if l.Path != k.path || l.Concurrent != k.n {
					continue
				}
				if l.Driver == draresources.DriverName {
					ours = l
				} else {
					noop = l
				}
			}
			batches = append(batches, float64(ours.Batches)/float64(max(ours.Passes, 1)))
			o50 = append(o50, Percentile(ours.Samples, 50))
			o99 = append(o99, Percentile(ours.Samples, 99))
			n50 = append(n50, Percentile(noop.Samples, 50))
			n99 = append(n99, Percentile(noop.Samples, 99))
			ratios = append(ratios, float64(Percentile(ours.Samples, 99))/float64(Percentile(noop.Samples, 99)))
		}
		r := Median(ratios)
		t.Rows = append(t.Rows, []string{string(k.path), fmt.Sprint(k.n), Dur(MedianDuration(o50)), Dur(MedianDuration(o99)),
			Dur(MedianDuration(n50)), Dur(MedianDuration(n99)), Ratio(r), Verdict(r <= PrepareGoal), fmt.Sprintf("%.1f", Median(batches))})
	}
	t.Notes = append(t.Notes, fmt.Sprintf("Both drivers register through the kubeletplugin helper with the same client rate limits (QPS %g, burst %d). "+
		"socket: NodePrepareResources on the driver's socket, one claim per call; kubelet: the kubelet DRA manager's PrepareResources for a pod with one claim. "+
		"1 claim at once: %d passes of %d calls one after the other (the claims unprepared between passes); %d at once: %d bursts, p99 over their %d samples. "+
		"The drivers take turns pass by pass, the first alternating, and each p99 pools a driver's passes of one round.",
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
