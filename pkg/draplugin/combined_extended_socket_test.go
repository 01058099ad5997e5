package draplugin_test

import (
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources/podresourcestest"
)

// requestIDs are the CDI device IDs a prepare returned for one request:
// what the kubelet passes to the runtime for a container mapped to it.
func requestIDs(res map[string]*drapb.NodePrepareResourceResponse, uid, request string) []string {
	var ids []string
	for _, d := range res[uid].Devices {
		if slices.Contains(d.RequestNames, request) {
			ids = append(ids, d.CdiDeviceIds...)
		}
	}
	return ids
}

// extendedResourceClaim is the claim the scheduler makes for a pod's
// extended resources: one request per container and resource, named
// container-<i>-request-<j>, each on its GPU.
func (e *env) extendedResourceClaim(requests []string, gpus []int) *resourceapi.ResourceClaim {
	e.t.Helper()
	c := e.claimOnGPUs(requests, gpus)
	c.Annotations = map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"}
	c, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Update(e.ctx, c, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// A pod's extended resources come in one claim with a request per
// container; the kubelet gives each container its own request's devices,
// yet lists the claim whole for each of them. Each container names its own
// GPUs by UUID, as one request of one claim does. A container that holds
// two of the claim's requests (two of the driver's resources) sees both
// GPUs, whichever device the runtime applies last.
func TestExtendedResourceClaimNamesEachContainersOwnGPUs(t *testing.T) {
	var kubelet *podresourcestest.Server
	e := newEnv(t, "nvlink-2x4", seed, withPodResources(t, &kubelet))
	// Another pod's claim on the node, so that the kubelet is asked.
	other := e.reserveFor(e.claim(class1x), "pod-other")
	kubelet.SetPod(other.Namespace, "pod-other", ctr("app", other))
	e.prepareOK(other)

	t.Run("one request per container", func(t *testing.T) {
		er := e.reserveFor(e.extendedResourceClaim([]string{"container-0-request-0", "container-1-request-0"}, []int{2, 3}), "pod-er")
		kubelet.SetPod(er.Namespace, "pod-er", ctr("c0", er), ctr("c1", er))
		res := e.prepare(er)
		if r := res[string(er.UID)]; r == nil || r.Error != "" {
			t.Fatalf("prepare: %+v", r)
		}
		for _, request := range []string{"container-0-request-0", "container-1-request-0"} {
			ids := requestIDs(res, string(er.UID), request)
			env, devs := e.container(ids...)
			if got, want := env["CUDA_VISIBLE_DEVICES"], e.ownGPUs(ids); got != want {
				t.Errorf("container using only %s (GPUs %v): CUDA_VISIBLE_DEVICES=%q, want its own GPU %q", request, e.gpusOf(devs), got, want)
			}
		}
	})

	t.Run("two requests in one container", func(t *testing.T) {
		er := e.reserveFor(e.extendedResourceClaim([]string{"container-0-request-0", "container-0-request-1", "container-1-request-0"}, []int{4, 5, 6}), "pod-er2")
		kubelet.SetPod(er.Namespace, "pod-er2", ctr("c0", er), ctr("c1", er))
		res := e.prepare(er)
		if r := res[string(er.UID)]; r == nil || r.Error != "" {
			t.Fatalf("prepare: %+v", r)
		}
		a, b := requestIDs(res, string(er.UID), "container-0-request-0"), requestIDs(res, string(er.UID), "container-0-request-1")
		union := e.unionOf(a, b)
		for _, order := range [][]string{slices.Concat(a, b), slices.Concat(b, a)} {
			env, devs := e.container(order...)
			sees := e.cudaSees(env, devs)
			slices.Sort(sees)
			if !slices.Equal(sees, union) {
				t.Errorf("container 0 with both its requests, injected as %v: CUDA_VISIBLE_DEVICES=%s, CUDA sees %v, want %v", order, env["CUDA_VISIBLE_DEVICES"], sees, union)
			}
		}
		c1 := requestIDs(res, string(er.UID), "container-1-request-0")
		if env, devs := e.container(c1...); !slices.Equal(e.cudaSees(env, devs), e.gpusOf(devs)) {
			t.Errorf("container 1: CUDA_VISIBLE_DEVICES=%s, CUDA sees %v, want its own GPU %v", env["CUDA_VISIBLE_DEVICES"], e.cudaSees(env, devs), e.gpusOf(devs))
		}
	})
}
