package e2enode

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cudaprobe"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

// probe prints what a container got: its environment, the GPU device
// nodes, its mounts, its device metadata and what CUDA (the node's fake
// driver) shows it, between markers the tests split on; then it stays up,
// so that a test can restart things under a running pod.
const probeReport = `env | sort; echo '--- devices'; ls -l /dev/nvidia* 2>&1 | sort; echo '--- mounts'; cat /proc/mounts; ` +
	`echo '--- metadata'; for f in $(find /var/run/kubernetes.io/dra-device-attributes -name '*.json' 2>/dev/null | sort); do echo "FILE $f"; cat "$f"; echo; done; ` +
	`echo '--- cuda'; kyb-cuda-probe 2>&1; echo '--- end'; `

const probe = probeReport + `sleep 3600`

type podSpec struct {
	name string
	node string
	// containers maps a container's name to the claim entries it uses;
	// one container "app" using every claim when empty.
	containers map[string][]string
	claims     []v1.PodResourceClaim
	limits     v1.ResourceList
	// command is the containers' shell command; default: probe.
	command string
	// scheduler is the pod's schedulerName; default: the default scheduler.
	scheduler string
}

func createPod(t *testing.T, c *harness.Cluster, p podSpec) *v1.Pod {
	t.Helper()
	if p.containers == nil {
		var all []string
		for _, rc := range p.claims {
			all = append(all, rc.Name)
		}
		p.containers = map[string][]string{"app": all}
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: "default"},
		Spec: v1.PodSpec{
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": p.node},
			SchedulerName:                 p.scheduler,
			HostNetwork:                   true,
			RestartPolicy:                 v1.RestartPolicyNever,
			ResourceClaims:                p.claims,
			TerminationGracePeriodSeconds: new(int64),
		},
	}
	for name, claims := range p.containers {
		ctr := v1.Container{
			Name: name, Image: realnode.BusyboxImage, ImagePullPolicy: v1.PullNever,
			Command: []string{"/bin/sh", "-c", cmp.Or(p.command, probe)},
		}
		for _, rc := range claims {
			ctr.Resources.Claims = append(ctr.Resources.Claims, v1.ResourceClaim{Name: rc})
		}
		ctr.Resources.Limits = p.limits
		pod.Spec.Containers = append(pod.Spec.Containers, ctr)
	}
	out, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", p.name, err)
	}
	return out
}

// claimTemplate creates a template asking for count devices of a class
// that match a CEL selector, if one is given.
func claimTemplate(t *testing.T, c *harness.Cluster, name, class string, count int64, selector string) {
	t.Helper()
	var sel []resourceapi.DeviceSelector
	if selector != "" {
		sel = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}}
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, Count: count, Selectors: sel}}},
		}}},
	}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates("default").Create(c.Ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create claim template %s: %v", name, err)
	}
}

func fromTemplate(entry, tmpl string) v1.PodResourceClaim {
	return v1.PodResourceClaim{Name: entry, ResourceClaimTemplateName: &tmpl}
}

func byName(entry, claim string) v1.PodResourceClaim {
	return v1.PodResourceClaim{Name: entry, ResourceClaimName: &claim}
}

// output is what one container printed, split by the probe's markers.
type output struct {
	env     map[string]string
	devices []string // lines of ls -l /dev/nvidia*
	mounts  []string // lines of /proc/mounts
	// metadata maps a device metadata file's path to its content.
	metadata map[string]string
	// cuda is the CUDA probe's JSON.
	cuda string
	raw  string
}

// cudaSees is what the CUDA probe saw: the library it loaded, the driver's
// API version and the devices' UUIDs, sorted.
func (o output) cudaSees(t *testing.T) (cudaprobe.Result, []string) {
	t.Helper()
	var r cudaprobe.Result
	if err := json.Unmarshal([]byte(o.cuda), &r); err != nil {
		t.Fatalf("the CUDA probe's output %q: %v", o.cuda, err)
	}
	var uuids []string
	for _, d := range r.Devices {
		uuids = append(uuids, d.UUID)
	}
	slices.Sort(uuids)
	return r, uuids
}

func (o output) device(name string) bool {
	for _, l := range o.devices {
		if strings.HasSuffix(l, " /dev/"+name) {
			return true
		}
	}
	return false
}

func (o output) mountedAt(path string) bool {
	for _, l := range o.mounts {
		if f := strings.Fields(l); len(f) > 1 && f[1] == path {
			return true
		}
	}
	return false
}

func (o output) mountedUnder(dir string) bool {
	for _, l := range o.mounts {
		if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[1], dir+"/") {
			return true
		}
	}
	return false
}

// waitForOutput waits until a container of a running pod has printed all
// of the probe, reading its log through the API server as kubectl logs
// does (API server → kubelet → containerd's log file).
func waitForOutput(t *testing.T, c *harness.Cluster, pod, container string) output {
	t.Helper()
	var raw string
	var lastErr error
	err := wait.PollUntilContextTimeout(c.Ctx, 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		b, err := c.Client.CoreV1().Pods("default").GetLogs(pod, &v1.PodLogOptions{Container: container}).DoRaw(ctx)
		if err != nil {
			lastErr = err
			return false, nil
		}
		raw = string(b)
		return strings.Contains(raw, "--- end"), nil
	})
	if err != nil {
		t.Fatalf("pod %s container %s printed no complete probe in 90s (log %q, last error %v): %s", pod, container, raw, lastErr, describe(c, pod))
	}
	return parseOutput(raw)
}

func parseOutput(raw string) output {
	o := output{env: map[string]string{}, metadata: map[string]string{}, raw: raw}
	section, file := "env", ""
	for _, l := range strings.Split(raw, "\n") {
		switch l {
		case "--- devices":
			section = "devices"
			continue
		case "--- mounts":
			section = "mounts"
			continue
		case "--- metadata":
			section = "metadata"
			continue
		case "--- cuda":
			section = "cuda"
			continue
		case "--- end":
			return o
		}
		switch section {
		case "env":
			if k, v, ok := strings.Cut(l, "="); ok {
				o.env[k] = v
			}
		case "devices":
			if l != "" {
				o.devices = append(o.devices, l)
			}
		case "mounts":
			o.mounts = append(o.mounts, l)
		case "cuda":
			o.cuda += l + "\n"
		case "metadata":
			if f, ok := strings.CutPrefix(l, "FILE "); ok {
				file = f
			} else if file != "" {
				o.metadata[file] += l
			}
		}
	}
	return o
}

// describe summarises a pod for failure messages, with its events.
func describe(c *harness.Cluster, pod string) string {
	var b strings.Builder
	b.WriteString(c.DescribePod("default", pod))
	evs, err := c.Client.CoreV1().Events("default").List(c.Ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
	if err == nil {
		for _, e := range evs.Items {
			fmt.Fprintf(&b, "\n  event %s %s: %s", e.Type, e.Reason, e.Message)
		}
	}
	return b.String()
}

// deletePod deletes a pod and waits until the kubelet has removed it.
func deletePod(t *testing.T, c *harness.Cluster, name string) {
	t.Helper()
	c.DeletePod(t, "default", name)
}
