package e2enode

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// timeline records, while a rollout runs, which plugin pods serve the node
// (their phase, readiness and image as they change), the restart counts of
// the pods that hold seats, and what the test does, each with the time
// since the recording began: what happened, in the order it happened, for
// the test's log.
type timeline struct {
	c       *harness.Cluster
	start   time.Time
	mu      sync.Mutex
	entries []string
	// last is each pod's last recorded state.
	last map[string]string
	held []string
	stop context.CancelFunc
	done chan struct{}
}

// record starts recording the release's pods and the pods held.
func record(c *harness.Cluster, held ...string) *timeline {
	ctx, cancel := context.WithCancel(c.Ctx)
	tl := &timeline{c: c, start: time.Now(), last: map[string]string{}, held: held, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(tl.done)
		for ctx.Err() == nil {
			tl.poll(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return tl
}

// note records what the test does.
func (tl *timeline) note(format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.entries = append(tl.entries, fmt.Sprintf("%6.1fs  %s", time.Since(tl.start).Seconds(), fmt.Sprintf(format, args...)))
}

func (tl *timeline) poll(ctx context.Context) {
	agents, err := tl.c.Client.CoreV1().Pods(helmNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + helmRelease})
	if err != nil {
		return
	}
	seen := map[string]bool{}
	for _, p := range agents.Items {
		seen[p.Name] = true
		tl.set("plugin pod "+p.Name, agentState(&p))
	}
	tl.mu.Lock()
	var gone []string
	for name, state := range tl.last {
		if n, ok := strings.CutPrefix(name, "plugin pod "); ok && !seen[n] && state != "gone" {
			gone = append(gone, name)
		}
	}
	tl.mu.Unlock()
	slices.Sort(gone)
	for _, name := range gone {
		tl.set(name, "gone")
	}
	for _, name := range tl.held {
		p, err := tl.c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		var state []string
		for _, s := range p.Status.ContainerStatuses {
			state = append(state, fmt.Sprintf("%s restarts=%d running=%t", s.Name, s.RestartCount, s.State.Running != nil))
		}
		tl.set("held pod "+name, string(p.Status.Phase)+" "+strings.Join(state, ", "))
	}
}

// agentState is a plugin pod as the timeline shows it.
func agentState(p *v1.Pod) string {
	state := string(p.Status.Phase)
	if podReady(p) {
		state += " Ready"
	}
	if p.DeletionTimestamp != nil {
		state += " Terminating"
	}
	if len(p.Spec.Containers) > 0 {
		state += " image " + p.Spec.Containers[0].Image[strings.LastIndex(p.Spec.Containers[0].Image, ":")+1:]
	}
	if p.Status.PodIP != "" {
		state += " ip " + p.Status.PodIP
	}
	return state
}

func (tl *timeline) set(name, state string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.last[name] == state {
		return
	}
	tl.last[name] = state
	tl.entries = append(tl.entries, fmt.Sprintf("%6.1fs  %s: %s", time.Since(tl.start).Seconds(), name, state))
}

// finish stops recording and returns the timeline.
func (tl *timeline) finish() string {
	tl.stop()
	<-tl.done
	tl.poll(tl.c.Ctx)
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, name := range tl.held {
		tl.entries = append(tl.entries, fmt.Sprintf("%6.1fs  at the end, held pod %s: %s", time.Since(tl.start).Seconds(), name, tl.last["held pod "+name]))
	}
	return strings.Join(tl.entries, "\n")
}
