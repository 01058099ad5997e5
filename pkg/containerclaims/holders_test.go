package containerclaims

import (
	"context"
	"fmt"
	"slices"
	"strings"
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

// claimsAPI is an API server of ResourceClaims that pages a LIST with a
// limit as the real one does (name order, a continue token), which the
// fake one does not, and records the requests it answers ("verb name")
// and the claims their answers held.
func claimsAPI(t *testing.T, objs ...runtime.Object) (client *fake.Clientset, requests *[]string, read *int) {
	t.Helper()
	client = fake.NewClientset(objs...)
	requests, read = new([]string), new(int)
	gvr := resourceapi.SchemeGroupVersion.WithResource("resourceclaims")
	client.PrependReactor("*", "resourceclaims", func(action k8stesting.Action) (bool, runtime.Object, error) {
		switch a := action.(type) {
		case k8stesting.GetActionImpl:
			*requests = append(*requests, "get "+a.Name)
			obj, err := client.Tracker().Get(gvr, a.Namespace, a.Name)
			if err == nil {
				*read++
			}
			return true, obj, err
		case k8stesting.ListActionImpl:
			*requests = append(*requests, "list")
			obj, err := client.Tracker().List(gvr, resourceapi.SchemeGroupVersion.WithKind("ResourceClaim"), a.Namespace)
			if err != nil {
				return true, nil, err
			}
			list := obj.(*resourceapi.ResourceClaimList)
			slices.SortFunc(list.Items, func(a, b resourceapi.ResourceClaim) int { return strings.Compare(a.Name, b.Name) })
			if limit := int(a.ListOptions.Limit); limit > 0 && len(list.Items) > limit {
				list.Items = list.Items[:limit]
				list.Continue = list.Items[limit-1].Name
			}
			*read += len(list.Items)
			return true, list, nil
		}
		return false, nil, nil
	})
	return client, requests, read
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
		client, requests, _ := claimsAPI(t, claimReserved("s1", "other"), claimReserved("s2", "other", "pod"))
		h := NewFinder(nil, client.ResourceV1(), tc.held).Holders(t.Context(), tc.call)
		if got := len(*requests) > 0; got != tc.reads {
			t.Errorf("%s: read the API server %v (%q), want %v", tc.name, got, *requests, tc.reads)
		}
		if !slices.Equal(h.BesideHeld, tc.beside) {
			t.Errorf("%s: held claims beside the call's %v, want %v", tc.name, h.BesideHeld, tc.beside)
		}
	}
}

// A namespace larger than one LIST page: the reservations of the
// standalone claims the node holds are read from the first page and, for
// a claim that sorts past it, with a GET; a claim the page would have
// held is gone, and is not asked for.
func TestStandaloneReservationsReadOnePage(t *testing.T) {
	objs := []runtime.Object{claimReserved("a-held", "other-pod"), claimReserved("z-held", "pod")}
	for i := range 2 * listPage {
		objs = append(objs, claimReserved(fmt.Sprintf("m-%03d", i)))
	}
	client, requests, read := claimsAPI(t, objs...)
	name := func(n string) types.NamespacedName { return types.NamespacedName{Namespace: "ns", Name: n} }
	held := heldClaims{{NamespacedName: name("a-held")}, {NamespacedName: name("m-050a")}, {NamespacedName: name("z-held")}}
	own := podsClaim("own", "pod")
	h := NewFinder(nil, client.ResourceV1(), held).Holders(t.Context(), []*resourceapi.ResourceClaim{own})

	if !h.Beside[own.UID] || !slices.Equal(h.BesideHeld, []types.NamespacedName{name("z-held")}) {
		t.Errorf("beside %v, held beside %v; want the claim beside ns/z-held, which its pod also reserves", h.Beside, h.BesideHeld)
	}
	if want := []string{"list", "get z-held"}; !slices.Equal(*requests, want) {
		t.Errorf("requests %q, want %q: one page, and a GET for the held claim past it only", *requests, want)
	}
	if *read > listPage+1 {
		t.Errorf("read %d claims of a namespace of %d, want at most %d", *read, len(objs), listPage+1)
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
