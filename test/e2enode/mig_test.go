package e2enode

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

// migConfig gives GPU 0 to 1g.10gb MIG seats beside the 1x seats.
const migConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat}
- {resource: kyb.ai/mig-1g.10gb, mig: {profile: 1g.10gb}, gpus: [0]}
`

// makeMIGCapabilityNodes makes GPU 0's MIG capability device nodes under
// the driver root's dev/nvidia-caps, every one mig-minors lists for it,
// as nvidia-modprobe -f /proc/driver/nvidia-caps/mig-minors does on a
// real node: containers get them from their host paths.
func makeMIGCapabilityNodes(t *testing.T, driverRoot, preset string) {
	t.Helper()
	sim, err := simnode.Load(preset, "caps")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(driverRoot, "dev", "nvidia-caps")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := bufio.NewScanner(bytes.NewReader(sim.MIGMinorsFile()))
	for s.Scan() {
		name, minor, ok := strings.Cut(s.Text(), " ")
		if !ok || !strings.HasPrefix(name, "gpu0/") {
			continue
		}
		var m uint32
		if _, err := fmt.Sscanf(minor, "%d", &m); err != nil {
			t.Fatalf("mig-minors line %q: %v", s.Text(), err)
		}
		// The numbers the simulated node's /dev has, from its majors.
		major, _, err := sim.DeviceNumbers(fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", m))
		if err != nil {
			t.Fatal(err)
		}
		node := filepath.Join(dir, fmt.Sprintf("nvidia-cap%d", m))
		if err := unix.Mknod(node, unix.S_IFCHR|0o444, int(unix.Mkdev(uint32(major), m))); err != nil {
			t.Fatalf("make %s: %v", node, err)
		}
	}
}

// specDeviceNodes are the device nodes of the claim's CDI spec on the
// node, by container path.
func specDeviceNodes(t *testing.T, n *realnode.Node, uid types.UID) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(n.CDIDir, cdi.SpecName(uid)+".json"))
	if err != nil {
		t.Fatalf("the claim's CDI spec: %v", err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range spec.Devices {
		for _, dn := range d.ContainerEdits.DeviceNodes {
			out = append(out, dn.Path)
		}
	}
	slices.Sort(out)
	return out
}

// A MIG seat in a real container on a real kubelet with containerd and
// runc: the container's CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES
// name its MIG device, and it has its parent's /dev/nvidia0 and the two
// capability nodes of its GPU and compute instances, no other GPU.
func TestMIGSeatOnARealNode(t *testing.T) {
	c := startCluster(t)
	if err := c.CreateDeviceClasses(c.Ctx, "dgx-h100", migConfig); err != nil {
		t.Fatal(err)
	}
	driver, err := realnode.NewFakeDriver(t.TempDir(), "node-mig", "dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	if err := driver.Install(c.Ctx, "580.95.05", 13000); err != nil {
		t.Fatal(err)
	}
	makeMIGCapabilityNodes(t, driver.Root, "dgx-h100")
	n := realnode.Start(t, c, tools, realnode.Options{Name: "node-mig", Preset: "dgx-h100", Config: migConfig, DriverRoot: driver.Root})

	claimTemplate(t, c, "mig", "mig-1g.10gb.kyb.ai", 1, "")
	created := createPod(t, c, podSpec{name: "mig", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "mig")},
		command: `echo "MIG_CAPS=$(ls /dev/nvidia-caps 2>&1 | sort | tr '\n' ' ')"; ` + probe})
	o := waitForOutput(t, c, "mig", "app")
	t.Logf("pod mig's container printed:\n%s", o.raw)
	uuid := o.env["CUDA_VISIBLE_DEVICES"]
	if !strings.HasPrefix(uuid, "MIG-") || strings.Contains(uuid, ",") || o.env["NVIDIA_VISIBLE_DEVICES"] != uuid {
		t.Errorf("CUDA_VISIBLE_DEVICES=%q NVIDIA_VISIBLE_DEVICES=%q, want one MIG- UUID in both", uuid, o.env["NVIDIA_VISIBLE_DEVICES"])
	}
	var gpus []string
	for _, l := range o.devices {
		f := strings.Fields(l)
		if p := f[len(f)-1]; strings.HasPrefix(p, "/dev/nvidia") && strings.Trim(strings.TrimPrefix(p, "/dev/nvidia"), "0123456789") == "" {
			gpus = append(gpus, p)
		}
	}
	if !slices.Equal(gpus, []string{"/dev/nvidia0"}) {
		t.Errorf("the container's GPU device nodes %v, want its parent's /dev/nvidia0 alone", gpus)
	}
	caps := strings.Fields(o.env["MIG_CAPS"])
	var want []string
	p, err := c.Client.CoreV1().Pods("default").Get(c.Ctx, created.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim, err := c.Client.ResourceV1().ResourceClaims("default").Get(c.Ctx, harness.PodClaim(p, "gpu"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range specDeviceNodes(t, n, claim.UID) {
		if rest, ok := strings.CutPrefix(path, "/dev/nvidia-caps/"); ok {
			want = append(want, rest)
		}
	}
	if len(caps) != 2 || !slices.Equal(caps, want) {
		t.Errorf("the container's /dev/nvidia-caps holds %v, want the two of its MIG device's spec %v", caps, want)
	}

	deletePod(t, c, "mig")
	waitUntil(t, "the claim's CDI spec removed", 30*time.Second, func() bool {
		return !slices.ContainsFunc(specFiles(t, n), func(f string) bool { return strings.Contains(f, string(claim.UID)) })
	})
}
