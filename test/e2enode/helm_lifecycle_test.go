package e2enode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

// The chart on a real node, as a user installs it: helm install of the
// chart with the simulated node of its example values, the driver's image
// imported into the node's containerd. The DaemonSet's pod runs on the
// real kubelet: its doctor passes, the plugin registers through the
// chart's host paths, publishes, serves metrics on its pod IP and reaches
// the API server through the "kubernetes" Service with the chart's
// ServiceAccount (RBAC on); pods get their seats.
func TestHelmInstallUpgradeUninstall(t *testing.T) {
	h := startHelmNode(t, realnode.Options{Name: "helm-node", Preset: "dgx-h100"})
	c, n := h.c, h.n
	// kyb-scheduler too, as a second scheduler beside the cluster's. The
	// chart places its pod on control-plane nodes; this machine runs the
	// control plane too, and is labelled as kubeadm labels such a node.
	patch := []byte(`{"metadata":{"labels":{"node-role.kubernetes.io/control-plane":""}}}`)
	if _, err := c.Client.CoreV1().Nodes().Patch(c.Ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	withScheduler := filepath.Join(t.TempDir(), "scheduler-values.yaml")
	if err := os.WriteFile(withScheduler, []byte("scheduler:\n  enabled: true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	examples := []string{example("simulated-values.yaml"), example("seed-values.yaml"), withScheduler}

	t.Run("install", func(t *testing.T) {
		started := time.Now()
		t.Logf("helm install:\n%s", h.install(t, "install", examples))
		pod := h.waitForAgent(t, 3*time.Minute)
		t.Logf("the DaemonSet's pod Ready %v after helm install:\n%s", time.Since(started).Round(time.Second), podTable(h.pods(t)))
		defer h.waitRolledOut(t, time.Minute)

		doctor := h.log(t, pod.Name, "doctor", false)
		t.Logf("kubectl logs %s -c doctor:\n%s", pod.Name, doctor)
		for _, want := range []string{"simulated: dgx-h100", "runtime-cdi   ok", "kubelet       ok"} {
			if !strings.Contains(doctor, want) {
				t.Errorf("the doctor's report lacks %q", want)
			}
		}
		if strings.Contains(doctor, " fail ") {
			t.Errorf("the doctor failed a check")
		}
		waitUntil(t, "the node's ResourceSlices", time.Minute, func() bool {
			l, err := c.Client.ResourceV1().ResourceSlices().List(c.Ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
			return err == nil && len(l.Items) > 0
		})
		metrics := scrapeMetrics(t, pod)
		if !strings.Contains(metrics, `kyb_dra_published_devices{`) {
			t.Errorf("the plugin's metrics have no published devices:\n%s", metrics)
		}
	})

	t.Run("a pod with a claim and a legacy pod get their seats", func(t *testing.T) {
		// Pods using GPUs wait for kyb-scheduler (scheduler.gpuPods).
		h.waitForScheduler(t, 3*time.Minute)
		on(t, c, "gpu0", class1x, "0")
		createPod(t, c, podSpec{name: "claim", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "gpu0")}})
		o := waitForOutput(t, c, "claim", "app")
		t.Logf("pod claim's container, from the containerized plugin:\n%s", o.raw)
		if o.env["KYB_GPU_GROUP"] != "G0" || o.env["KYB_GPU_SEAT"] != "0" || o.env["KYB_SEAT_GEN"] != "1" || !strings.HasPrefix(o.env["CUDA_VISIBLE_DEVICES"], "GPU-") {
			t.Errorf("pod claim: %v", o.env)
		}
		if !o.device("nvidia0") || !o.device("nvidiactl") || o.device("nvidia1") {
			t.Errorf("pod claim: device nodes %v, want /dev/nvidia0 and nvidiactl", o.devices)
		}
		createPod(t, c, podSpec{name: "legacy", node: n.Name, limits: v1.ResourceList{"kyb.ai/gpu-1x-seat": resource.MustParse("1")}})
		l := waitForOutput(t, c, "legacy", "app")
		// Neither names a scheduler: the chart's policies
		// (scheduler.gpuPods) gave both to kyb-scheduler.
		for _, name := range []string{"claim", "legacy"} {
			if by := scheduledBy(t, c, name); by != "kyb-scheduler" {
				t.Errorf("pod %s was scheduled by %q, want kyb-scheduler", name, by)
			}
		}
		if !strings.HasPrefix(l.env["CUDA_VISIBLE_DEVICES"], "GPU-") || l.env["KYB_GPU_SEAT"] == "" || l.env["KYB_GPU_GROUP"] == "" {
			t.Errorf("pod legacy: %v", l.env)
		}
		if len(l.devices) == 0 {
			t.Errorf("pod legacy: no GPU device node")
		}
	})

	t.Run("a pod placed by kyb-scheduler gets its seat", func(t *testing.T) {
		sched := h.waitForScheduler(t, 3*time.Minute)
		on(t, c, "gpu5", class1x, "5")
		createPod(t, c, podSpec{name: "placed", node: n.Name, scheduler: "kyb-scheduler", claims: []v1.PodResourceClaim{fromTemplate("gpu", "gpu5")}})
		o := waitForOutput(t, c, "placed", "app")
		if o.env["KYB_GPU_GROUP"] != "G5" || !strings.HasPrefix(o.env["CUDA_VISIBLE_DEVICES"], "GPU-") {
			t.Errorf("pod placed: %v", o.env)
		}
		by := scheduledBy(t, c, "placed")
		if by != "kyb-scheduler" {
			t.Errorf("pod placed was scheduled by %q, want kyb-scheduler", by)
		}
		t.Logf("kyb-scheduler's pod %s (image %s); pod placed bound to %s by %s; the release's pods:\n%s", sched.Name, sched.Spec.Containers[0].Image, n.Name, by, podTable(h.podsOf(t, "")))
		before := len(specFiles(t, n))
		deletePod(t, c, "placed")
		waitUntil(t, "pod placed's claim unprepared", 30*time.Second, func() bool { return len(specFiles(t, n)) == before-1 })
	})

	// Pods hold seats through two rollouts: a new image tag, then a
	// changed node configuration. In each, a claim is prepared and one is
	// unprepared while both plugin pods run; the seats held throughout and
	// their containers are untouched, nothing is lost or doubled.
	t.Run("helm upgrade while pods hold seats", func(t *testing.T) {
		on(t, c, "gpu1", class1x, "1")
		on(t, c, "gpu2", class1x, "2")
		on(t, c, "gpu3", class1x, "3")
		createPod(t, c, podSpec{name: "to-go", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "gpu1")}})
		waitForOutput(t, c, "to-go", "app")
		t.Logf("kubectl kyb seats before:\n%s", h.checkSeats(t, "claim", "legacy", "to-go"))
		held := []string{"claim", "legacy"}
		ids := map[string]string{}
		for _, name := range held {
			p, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ids[name] = containerIDs(p)
		}
		tl := record(c, held...)
		defer func() { t.Logf("timeline of the upgrades:\n%s", tl.finish()) }()

		// The same image under a second tag, as a new release of it
		// would be: the pod template changes, the DaemonSet rolls.
		repo := h.img.Ref[:strings.LastIndex(h.img.Ref, ":")]
		tag := h.img.Ref[strings.LastIndex(h.img.Ref, ":")+1:] + "-next"
		if err := n.TagImage(h.img.Ref, repo+":"+tag); err != nil {
			t.Fatal(err)
		}
		ov := h.roll(t, tl, examples, []string{"image.tag=" + tag}, func() {
			createPod(t, c, podSpec{name: "during-1", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "gpu2")}})
			o := waitForOutput(t, c, "during-1", "app")
			tl.note("pod during-1 runs with seat %s/%s", o.env["KYB_GPU_GROUP"], o.env["KYB_GPU_SEAT"])
			before := len(specFiles(t, n))
			deletePod(t, c, "to-go")
			waitUntil(t, "pod to-go's claim unprepared", 30*time.Second, func() bool { return len(specFiles(t, n)) == before-1 })
			tl.note("pod to-go deleted, its claim unprepared")
		})
		t.Logf("image rollout: %s -> %s; registration sockets while both ran: %v; served: %s", ov.old.Name, ov.new.Name, ov.sockets, ov.served)
		if img := h.pods(t)[0].Spec.Containers[0].Image; img != repo+":"+tag {
			t.Errorf("the plugin runs %s after the upgrade, want %s", img, repo+":"+tag)
		}
		h.checkUntouched(t, ids, held...)
		t.Logf("kubectl kyb seats after the image rollout:\n%s", h.checkSeats(t, "claim", "legacy", "during-1"))

		// A changed node configuration: the ConfigMap's checksum on the
		// pod template rolls the pods. It publishes one more attribute;
		// the groups, and so the seats held, stay.
		attrs := "nodeConfig.attributes={profile,group,gpuIndices,interconnect,productName}"
		ov = h.roll(t, tl, examples, []string{"image.tag=" + tag, attrs}, func() {
			createPod(t, c, podSpec{name: "during-2", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "gpu3")}})
			o := waitForOutput(t, c, "during-2", "app")
			tl.note("pod during-2 runs with seat %s/%s", o.env["KYB_GPU_GROUP"], o.env["KYB_GPU_SEAT"])
			before := len(specFiles(t, n))
			deletePod(t, c, "during-1")
			waitUntil(t, "pod during-1's claim unprepared", 30*time.Second, func() bool { return len(specFiles(t, n)) == before-1 })
			tl.note("pod during-1 deleted, its claim unprepared")
		})
		t.Logf("configuration rollout: %s -> %s; registration sockets while both ran: %v; served: %s", ov.old.Name, ov.new.Name, ov.sockets, ov.served)
		if ov.old.Annotations["checksum/config"] == ov.new.Annotations["checksum/config"] {
			t.Errorf("the new pod's checksum/config is the old one's: %s", ov.new.Annotations["checksum/config"])
		}
		published := func() (bool, string) {
			l, err := c.Client.ResourceV1().ResourceSlices().List(c.Ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
			if err != nil || len(l.Items) == 0 {
				return false, fmt.Sprintf("%v", err)
			}
			var attrs []string
			for _, sl := range l.Items {
				for _, d := range sl.Spec.Devices {
					for name := range d.Attributes {
						if strings.HasSuffix(string(name), "productName") {
							return true, ""
						}
						attrs = append(attrs, string(name))
					}
				}
			}
			return false, fmt.Sprintf("%d slices, attributes %v", len(l.Items), attrs)
		}
		err := wait.PollUntilContextTimeout(c.Ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			ok, _ := published()
			return ok, nil
		})
		if err != nil {
			_, why := published()
			t.Errorf("the slices lack the new configuration's productName attribute after a minute: %s; ConfigMap:\n%s\nplugin log:\n%s", why,
				h.configMap(t), h.log(t, ov.new.Name, "kubelet-plugin", true))
		}
		h.checkUntouched(t, ids, held...)
		t.Logf("kubectl kyb seats after the configuration rollout:\n%s", h.checkSeats(t, "claim", "legacy", "during-2"))
	})

	// helm uninstall as the chart's README says it: workloads that use
	// seats go first. Everything of the release goes from the API; the
	// node keeps what the README says it keeps.
	t.Run("helm uninstall", func(t *testing.T) {
		for _, p := range []string{"claim", "legacy", "during-2"} {
			deletePod(t, c, p)
		}
		waitUntil(t, "the claims unprepared", 30*time.Second, func() bool { return len(specFiles(t, n)) == 0 })
		objs := h.releaseObjects(t)
		started := time.Now()
		t.Logf("helm uninstall:\n%s", h.run(t, "uninstall", helmRelease, "--namespace", helmNamespace, "--wait"))
		if left := h.remaining(t, objs); len(left) > 0 {
			t.Errorf("objects of the release left after helm uninstall --wait: %v", left)
		}
		waitUntil(t, "the plugin's pod gone", time.Minute, func() bool { return len(h.pods(t)) == 0 })
		gone := time.Since(started)
		var slicesGone time.Duration
		waitUntil(t, "the node's ResourceSlices gone", 2*time.Minute, func() bool {
			l, err := c.Client.ResourceV1().ResourceSlices().List(c.Ctx, metav1.ListOptions{})
			slicesGone = time.Since(started)
			return err == nil && len(l.Items) == 0
		})
		pluginDir := filepath.Join(n.RootDir, "plugins", "gpu.kyb.ai")
		registrations, _ := filepath.Glob(filepath.Join(n.RootDir, "plugins_registry", "gpu.kyb.ai*"))
		t.Logf("helm uninstall took away %d objects; the plugin's pod gone after %v, the node's ResourceSlices after %v (the kubelet's doing, not the plugin's)", len(objs), gone.Round(time.Second), slicesGone.Round(time.Second))
		t.Logf("left on the node: %s: %s; CDI specs: %d; registration sockets: %v", pluginDir, nodeFiles(pluginDir), len(specFiles(t, n)), registrations)
		if len(registrations) > 0 {
			t.Errorf("registration sockets left in plugins_registry: %v", registrations)
		}
		if _, err := os.Stat(filepath.Join(pluginDir, "checkpoint.json")); err != nil {
			t.Errorf("the README says the checkpoint stays on the node: %v", err)
		}
	})
}
