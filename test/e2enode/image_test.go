package e2enode

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/kyb-ai/kyb-dra-driver/test/ociimage"
	"github.com/kyb-ai/kyb-dra-driver/test/productimage"
	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

// nodeConfigMap is a node configuration the plan prints back: 1x seats
// four to a GPU.
const nodeConfigMap = `profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 4}
`

// TestProductImageOnARealNode imports the driver's image (make image-oci,
// built without a container engine) into a real node's containerd and runs
// it: its entrypoint in a pod, as the chart's default image would be; its
// binaries as the image's user 65532 against the image's own glibc and
// libgcc_s; and loads it into podman.
func TestProductImageOnARealNode(t *testing.T) {
	img, err := realnode.ProductImageFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	archive, err := ociimage.Read(img.Archive)
	if err != nil {
		t.Fatal(err)
	}
	if archive.Name != img.Ref {
		t.Fatalf("the archive names its image %q, want %q", archive.Name, img.Ref)
	}
	// What the plan prints, from the binary make build made: the image's
	// must print the same, byte for byte.
	want, err := exec.Command(filepath.Join(tools.Bin, "kyb-dra-plugin"), "plan", "--simulate", "dgx-h100").Output()
	if err != nil {
		t.Fatalf("plan on the host: %v", err)
	}
	if !strings.Contains(string(want), "Node node-1: 8x NVIDIA H100 80GB HBM3") {
		t.Fatalf("plan on the host printed %q", want)
	}

	c := startCluster(t)
	n, _ := startNode(t, c, realnode.Options{Name: "image-node", Preset: "dgx-h100"})
	if err := n.ImportImage(img.Archive); err != nil {
		t.Fatal(err)
	}
	if d, err := n.ImageDigest(img.Ref); err != nil || d != archive.Digest.String() {
		t.Fatalf("containerd has %s as %q (%v); want the archive's manifest %s", img.Ref, d, err, archive.Digest)
	}

	t.Run("the entrypoint plans in a pod", func(t *testing.T) {
		pod := &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "plan", Namespace: "default"},
			Spec: v1.PodSpec{
				NodeSelector:  map[string]string{"kubernetes.io/hostname": n.Name},
				HostNetwork:   true,
				RestartPolicy: v1.RestartPolicyNever,
				// No command and no securityContext: the image's
				// entrypoint and user.
				Containers: []v1.Container{{Name: "plan", Image: img.Ref, ImagePullPolicy: v1.PullNever, Args: []string{"plan", "--simulate", "dgx-h100"}}},
			},
		}
		if _, err := c.Client.CoreV1().Pods("default").Create(c.Ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var phase v1.PodPhase
		err := wait.PollUntilContextTimeout(c.Ctx, 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			p, err := c.Client.CoreV1().Pods("default").Get(ctx, "plan", metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			phase = p.Status.Phase
			return phase == v1.PodSucceeded || phase == v1.PodFailed, nil
		})
		if err != nil || phase != v1.PodSucceeded {
			t.Fatalf("pod plan: phase %s (%v): %s", phase, err, describe(c, "plan"))
		}
		got, err := c.Client.CoreV1().Pods("default").GetLogs("plan", &v1.PodLogOptions{Container: "plan"}).DoRaw(c.Ctx)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("the pod printed:\n%s\nthe host's binary:\n%s", got, want)
		}
		deletePod(t, c, "plan")
	})

	t.Run("the binaries run as 65532 on the image's glibc and libgcc_s", func(t *testing.T) {
		// A configuration only user 65532 may read, and one only root
		// may: the plan reads the first and is refused the second.
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		mine, roots := filepath.Join(dir, "mine.yaml"), filepath.Join(dir, "roots.yaml")
		for f, uid := range map[string]int{mine: productimage.NonrootUID, roots: 0} {
			if err := os.WriteFile(f, []byte(nodeConfigMap), 0o400); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(f, uid, uid); err != nil {
				t.Fatal(err)
			}
		}
		// The host's binary (as root) prints the profile's row.
		hostPlan, err := exec.Command(filepath.Join(tools.Bin, "kyb-dra-plugin"), "plan", "--simulate", "dgx-h100", "--config", mine).Output()
		if err != nil {
			t.Fatalf("plan on the host with %s: %v", mine, err)
		}
		var row string
		for _, l := range strings.Split(string(hostPlan), "\n") {
			if strings.HasPrefix(l, "1x ") && strings.Contains(l, "kyb.ai/gpu-1x-seat") {
				row = l
			}
		}
		if !strings.Contains(row, " 4 ") {
			t.Fatalf("the host's plan has no row of 1x seats four to a GPU:\n%s", hostPlan)
		}
		mounts := []realnode.Mount{{Host: dir, Container: "/config", ReadOnly: true}}
		plan := []string{"/usr/local/bin/kyb-dra-plugin", "plan", "--simulate", "dgx-h100", "--config"}
		out, errOut, err := n.RunImage(img.Ref, realnode.RunOptions{Args: append(plan, "/config/mine.yaml"), Mounts: mounts})
		if err != nil || !strings.Contains(out, row) {
			t.Errorf("plan with a configuration of user 65532 (%v) printed:\n%s\n%s\nwant the row %q", err, out, errOut, row)
		}
		out, errOut, err = n.RunImage(img.Ref, realnode.RunOptions{Args: append(plan, "/config/roots.yaml"), Mounts: mounts})
		if err == nil || !strings.Contains(errOut, "open /config/roots.yaml: permission denied") {
			t.Errorf("plan with a configuration only root may read (%v) printed:\n%s\n%s", err, out, errOut)
		}

		// The image's loader resolves every library the binaries
		// need from the image itself, and libgcc_s.so.1, which glibc
		// dlopens by that name when a thread is cancelled: preloaded
		// by name, the loader looks for it as dlopen does.
		for _, bin := range []string{"kyb-dra-plugin", "kyb-device-plugin", "kyb-cuda-probe"} {
			out, errOut, err := n.RunImage(img.Ref, realnode.RunOptions{Args: []string{"/lib64/ld-linux-x86-64.so.2", "--list", "--preload", "libgcc_s.so.1", "/usr/local/bin/" + bin}})
			if err != nil || strings.Contains(out, "not found") || strings.Contains(errOut, "ld.so") ||
				!strings.Contains(out, "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6") || !strings.Contains(out, "libgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1") {
				t.Errorf("%s's libraries (%v):\n%s\n%s", bin, err, out, errOut)
			}
		}
		out, errOut, err = n.RunImage(img.Ref, realnode.RunOptions{Args: []string{"/lib64/ld-linux-x86-64.so.2", "--preload", "libgcc_s.so.1", "/usr/local/bin/kyb-device-plugin", "--help"}})
		if err != nil || !strings.Contains(out+errOut, "Usage: kyb-device-plugin") || strings.Contains(errOut, "cannot be preloaded") {
			t.Errorf("kyb-device-plugin --help with libgcc_s.so.1 loaded (%v):\n%s\n%s", err, out, errOut)
		}
		// The CUDA probe dlopens libcuda.so.1, which only a GPU
		// node's driver brings: it says so, from the image's glibc.
		out, errOut, err = n.RunImage(img.Ref, realnode.RunOptions{Args: []string{"/usr/local/bin/kyb-cuda-probe"}})
		var probe struct{ Error string }
		if err != nil || json.Unmarshal([]byte(out), &probe) != nil || !strings.Contains(probe.Error, "libcuda.so.1: cannot open shared object file") {
			t.Errorf("kyb-cuda-probe (%v) printed:\n%s\n%s", err, out, errOut)
		}
	})

	t.Run("podman loads it", func(t *testing.T) {
		// Short: podman refuses a run root path over 50 characters.
		root, err := os.MkdirTemp("", "kyb-podman-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(root) })
		global := []string{"--root", filepath.Join(root, "root"), "--runroot", filepath.Join(root, "run"), "--tmpdir", filepath.Join(root, "tmp"),
			"--cgroup-manager", "cgroupfs", "--events-backend", "file", "--storage-driver", "vfs"}
		if out, err := exec.Command("podman", append(global, "load", "-i", img.Archive)...).CombinedOutput(); err != nil {
			t.Fatalf("podman load: %v\n%s", err, out)
		}
		out, err := exec.Command("podman", append(global, "image", "inspect", "--format", "{{.Digest}} {{.Config.User}} {{json .Config.Entrypoint}}", img.Ref)...).CombinedOutput()
		want := archive.Digest.String() + ` 65532:65532 ["/usr/local/bin/kyb-dra-plugin"]`
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("podman image inspect %s (%v): %s; want %s", img.Ref, err, out, want)
		}
	})
}
