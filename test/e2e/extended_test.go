package e2e

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// A pod whose two containers each ask for the extended resource gets one
// claim from the scheduler, with a request for each container, and the
// kubelet gives each container its own request's devices. Each container
// names its own GPU by UUID, as one request of one claim does: the real
// scheduler names the requests, the real kubelet maps them and answers
// PodResources.
func TestExtendedResourcesNameEachContainersOwnGPU(t *testing.T) {
	c := harness.Start(t, harness.Options{Nodes: []harness.NodeOptions{{Name: "node-a", Preset: "dgx-h100", Config: seedConfig}}})
	installClasses(t, c)
	createPod(t, c, podSpec{name: "two", containers: []string{"c0", "c1"}, limits: v1.ResourceList{"kyb.ai/gpu-1x-seat": resource.MustParse("1")}})
	_, _, ctrs := c.WaitForPodRunning(t, "default", "two", timeout)
	for _, name := range []string{"c0", "c1"} {
		env := ctrs[name].Env
		got, own := env["CUDA_VISIBLE_DEVICES"], env["NVIDIA_VISIBLE_DEVICES"]
		if !strings.HasPrefix(got, "GPU-") || got != own || len(gpuNodes(ctrs[name])) != 1 {
			t.Errorf("container %s: CUDA_VISIBLE_DEVICES=%q, NVIDIA_VISIBLE_DEVICES=%q, GPU device nodes %v; want its own GPU's UUID", name, got, own, gpuNodes(ctrs[name]))
		}
	}
}
