package containerclaims

import (
	"context"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// heldClaims is what the finder reads of the seat ledger.
type heldClaims []HeldClaim

func (h heldClaims) PreparedUIDs() []types.UID { return []types.UID{"held"} }

func (h heldClaims) StandaloneClaims(context.Context) ([]HeldClaim, error) { return h, nil }

// claimsAPI is an API server of ResourceClaims that records the requests
// it answers.
func claimsAPI(t *testing.T, objs ...runtime.Object) (*fake.Clientset, *[]string) {
	t.Helper()
	client := fake.NewClientset(objs...)
	var requests []string
	client.PrependReactor("*", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
		requests = append(requests, action.GetVerb())
		return false, nil, nil
	})
	return client, &requests
}

// claimReserved is a claim of namespace ns reserved for pods.
func claimReserved(name string, pods ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name)}}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID(p)})
	}
	return c
}

// podsClaim is a claim made from a pod's template.
func podsClaim(name, pod string) *resourceapi.ResourceClaim {
	c := claimReserved(name, pod)
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod, UID: types.UID(pod), Controller: new(true)}}
	return c
}

// Where the kubelet cannot say, the reservations of the standalone claims
// the node holds are read only where the answer can change a spec: not
// for a standalone claim of the call (combined over every GPU whatever
// its pod references) beside held claims whose specs name every GPU
// already; for a claim of a pod's own, or beside a held claim whose spec
// is narrower.
func TestHeldStandaloneClaimsAreReadOnlyWhereTheyCanChangeASpec(t *testing.T) {
	name := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: n} }
	wide := heldClaims{{NamespacedName: name("s1"), EveryGPU: true}, {NamespacedName: name("s2"), EveryGPU: true}}
	narrow := heldClaims{wide[0], {NamespacedName: name("s2")}}
	for _, tc := range []struct {
		name   string
		held   heldClaims
		call   []*resourceapi.ResourceClaim
		reads  bool
		beside []types.NamespacedName
	}{
		{"a standalone claim beside wide ones", wide, []*resourceapi.ResourceClaim{claimReserved("new", "pod")}, false, nil},
		{"two claims of a pod beside wide ones", wide, []*resourceapi.ResourceClaim{podsClaim("a", "pod"), podsClaim("b", "pod")}, false, nil},
		{"a pod's own claim beside wide ones", wide, []*resourceapi.ResourceClaim{podsClaim("new", "pod")}, true, []types.NamespacedName{name("s2")}},
		{"a standalone claim beside a narrow one", narrow, []*resourceapi.ResourceClaim{claimReserved("new", "pod")}, true, []types.NamespacedName{name("s2")}},
	} {
		client, requests := claimsAPI(t, claimReserved("s1", "other"), claimReserved("s2", "other", "pod"))
		h := NewFinder(nil, client.ResourceV1(), tc.held).Holders(t.Context(), tc.call)
		if got := len(*requests) > 0; got != tc.reads {
			t.Errorf("%s: read the API server %v (%q), want %v", tc.name, got, *requests, tc.reads)
		}
		if !slices.Equal(h.BesideHeld, tc.beside) {
			t.Errorf("%s: held claims beside the call's %v, want %v", tc.name, h.BesideHeld, tc.beside)
		}
	}
}

// A spec names every GPU where each of its devices gives CUDA every index
// of the node, as a claim combined over every GPU gets; one naming its
// GPUs by UUID, fewer indices, or a MIG instance does not.
func TestNamesEveryGPU(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]map[string]string
		want bool
	}{
		{"every index", map[string]map[string]string{"d0": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "d1": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}}, true},
		{"one device narrower", map[string]map[string]string{"d0": {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "d1": {"CUDA_VISIBLE_DEVICES": "0,1"}}, false},
		{"UUIDs", map[string]map[string]string{"d0": {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c,GPU-d"}}, false},
		{"a MIG instance", map[string]map[string]string{"d0": {"CUDA_VISIBLE_DEVICES": "MIG-a"}}, false},
		{"no device", map[string]map[string]string{}, false},
	} {
		if got := NamesEveryGPU(tc.env, 4); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
