package e2enode

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

// helmMPSValues share each GPU of the 1x profile between four seats with
// MPS, with the pods the chart runs for it.
const helmMPSValues = `mps:
  enabled: true
nodeConfig:
  profiles:
  - resource: kyb.ai/gpu-1x-seat
    seatsPerGroup: 4
    sharing: {strategy: mps}
`

// mpsJoinLoop joins the seat's MPS daemon from inside the container every
// second, asking for the whole GPU, and prints what it got with the time:
// the simulated client is the plugin's own binary, as the simulated daemon
// the plugin runs is.
const mpsJoinLoop = `while true; do echo "JOIN $(date +%s) $(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G kyb-dra-plugin mps-control-sim --client 2>&1)"; sleep 1; done`

// joinedAfter waits until the pod's container joined its daemon after
// since, and returns what the daemon gave it.
func joinedAfter(t *testing.T, h *helmNode, pod string, since time.Time) string {
	t.Helper()
	var got string
	waitUntil(t, "pod "+pod+" joined its MPS daemon", time.Minute, func() bool {
		b, err := h.c.Client.CoreV1().Pods("default").GetLogs(pod, &v1.PodLogOptions{Container: "app"}).DoRaw(h.c.Ctx)
		if err != nil {
			return false
		}
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.SplitN(l, " ", 3)
			if len(f) < 3 || f[0] != "JOIN" {
				continue
			}
			if at, err := strconv.ParseInt(f[1], 10, 64); err == nil && at > since.Unix() {
				got = f[2]
				return true
			}
		}
		return false
	})
	return got
}

// cgroup2 tells whether the machine's cgroups are cgroup v2 alone.
func cgroup2() bool {
	var st unix.Statfs_t
	return unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// mpsDaemons returns the PIDs of the simulated MPS daemons running on the
// machine (the plugin runs them in the host's PID namespace).
func mpsDaemons() []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), "mps-control-sim\x00-f") {
			out = append(out, pid)
		}
	}
	return out
}

