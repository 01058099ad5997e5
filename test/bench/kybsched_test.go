package bench

import (
	"bytes"
	"maps"
	"os"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// TestKybSchedStudiesAtSmallSize runs both kyb-scheduler studies on a few
// nodes (the throughput study on empty ones only: the burst fills nodes
// as the busy scenario does) against a real API server, with the real kyb-scheduler binary
// ($KYB_SCHEDULER, else built) and stock kube-scheduler ($KUBE_SCHEDULER,
// else the in-process one): every throughput pod binds (a round fails
// otherwise), kyb-scheduler binds the whole burst without refusing a pod
// a free seat, and the tables render. It keeps the studies of make bench
// working; it measures nothing.
func TestKybSchedStudiesAtSmallSize(t *testing.T) {
	c := harness.Start(t, KybSchedClusterOptions())
	opts := KybSchedOptions{
		Nodes: []int{4}, Pods: 10, Rounds: 1, Preset: "dgx-h100",
		KybScheduler: c.KybSchedulerBinary(), KubeScheduler: os.Getenv("KUBE_SCHEDULER"),
		BurstNodes: 2, BurstWait: 30,
	}
	st, err := RunKybSched(c.Ctx, c, opts)
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range st.Scenarios {
		for i, r := range sc.Runs {
			if rate := sc.PodsPerSecond[0][i]; rate <= 0 {
				t.Errorf("%s, %s under %s: %v pods/s", sc.Name, r.Shape.Name, r.Scheduler.Name, rate)
			}
		}
	}
	// The score's time is read from kyb-scheduler's own metrics, which
	// time every cycle: there with the score, absent without it.
	costs := st.Scenarios[0].Costs[0]
	if c := costs[runOursKyb]; c.attempt <= 0 || c.scoreCycles == 0 || c.score <= 0 || c.score >= c.attempt {
		t.Errorf("kyb-scheduler's times per attempt %+v: want an attempt's time, and a score's within it where timed", c)
	}
	if c := costs[runOursKybNoScore]; c.attempt <= 0 || c.score != 0 {
		t.Errorf("kyb-scheduler without the score: times per attempt %+v, want no score time", c)
	}
	// Released at once, every pod's cycle tries every node: on 4 nodes
	// the scheduler filters them all, full ones included.
	sc := st.Scenarios[0]
	for i, r := range sc.Runs {
		if c := costs[i]; c.attempt > 0 && c.draFilters < float64(sc.Nodes*sc.Pods[i]) {
			t.Errorf("%s under %s: %v DRA Filter calls for %d pods on %d nodes, want every pod to try every node",
				r.Shape.Name, r.Scheduler.Name, c.draFilters, sc.Pods[i], sc.Nodes)
		}
	}
	// Each scheduler process's CPU for the round, from its own metrics:
	// a scheduler that schedules pods uses some. Stock in-process has none.
	for i, r := range st.Scenarios[0].Runs {
		cpu := st.Scenarios[0].CPUPerPod[0][i]
		if inProcess := i <= runOursStock && opts.KubeScheduler == ""; inProcess != (cpu == 0) || cpu < 0 || cpu > 1 {
			t.Errorf("%s under %s: %v CPU seconds per pod (in-process: %v)", r.Shape.Name, r.Scheduler.Name, cpu, inProcess)
		}
	}
	var out bytes.Buffer
	st.Table().Write(&out)
	// A goal's verdict reads "met" or "NOT met".
	if len(st.Scenarios) != 1 {
		t.Errorf("%d scenarios, want empty nodes alone (no node full)", len(st.Scenarios))
	}
	for _, want := range []string{"| 4 | empty nodes |", "| kyb-scheduler without the score |", "met |"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("throughput table lacks %q:\n%s", want, out.String())
		}
	}
	t.Logf("at this size the figures mean nothing; the tables:\n%s", out.String())

	burst, err := RunKybBurst(c.Ctx, c, opts)
	if err != nil {
		t.Fatal(err)
	}
	if burst.Seats != 64 {
		t.Errorf("burst onto %d seats, want a dgx-h100's 64 (8 per GPU)", burst.Seats)
	}
	kyb := burst.Results[1]
	if kyb.Pending[0] != 0 || kyb.AllBound[0] == 0 || kyb.Refused[0] != 0 {
		t.Errorf("kyb-scheduler's burst: %d pods pending, all bound after %v, %d pods refused a free seat (%q); want 0, some time, 0",
			kyb.Pending[0], kyb.AllBound[0], kyb.Refused[0], kyb.Reasons[0])
	}
	out.Reset()
	burst.Table().Write(&out)
	if !strings.Contains(out.String(), "A burst of 64 one-seat pods onto a node's 64 free 1x seats, the other 1 nodes full") ||
		!strings.Contains(out.String(), "| kyb-scheduler (built-in profile: score on, pack) |") {
		t.Errorf("burst table:\n%s", out.String())
	}
	t.Log(out.String())
}

