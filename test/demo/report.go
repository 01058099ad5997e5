package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/cmd/kubectl-kyb/app"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatview"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// report prints the ResourceSlices, the seats of every group, the pods and
// their containers.
func report(ctx context.Context, c *harness.Cluster, pods []string, out io.Writer) error {
	slices, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	claims, err := c.Client.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "$ kubectl get resourceslices")
	tw := tabwriter.NewWriter(out, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tNODE\tDRIVER\tPOOL\tAGE")
	sort.Slice(slices.Items, func(i, j int) bool { return slices.Items[i].Name < slices.Items[j].Name })
	for _, s := range slices.Items {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", s.Name, deref(s.Spec.NodeName), s.Spec.Driver, s.Spec.Pool.Name, duration.HumanDuration(time.Since(s.CreationTimestamp.Time)))
	}
	tw.Flush()

	fmt.Fprintln(out, "\n$ kubectl kyb seats -A")
	view, err := app.Seats(ctx, c.Client, "", "", out)
	if err != nil {
		return err
	}
	if err := seatview.WriteTable(out, view, false); err != nil {
		return err
	}

	fmt.Fprintln(out, "\nPods")
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tNODE\tSTATUS\tSEATS")
	type running struct {
		pod  *v1.Pod
		node *harness.Node
	}
	var ran []running
	for _, name := range pods {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != v1.PodRunning {
			fmt.Fprintf(tw, "%s\t-\tPending\t%s\n", name, pendingReason(p))
			continue
		}
		var seats []string
		for _, cl := range podClaims(p, claims.Items) {
			for _, d := range cl.Status.Devices {
				var s v1alpha1.SeatStatus
				if d.Driver == driver.Name && d.Data != nil && json.Unmarshal(d.Data.Raw, &s) == nil {
					seats = append(seats, fmt.Sprintf("%s: group %s seat %s gen %s (claim %s)", d.Device, s.Group, ints(s.Seats), ints64(s.Generations), cl.Name))
				}
			}
		}
		fmt.Fprintf(tw, "%s\t%s\tRunning\t%s\n", name, p.Spec.NodeName, dash(strings.Join(seats, "; ")))
		for _, n := range c.Nodes {
			if n.Name == p.Spec.NodeName {
				ran = append(ran, running{p, n})
			}
		}
	}
	tw.Flush()

	fmt.Fprintln(out, "\nWhat each container gets (the CDI specs the plugin wrote, injected as the container runtime does)")
	for _, r := range ran {
		ctrs := r.node.Containers(r.pod.UID)
		var names []string
		for name := range ctrs {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			ctr := ctrs[name]
			fmt.Fprintf(out, "\n  %s/%s on %s\n", r.pod.Name, name, r.node.Name)
			fmt.Fprintf(out, "    CDI devices: %s\n", strings.Join(ctr.CDIDevices, " "))
			var keys []string
			for k := range ctr.Env {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				fmt.Fprintf(out, "    %s=%s\n", k, ctr.Env[k])
			}
			var nodes []string
			for _, d := range ctr.DeviceNodes {
				nodes = append(nodes, fmt.Sprintf("%s (c %d:%d)", d.Path, d.Major, d.Minor))
			}
			fmt.Fprintf(out, "    device nodes: %s\n", strings.Join(nodes, ", "))
		}
	}
	return nil
}

func podClaims(p *v1.Pod, claims []resourceapi.ResourceClaim) []resourceapi.ResourceClaim {
	var names []string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			names = append(names, *s.ResourceClaimName)
		}
	}
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			names = append(names, *rc.ResourceClaimName)
		}
	}
	if s := p.Status.ExtendedResourceClaimStatus; s != nil {
		names = append(names, s.ResourceClaimName)
	}
	var out []resourceapi.ResourceClaim
	for _, cl := range claims {
		if contains(names, cl.Name) {
			out = append(out, cl)
		}
	}
	return out
}

func pendingReason(p *v1.Pod) string {
	for _, cond := range p.Status.Conditions {
		if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse {
			return cond.Message
		}
	}
	return "not scheduled yet"
}

func ints(xs []int) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprint(x))
	}
	return strings.Join(s, ",")
}

func ints64(xs []int64) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprint(x))
	}
	return strings.Join(s, ",")
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
