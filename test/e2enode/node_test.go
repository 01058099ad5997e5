package e2enode

import (
	v1 "k8s.io/api/core/v1"
	"path/filepath"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
	"github.com/kyb-ai/kyb-dra-driver/test/realnode"
)

const (
	class1x = "gpu-1x-seat.kyb.ai"
	class2x = "gpu-2x-seat.kyb.ai"
)

func startCluster(t *testing.T) *harness.Cluster {
	t.Helper()
	// The API server reaches a kubelet at its address, not its name: node
	// names do not resolve here.
	c := harness.Start(t, harness.Options{APIServerFlags: []string{"--kubelet-preferred-address-types=InternalIP"}})
	if _, err := c.ApplyFile(filepath.Join(repoRoot(), "deployments/static/deviceclasses.yaml"), harness.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestOneSeatPod(t *testing.T) {
	c := startCluster(t)
	n := realnode.Start(t, c, tools, realnode.Options{Name: "node-a", Preset: "dgx-h100"})
	claimTemplate(t, c, "one-seat", class1x, 1)
	createPod(t, c, podSpec{name: "seat", node: n.Name, claims: []v1.PodResourceClaim{fromTemplate("gpu", "one-seat")}})
	out := waitForOutput(t, c, "seat", "app")
	t.Logf("container output:\n%s", out.raw)
}