// MPS through the chart on a real node: the plugin's pod (privileged, in
// the host's PID namespace) runs the simulated MPS daemon from its own
// binary, a workload's container joins it and gets its seat's share; the
// daemon outlives the plugin's pod (deleted, made again by the DaemonSet),
// whose successor adopts it; it stops when the last seat goes.
func TestHelmMPS(t *testing.T) {
	h := startHelmNode(t, realnode.Options{Name: "helm-mps", Preset: "dgx-h100",
		ImageFiles: map[string]string{"bin/kyb-dra-plugin": filepath.Join(tools.Bin, "kyb-dra-plugin")}})
	c, n := h.c, h.n
	values := filepath.Join(t.TempDir(), "mps-values.yaml")
	if err := os.WriteFile(values, []byte(helmMPSValues), 0o644); err != nil {
		t.Fatal(err)
	}
	h.install(t, "install", []string{example("simulated-values.yaml"), values})
	first := h.waitForAgent(t, 3*time.Minute)
	h.waitRolledOut(t, time.Minute)
	if !first.Spec.HostPID || first.Spec.Containers[0].SecurityContext.Privileged == nil || !*first.Spec.Containers[0].SecurityContext.Privileged {
		t.Errorf("the plugin's pod runs without the host's PID namespace or not privileged: %+v", first.Spec)
	}

	on(t, c, "mps0", class1x, "0")
	createPod(t, c, podSpec{name: "mps", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "mps0")}, command: probeReport + mpsJoinLoop})
	o := waitForOutput(t, c, "mps", "app")
	started := time.Now()
	// dgx-h100: 81559 MiB per GPU; a quarter, rounded down.
	for k, want := range map[string]string{"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=20389M"} {
		if o.env[k] != want {
			t.Errorf("%s=%q, want %q", k, o.env[k], want)
		}
	}
	if got := joinedAfter(t, h, "mps", started.Add(-time.Minute)); got != "thread=25 mem=0=20389M" {
		t.Errorf("the container asked the daemon for the whole GPU and got %q, want its quarter", got)
	}
	daemons := mpsDaemons()
	if len(daemons) != 1 {
		t.Fatalf("MPS daemons on the machine: %v, want the seat's group's", daemons)
	}
	daemon := daemons[0]
	t.Logf("the MPS daemon of GPU 0 runs as PID %d, started by %s", daemon, first.Name)

	// The plugin's pod goes (a node drain, a crash, kubectl delete): the
	// DaemonSet makes another, which finds the daemon running and
	// adopts it; the container's client joins it as before.
	firstLog := h.log(t, first.Name, "kubelet-plugin", true)
	if err := c.Client.CoreV1().Pods(helmNamespace).Delete(c.Ctx, first.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	second := h.waitForAgent(t, 2*time.Minute, first.Name)
	restarted := time.Now()
	t.Logf("plugin pod %s deleted; %s serves the node:\n%s", first.Name, second.Name, podTable(h.pods(t)))
	secondLog := h.log(t, second.Name, "kubelet-plugin", true)
	if cgroup2() {
		// mps.cgroup: the daemon left the plugin's container for a
		// cgroup of its own, which the runtime does not empty.
		if err := syscall.Kill(daemon, 0); err != nil {
			t.Errorf("the MPS daemon (PID %d) did not outlive the plugin's pod: %v; MPS daemons now %v; the new plugin's log:\n%s", daemon, err, mpsDaemons(), secondLog)
		}
		if d := mpsDaemons(); len(d) != 1 || d[0] != daemon {
			t.Errorf("MPS daemons after the plugin's pod was made anew: %v, want PID %d alone", d, daemon)
		}
	} else {
		// cgroup v1 (the machine's): mps.cgroup, a cgroup v2 directory,
		// is no cgroup here, so the daemon stays in the plugin
		// container's cgroups, and the runtime kills what is left in
		// them with a container of the host's PID namespace. The new
		// plugin starts the daemon of the group in use again (the
		// chart's README says so).
		if d := mpsDaemons(); len(d) != 1 || d[0] == daemon || !strings.Contains(secondLog, "Started MPS control daemon") {
			t.Errorf("cgroup v1: MPS daemons after the plugin's pod was made anew: %v (the first was %d); the new plugin's log:\n%s", d, daemon, secondLog)
		} else {
			var said []string
			for _, l := range strings.Split(firstLog, "\n") {
				if strings.Contains(l, "cgroup") {
					said = append(said, l)
				}
			}
			t.Logf("cgroup v1: the MPS daemon (PID %d) stopped with the plugin's pod; the new plugin started it again as PID %d. What the first plugin logged about cgroups: %q", daemon, d[0], said)
			daemon = d[0]
		}
	}
	if got := joinedAfter(t, h, "mps", restarted); got != "thread=25 mem=0=20389M" {
		t.Errorf("after the plugin's pod was made anew, the container got %q from its daemon", got)
	}
	assertRunning(t, c, "mps")

	// The last seat of the group goes: the daemon stops.
	on(t, c, "mps1", class1x, "1")
	createPod(t, c, podSpec{name: "kept", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "mps1")}, command: probeReport + mpsJoinLoop})
	waitForOutput(t, c, "kept", "app")
	waitUntil(t, "the daemon of GPU 1", 30*time.Second, func() bool { return len(mpsDaemons()) == 2 })
	deletePod(t, c, "mps")
	waitUntil(t, fmt.Sprintf("the MPS daemon (PID %d) stopped with its group's last seat", daemon), 30*time.Second, func() bool {
		return syscall.Kill(daemon, 0) != nil
	})

	// helm uninstall while a pod holds an MPS seat, which the chart's
	// README says not to do, and what it says happens then: the pod runs
	// on with its seat; deleted, it cannot finish terminating until a
	// plugin unprepares its claim; a reinstall does, and stops the
	// daemon.
	kept := mpsDaemons()
	h.run(t, "uninstall", helmRelease, "--namespace", helmNamespace, "--wait")
	waitUntil(t, "the plugin's pod gone", time.Minute, func() bool { return len(h.pods(t)) == 0 })
	assertRunning(t, c, "kept")
	left := mpsDaemons()
	t.Logf("after helm uninstall: MPS daemons %v (before: %v), CDI specs %d", left, kept, len(specFiles(t, n)))
	if cgroup2() != (len(left) == 1) {
		t.Errorf("MPS daemons after helm uninstall with a seat held: %v, before %v; want the daemon left running on cgroup v2 only", left, kept)
	}
	if len(specFiles(t, n)) != 1 {
		t.Errorf("CDI specs after helm uninstall with a seat held: %v, want the seat's", specFiles(t, n))
	}
	// With a grace period, as pods are deleted by default (the test's
	// pods have none: deleting them removes them at once).
	grace := int64(1)
	if err := c.Client.CoreV1().Pods("default").Delete(c.Ctx, "kept", metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if p, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, "kept", metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil {
		t.Errorf("pod kept, deleted without a plugin on its node: %v %v; want it Terminating until its claim is unprepared", p, err)
	}
	h.install(t, "install", []string{example("simulated-values.yaml"), values})
	h.waitForAgent(t, 3*time.Minute)
	waitUntil(t, "pod kept gone once the reinstalled plugin unprepared its claim", time.Minute, func() bool {
		_, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, "kept", metav1.GetOptions{})
		return err != nil
	})
	waitUntil(t, "no MPS daemon left", 30*time.Second, func() bool { return len(mpsDaemons()) == 0 && len(specFiles(t, n)) == 0 })
	h.run(t, "uninstall", helmRelease, "--namespace", helmNamespace, "--wait")
}