func TestParseAttempts(t *testing.T) {
	page := []byte(`# HELP scheduler_schedule_attempts_total [STABLE] Number of attempts to schedule pods, by the result.
# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="kyb-scheduler",result="scheduled"} 400
scheduler_schedule_attempts_total{profile="kyb-scheduler",result="unschedulable"} 12
scheduler_schedule_attempts_total{profile="other",result="scheduled"} 3
scheduler_schedule_attempts_total_other{result="scheduled"} 9
`)
	got, err := parseAttempts(page)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]float64{"scheduled": 403, "unschedulable": 12}; !maps.Equal(got, want) {
		t.Errorf("parseAttempts = %v, want %v", got, want)
	}
	if _, err := parseAttempts([]byte("scheduler_schedule_attempts_total{result=\"scheduled\"}\n")); err == nil {
		t.Error("a line without a value parsed")
	}
}

// TestKybPreemptStudyAtSmallSize runs the preemption study on four full
// nodes: kyb-scheduler binds each high-priority pod, evicting the fewest
// possible; stock kube-scheduler binds none and evicts none; the table
// renders.
func TestKybPreemptStudyAtSmallSize(t *testing.T) {
	c := harness.Start(t, KybSchedClusterOptions())
	opts := KybSchedOptions{
		Rounds: 1, Preset: "dgx-h100", KybScheduler: c.KybSchedulerBinary(), KubeScheduler: os.Getenv("KUBE_SCHEDULER"),
		PreemptNodes: 4, Preemptions: 2, PreemptWait: 30,
	}
	st, err := RunKybPreempt(c.Ctx, c, opts)
	if err != nil {
		t.Fatal(err)
	}
	stock, kyb := st.Results[0], st.Results[1]
	if len(stock.Bound) != 1 || stock.Bound[0] != 0 || stock.Victims[0] != 0 {
		t.Errorf("stock kube-scheduler: bound after %v, %v victims; want one pod, not bound, none evicted", stock.Bound, stock.Victims)
	}
	if len(kyb.Bound) != 2 {
		t.Fatalf("kyb-scheduler ran %d pods, want 2; left pending: %q", len(kyb.Bound), kyb.Pending)
	}
	for i := range kyb.Bound {
		if kyb.Bound[i] == 0 || kyb.Victims[i] != kyb.Fewest[i] || kyb.Fewest[i] < 2 {
			t.Errorf("kyb-scheduler's pod %d: bound after %v, %d victims, fewest possible %d; want bound, the fewest (2 to 4)",
				i, kyb.Bound[i], kyb.Victims[i], kyb.Fewest[i])
		}
	}
	var out bytes.Buffer
	st.Table().Write(&out)
	if !strings.Contains(out.String(), "| kyb-scheduler (built-in profile: score on, pack) | 2 |") {
		t.Errorf("preemption table:\n%s", out.String())
	}
	t.Log(out.String())
}
