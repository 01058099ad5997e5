package placement

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubernetes/test/utils/ktesting"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// SchedEnv is what the policies that place through a real scheduler need:
// a control plane (etcd, kube-apiserver, the harness's in-process
// kube-scheduler and, for the kyb rows, the kyb-scheduler binary) whose
// nodes publish the ResourceSlices the DRA rows allocate from.
type SchedEnv struct {
	// TB owns the control plane: it stops when TB cleans up. A program
	// passes a harness.ProcessTB and recovers its harness.FatalError.
	TB ktesting.TB
	// KybScheduler is the kyb-scheduler binary; empty: the harness's
	// default ($KYB_SCHEDULER, else one built from cmd/kyb-scheduler).
	KybScheduler string
	// Settle is how long a placement waits, once the study's own
	// informers have seen every release before it, for the scheduler's
	// informers to see them too (see sched.go).
	Settle time.Duration
	// Recheck is how long a reject that the study's mirror disagrees with
	// waits for the scheduler to try the pod again (see sched.go).
	Recheck time.Duration
	// Timeout bounds the wait for one verdict of the scheduler.
	Timeout time.Duration
	// EtcdLog is where etcd logs; default stderr.
	EtcdLog string
	// DefragPeriod, where set, has the -defrag rows' scheduler also
	// consolidate once per period of wall time (defrag.go).
	DefragPeriod time.Duration
}

// DefaultSchedEnv has the waits kyb-sim uses.
func DefaultSchedEnv(tb ktesting.TB) SchedEnv {
	return SchedEnv{TB: tb, Settle: 20 * time.Millisecond, Recheck: 3 * time.Second, Timeout: time.Minute}
}

// controlPlane is the cluster the real-scheduler policies share, one row
// after the other, each in a namespace of its own.
type controlPlane struct {
	env SchedEnv
	c   *harness.Cluster
}

// startControlPlane starts the cluster, with kyb-scheduler beside the
// default scheduler if withKyb (and a second one that defragments if
// withDefrag), and creates a Node object and the
// ResourceSlices of every node of the study: the plugin's pool of the
// node's pack plan in the shared layout, exactly what the DRA rows
// allocate from, created directly rather than by a running plugin (no
// kubelet is needed: nothing runs in the pods). The scheduler sees the
// same objects a cluster of real nodes would show it.
func startControlPlane(ctx context.Context, env SchedEnv, nodes []*Node, withKyb, withDefrag bool) (cp *controlPlane, err error) {
	if env.TB == nil {
		return nil, fmt.Errorf("the real-scheduler policies need a control plane, and no owner was given for it")
	}
	defer func() {
		// A ProcessTB's Fatal panics; a testing.T's ends the test.
		if r := recover(); r != nil {
			fe, ok := r.(harness.FatalError)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("start the control plane: %w", fe)
		}
	}()
	opts := harness.Options{EtcdLog: env.EtcdLog}
	if withKyb {
		// The stream has no gangs. Gang scheduling, on by default in
		// kyb-scheduler, would have it wait for the Workload and PodGroup
		// API, which the API server serves only with GenericWorkload; on
		// the API server, the gate would reach the in-process
		// kube-scheduler too (process-wide gates), and the stock row would
		// no longer run kube-scheduler's defaults.
		opts.KybScheduler = &harness.KybSchedulerOptions{Binary: env.KybScheduler, Args: []string{"--feature-gates=GenericWorkload=false"}}
	}
	cp = &controlPlane{env: env, c: harness.Start(env.TB, opts)}
	if withDefrag {
		if err := startDefragScheduler(cp, env.KybScheduler, env.DefragPeriod); err != nil {
			return nil, err
		}
	}
	classes := map[string]bool{}
	for _, n := range nodes {
		plan := n.plans[v1alpha1.PolicyPack]
		if err := harness.CreateReadyNode(ctx, cp.c.Client, n.Name, nil); err != nil {
			return nil, err
		}
		for _, rs := range draresources.ResourceSlices(draresources.Resources(plan, n.inv, n.Name, draresources.LayoutShared), n.Name) {
			if _, err := cp.c.Client.ResourceV1().ResourceSlices().Create(ctx, rs, metav1.CreateOptions{}); err != nil {
				return nil, fmt.Errorf("node %s: create ResourceSlice: %w", n.Name, err)
			}
		}
		for _, dc := range draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{}) {
			if classes[dc.Name] {
				continue
			}
			classes[dc.Name] = true
			if _, err := cp.c.Client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
				return nil, fmt.Errorf("create DeviceClass %s: %w", dc.Name, err)
			}
		}
	}
	// The schedulers' informers see the nodes, slices and classes soon
	// after; a first placement before that would be turned away (and be
	// counted as rejected with room).
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return cp, nil
}
