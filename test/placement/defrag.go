package placement

// The -defrag rows place through a second kyb-scheduler, run with
// --defragmentation=on under a profile of its own name: a request that
// waits for a group no node has free makes the scheduler evict other
// pods of the row, whose move frees one. Every pod of these rows is a
// ReplicaSet's (an owner reference; no ReplicaSet controller runs), so
// that each may be moved, with no grace period (no kubelet runs). The
// study does what the controller and the resource-claim controller would:
// it deletes an evicted pod's claim and creates the pod again, with a
// claim of the same size, and records where its replacement runs; the
// request waits until it is bound or reported unschedulable without a
// nominated node. The moved request keeps its end time: the study counts
// the evictions, not the work a restart would cost.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// defragScheduler is the profile of the kyb-scheduler that defragments.
const defragScheduler = "kyb-scheduler-defrag"

// moving is what a -defrag row follows of its pods.
type moving struct {
	// running are the row's pods bound and not yet released, by name.
	running map[string]*runningPod
	// evictions counts the row's pods evicted; lost, those whose
	// replacement was not placed.
	evictions, lost int
	seq             int
}

// runningPod is a request's pod and where the study's mirror has it.
type runningPod struct {
	r  Request
	pl *Placement
}

// movable makes a pod of a -defrag row a ReplicaSet's, without a grace
// period.
func movable(pod *v1.Pod) {
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "placement", UID: "placement-study", Controller: ptr.To(true)}}
	pod.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
}

// Evictions counts the pods the row's scheduler evicted so far.
func (p *schedPolicy) Evictions() int {
	if p.defrag == nil {
		return 0
	}
	return p.defrag.evictions
}

// Lost counts the moved pods whose replacement was not placed.
func (p *schedPolicy) Lost() int {
	if p.defrag == nil {
		return 0
	}
	return p.defrag.lost
}

