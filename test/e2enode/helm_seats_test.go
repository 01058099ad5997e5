package e2enode

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kubectlkyb "github.com/kyb-ai/kyb-dra-driver/cmd/kubectl-kyb/app"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatview"
)

// podClaims returns the claims a pod holds: those of its resourceClaims
// entries and the one the scheduler made for its extended resources.
func (h *helmNode) podClaims(t *testing.T, pod string) []string {
	t.Helper()
	p, err := h.c.Client.CoreV1().Pods("default").Get(h.c.Ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			out = append(out, *s.ResourceClaimName)
		}
	}
	if e := p.Status.ExtendedResourceClaimStatus; e != nil {
		out = append(out, e.ResourceClaimName)
	}
	return out
}

// checkSeats checks, for pods holding one seat each, that nothing is lost
// or doubled: `kubectl kyb seats` (computed from the ResourceSlices and
// the seats the plugin wrote into the claims' status) lists each pod's
// claim exactly once, on the group and seat its container's environment
// names, no seat is held twice, the node holds no other seat, and the
// node's CDI directory has one spec per claim and no other. It returns
// the table kubectl kyb seats prints.
func (h *helmNode) checkSeats(t *testing.T, pods ...string) string {
	t.Helper()
	// The plugin writes a claim's seats into its status about a second
	// after the prepare; until then kubectl kyb seats shows "?".
	var view *seatview.View
	waitUntil(t, "the seats of every claim in their status", 30*time.Second, func() bool {
		v, err := kubectlkyb.Seats(h.c.Ctx, h.c.Client, h.n.Name, "", io.Discard)
		if err != nil {
			return false
		}
		view = v
		for _, n := range v.Nodes {
			for _, g := range n.Groups {
				for _, s := range g.Held {
					if s.Seat == nil {
						return false
					}
				}
			}
		}
		return true
	})
	var table strings.Builder
	if err := seatview.WriteTable(&table, view, true); err != nil {
		t.Fatal(err)
	}
	// claim -> "group/seat" of every seat the view says it holds.
	held := map[string][]string{}
	holders := map[string][]string{}
	for _, n := range view.Nodes {
		for _, g := range n.Groups {
			for _, s := range g.Held {
				seat := g.Group + "/?"
				if s.Seat != nil {
					seat = g.Group + "/" + strconv.Itoa(*s.Seat)
				}
				held[s.Claim] = append(held[s.Claim], seat)
				holders[seat] = append(holders[seat], s.Claim)
			}
		}
	}
	for seat, claims := range holders {
		if len(claims) > 1 || strings.HasSuffix(seat, "/?") {
			t.Errorf("seat %s held by %v", seat, claims)
		}
	}
	var want []string
	for _, pod := range pods {
		claims := h.podClaims(t, pod)
		if len(claims) != 1 {
			t.Errorf("pod %s holds claims %v, want one", pod, claims)
			continue
		}
		claim := "default/" + claims[0]
		want = append(want, claim)
		o := waitForOutput(t, h.c, pod, "app")
		env := o.env["KYB_GPU_GROUP"] + "/" + o.env["KYB_GPU_SEAT"]
		if got := held[claim]; len(got) != 1 || got[0] != env {
			t.Errorf("pod %s: claim %s holds seats %v, its container has %s", pod, claim, got, env)
		}
		cl, err := h.c.Client.ResourceV1().ResourceClaims("default").Get(h.c.Ctx, claims[0], metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(h.n.CDIDir, cdi.SpecName(cl.UID)+".json")); err != nil {
			t.Errorf("pod %s: claim %s has no CDI spec: %v", pod, claim, err)
		}
	}
	for claim := range held {
		if !slices.Contains(want, claim) {
			t.Errorf("the node holds seats %v of claim %s, which none of pods %v holds", held[claim], claim, pods)
		}
	}
	if specs := specFiles(t, h.n); len(specs) != len(want) {
		t.Errorf("%d CDI specs on the node, want one per claim of %v: %v", len(specs), want, specs)
	}
	return table.String()
}

// checkUntouched checks that pods still run the containers they ran
// before: same container IDs, no restart.
func (h *helmNode) checkUntouched(t *testing.T, before map[string]string, pods ...string) {
	t.Helper()
	for _, name := range pods {
		p, err := h.c.Client.CoreV1().Pods("default").Get(h.c.Ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("pod %s: %v", name, err)
			continue
		}
		if got := containerIDs(p); got != before[name] || p.Status.ContainerStatuses[0].RestartCount != 0 || p.Status.ContainerStatuses[0].State.Running == nil {
			t.Errorf("pod %s: containers %s, before %s: %s", name, got, before[name], describe(h.c, name))
		}
	}
}

// containerIDs are a pod's containers as the runtime knows them, and
// their restart counts.
func containerIDs(p *v1.Pod) string {
	var out []string
	for _, s := range p.Status.ContainerStatuses {
		out = append(out, fmt.Sprintf("%s=%s(restarts %d)", s.Name, s.ContainerID, s.RestartCount))
	}
	return strings.Join(out, " ")
}

// metricSum sums the samples of a counter or gauge in a /metrics page.
func metricSum(metrics, name string) float64 {
	var sum float64
	for _, l := range strings.Split(metrics, "\n") {
		if rest, ok := strings.CutPrefix(l, name); ok && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
			f := strings.Fields(l)
			if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}