// placeMoving waits for the request's pod as Place does, while pods the
// scheduler evicts for it are created again and placed: until the pod is
// bound, or unschedulable with no node nominated, and every replacement
// is placed or given up.
func (p *schedPolicy) placeMoving(ctx context.Context, r Request, name string) (*Placement, error) {
	logger := klog.FromContext(ctx)
	key := p.ns + "/" + name
	deadline := time.After(p.cp.env.Timeout)
	replacements := map[string]*runningPod{}
	refused := map[string]time.Time{}
	node, decided := "", false
	for {
		if err := p.recreateEvicted(ctx, replacements); err != nil {
			return nil, err
		}
		for rname, rp := range replacements {
			n, unschedulable, nominated := p.podState(p.ns + "/" + rname)
			switch {
			case n != "":
				if err := p.moved(ctx, rname, n, rp); err != nil {
					return nil, err
				}
				delete(replacements, rname)
				delete(refused, rname)
			case unschedulable && !nominated:
				// Give a stale cache the scheduler's retry (sched.go).
				if _, ok := refused[rname]; !ok {
					refused[rname] = time.Now()
				} else if time.Since(refused[rname]) > p.cp.env.Recheck {
					logger.Info("A moved pod's replacement fits nowhere", "pod", p.ns+"/"+rname, "message", p.message(p.ns+"/"+rname))
					p.defrag.lost++
					rp.pl.GPUs, rp.pl.release = nil, nil
					delete(replacements, rname)
					if err := p.remove(ctx, rname); err != nil {
						return nil, err
					}
				}
			}
		}
		if !decided {
			n, unschedulable, nominated := p.podState(key)
			if n != "" || unschedulable && !nominated {
				node, decided = n, true
			}
		}
		if decided && len(replacements) == 0 {
			break
		}
		select {
		case <-p.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			return nil, fmt.Errorf("pod %s: not placed, nor refused, nor its moved pods placed after %v", key, p.cp.env.Timeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if node == "" && p.roomFor(r.Size) {
		n, err := p.verdict(ctx, key, p.cp.env.Recheck, true)
		if err != nil {
			return nil, fmt.Errorf("pod %s: %w", key, err)
		}
		if n != "" {
			p.staleRejects++
		} else {
			logger.Info("Rejected while a group of the size was free", "pod", key, "size", r.Size, "message", p.message(key))
		}
		node = n
	}
	if node == "" {
		return nil, p.remove(ctx, name)
	}
	return p.placed(ctx, r, name, node)
}

// recreateEvicted finds the row's running pods that went without the
// study removing them (evicted), takes them off the mirror, deletes their
// claims and creates each again, as a ReplicaSet would.
func (p *schedPolicy) recreateEvicted(ctx context.Context, replacements map[string]*runningPod) error {
	client := p.cp.c.Client
	for name, rp := range p.defrag.running {
		obj, ok, _ := p.pods.GetByKey(p.ns + "/" + name)
		if ok && obj.(*v1.Pod).DeletionTimestamp == nil {
			continue
		}
		p.defrag.evictions++
		rp.pl.Node.release(rp.pl.GPUs)
		if ok {
			// Terminating: what the kubelet would confirm.
			if err := client.CoreV1().Pods(p.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete evicted pod %s/%s: %w", p.ns, name, err)
			}
		}
		if err := p.remove(ctx, name); err != nil {
			return err
		}
		p.defrag.seq++
		again := fmt.Sprintf("m%d", p.defrag.seq)
		if err := p.create(ctx, again, rp.r.Size); err != nil {
			return err
		}
		replacements[again] = rp
	}
	return nil
}

// moved records where a moved pod's replacement runs: the mirror takes
// its GPUs, and its request's placement follows it.
func (p *schedPolicy) moved(ctx context.Context, name, node string, rp *runningPod) error {
	pl, err := p.placed(ctx, rp.r, name, node)
	if err != nil {
		return err
	}
	if err := pl.Node.take(pl.GPUs); err != nil {
		return fmt.Errorf("moved pod %s/%s: %w", p.ns, name, err)
	}
	*rp.pl = *pl
	p.defrag.running[name] = &runningPod{r: rp.r, pl: rp.pl}
	return nil
}

// podState is what the study's informer shows of a pod: the node it is
// bound to, whether the scheduler reported it unschedulable for want of
// devices, and whether it nominated a node for it (its preemption or
// defragmentation is under way).
func (p *schedPolicy) podState(key string) (node string, unschedulable, nominated bool) {
	obj, ok, _ := p.pods.GetByKey(key)
	if !ok {
		return "", false, false
	}
	pod := obj.(*v1.Pod)
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable &&
			strings.Contains(c.Message, unschedulableNoFit) {
			unschedulable = true
		}
	}
	return pod.Spec.NodeName, unschedulable, pod.Status.NominatedNodeName != ""
}

// startDefragScheduler runs the second kyb-scheduler: its built-in
// configuration (as it writes it) under the profile name defragScheduler,
// with --defragmentation=on, and consolidating once per period where
// given.
func startDefragScheduler(cp *controlPlane, bin string, period time.Duration) error {
	if bin == "" {
		bin = cp.c.KybSchedulerBinary()
	}
	gates := "--feature-gates=GenericWorkload=false"
	file := filepath.Join(cp.c.Dir, "kyb-scheduler-built-in.yaml")
	if out, err := exec.Command(bin, "--write-config-to="+file, "--kubeconfig="+cp.c.Kubeconfig, gates).CombinedOutput(); err != nil {
		return fmt.Errorf("%s --write-config-to: %w\n%s", bin, err, out)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	profiles, _ := cfg["profiles"].([]any)
	if len(profiles) != 1 {
		return fmt.Errorf("%s: %d profiles, want kyb-scheduler's one", file, len(profiles))
	}
	profiles[0].(map[string]any)["schedulerName"] = defragScheduler
	conn, _ := cfg["clientConnection"].(map[string]any)
	if conn == nil {
		conn = map[string]any{}
		cfg["clientConnection"] = conn
	}
	conn["kubeconfig"] = cp.c.Kubeconfig
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	args := []string{gates, "--defragmentation=on"}
	if period > 0 {
		args = append(args, "--defragmentation-period="+period.String())
	}
	cp.c.StartKybScheduler(harness.KybSchedulerOptions{Binary: bin, Name: defragScheduler, Config: string(out), Args: args})
	return nil
}
