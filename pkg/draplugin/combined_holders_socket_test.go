package draplugin_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/time/rate"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources/podresourcestest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// withPodResources serves a kubelet's PodResources API over a real unix
// socket and points the plugin at it.
func withPodResources(t testing.TB, srv **podresourcestest.Server) envOption {
	*srv = podresourcestest.Start(t, filepath.Join(sockettest.Dir(t), "kubelet.sock"))
	client, err := podresources.NewClient((*srv).Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return withOptions(func(o *draplugin.Options) { o.PodResources = client })
}

func claimName(c *resourceapi.ResourceClaim) types.NamespacedName {
	return types.NamespacedName{Namespace: c.Namespace, Name: c.Name}
}

// ctr is a container referencing claims, as the kubelet lists it.
func ctr(name string, claims ...*resourceapi.ResourceClaim) podresources.ContainerClaims {
	c := podresources.ContainerClaims{Name: name}
	for _, x := range claims {
		c.Claims = append(c.Claims, claimName(x))
	}
	return c
}

// reserveFor adds pods to a claim's reservations in the API server.
func (e *env) reserveFor(c *resourceapi.ResourceClaim, pods ...string) *resourceapi.ResourceClaim {
	e.t.Helper()
	c, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Get(e.ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID(p + "-uid")})
	}
	return e.update(c)
}

// ownGPUs is the claim's GPUs by UUID, in PCI order, as its own spec
// names them when no container holds it beside another claim.
func (e *env) ownGPUs(ids []string) string {
	_, devs := e.container(ids...)
	return strings.Join(e.gpusOf(devs), ",")
}

// The kubelet says which containers hold which claims: a claim that no
// container holds beside another of the driver's names its own GPUs by
// UUID, whether it is standalone, shared by pods or held with admin
// access; the specs of claims that one container holds together name as
// many GPUs by index as that container sees; and a claim prepared alone
// before gets its spec written again when a later pod's container holds it
// beside a new one.
func TestSpecsFollowTheContainersHoldingTheClaims(t *testing.T) {
	var kubelet *podresourcestest.Server
	e := newEnv(t, "nvlink-2x4", seed, withPodResources(t, &kubelet))
	cuda := func(ids []string) string {
		env, _ := e.container(ids...)
		return env["CUDA_VISIBLE_DEVICES"]
	}

	// A fresh standalone one-seat claim, one pod, one container: the
	// first claim on the node.
	first := e.reserveFor(e.standaloneClaim(class1x), "pod-a")
	kubelet.SetPod(first.Namespace, "pod-a", ctr("app", first), ctr("sidecar"))
	firstIDs := e.prepareOK(first)
	if got, want := cuda(firstIDs), e.ownGPUs(firstIDs); got != want {
		t.Errorf("a lone standalone claim: CUDA_VISIBLE_DEVICES=%s, want its own GPU %s", got, want)
	}

	// Another one, now that the node holds a claim: the kubelet is asked.
	gets := kubelet.Gets()
	lone := e.reserveFor(e.standaloneClaim(class1x), "pod-b")
	kubelet.SetPod(lone.Namespace, "pod-b", ctr("app", lone))
	loneIDs := e.prepareOK(lone)
	if got, want := cuda(loneIDs), e.ownGPUs(loneIDs); got != want {
		t.Errorf("a standalone claim alone in its container: CUDA_VISIBLE_DEVICES=%s, want its own GPU %s", got, want)
	}
	if kubelet.Gets() != gets+1 {
		t.Errorf("the kubelet was asked %d times for one pod", kubelet.Gets()-gets)
	}

	// A claim two pods reserve, each alone in its container.
	both := e.reserveFor(e.standaloneClaim(class2x), "pod-c", "pod-d")
	kubelet.SetPod(both.Namespace, "pod-c", ctr("app", both))
	kubelet.SetPod(both.Namespace, "pod-d", ctr("worker", both))
	bothIDs := e.prepareOK(both)
	if got, want := cuda(bothIDs), e.ownGPUs(bothIDs); got != want || strings.Count(got, ",") != 1 {
		t.Errorf("a claim shared by two pods: CUDA_VISIBLE_DEVICES=%s, want its own two GPUs %s", got, want)
	}

	// Admin access: no seat, the group's GPUs.
	admin := e.standaloneClaim(class1x)
	admin.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
	admin = e.update(admin)
	admin = e.reserveFor(admin, "monitor")
	kubelet.SetPod(admin.Namespace, "monitor", ctr("dcgm", admin))
	adminIDs := e.prepareOK(admin)
	if env, _ := e.container(adminIDs...); env["KYB_ADMIN_ACCESS"] != "true" || env["CUDA_VISIBLE_DEVICES"] != e.ownGPUs(adminIDs) {
		t.Errorf("an admin-access claim: %v, want its own GPU %s", env, e.ownGPUs(adminIDs))
	}

	// One container with a 1x and a 2x claim of its pod: three GPUs, and
	// no more entries than that.
	one, two := e.reserveFor(e.claim(class1x), "pod-e"), e.reserveFor(e.claim(class2x), "pod-e")
	kubelet.SetPod(one.Namespace, "pod-e", ctr("app", one, two))
	ids := e.prepareAll(one, two)
	union := e.unionOf(ids...)
	if len(union) != 3 {
		t.Fatalf("a 1x and a 2x claim hold %v", union)
	}
	for _, order := range [][]string{slices.Concat(ids[0], ids[1]), slices.Concat(ids[1], ids[0])} {
		env, devs := e.container(order...)
		sees := e.cudaSees(env, devs)
		slices.Sort(sees)
		if env["CUDA_VISIBLE_DEVICES"] != "0,1,2" || !slices.Equal(sees, union) {
			t.Errorf("two claims in one container, injected as %v: CUDA_VISIBLE_DEVICES=%s, CUDA sees %v, want 0,1,2 and %v", order, env["CUDA_VISIBLE_DEVICES"], sees, union)
		}
	}

	// A later pod whose container holds the lone standalone claim beside
	// a 2x claim of its own: the kubelet prepares only the new one, and
	// the standalone claim's spec is written again.
	later := e.reserveFor(e.claim(class2x), "pod-f")
	lone = e.reserveFor(lone, "pod-f")
	kubelet.SetPod(later.Namespace, "pod-f", ctr("app", lone, later))
	laterIDs := e.prepareOK(later)
	union = e.unionOf(loneIDs, laterIDs)
	for _, order := range [][]string{slices.Concat(loneIDs, laterIDs), slices.Concat(laterIDs, loneIDs)} {
		env, devs := e.container(order...)
		sees := e.cudaSees(env, devs)
		slices.Sort(sees)
		if env["CUDA_VISIBLE_DEVICES"] != "0,1,2" || !slices.Equal(sees, union) {
			t.Errorf("a standalone claim and a later pod's own, injected as %v: CUDA_VISIBLE_DEVICES=%s, CUDA sees %v, want 0,1,2 and %v", order, env["CUDA_VISIBLE_DEVICES"], sees, union)
		}
	}
	// pod-b's container, should it restart, sees its one GPU still.
	if env, devs := e.container(loneIDs...); len(e.cudaSees(env, devs)) != 1 {
		t.Errorf("the standalone claim alone: CUDA_VISIBLE_DEVICES=%s", env["CUDA_VISIBLE_DEVICES"])
	}
	// The others are left as they were.
	if got, want := cuda(firstIDs), e.ownGPUs(firstIDs); got != want {
		t.Errorf("an unrelated claim: CUDA_VISIBLE_DEVICES=%s, want %s", got, want)
	}
}

// A later pod's container holds two standalone claims that the node
// prepared before for other pods, and its other container a new claim:
// the kubelet calls for the new claim alone, and lists the first container
// with the two held claims. Those are combined and their specs written
// again before the call answers, so that the container sees both GPUs
// whichever spec the runtime applies last.
func TestHeldClaimsTogetherInAnotherContainerAreCombined(t *testing.T) {
	var kubelet *podresourcestest.Server
	e := newEnv(t, "nvlink-2x4", seed, withPodResources(t, &kubelet))
	s := e.reserveFor(e.standaloneOnGPU(0), "pod-a")
	kubelet.SetPod(s.Namespace, "pod-a", ctr("app", s))
	idsS := e.prepareOK(s)
	tt := e.reserveFor(e.standaloneOnGPU(5), "pod-b")
	kubelet.SetPod(tt.Namespace, "pod-b", ctr("app", tt))
	idsT := e.prepareOK(tt)

	c := e.reserveFor(e.claim(class1x), "pod-p")
	s = e.reserveFor(s, "pod-p")
	tt = e.reserveFor(tt, "pod-p")
	kubelet.SetPod(c.Namespace, "pod-p", ctr("both", s, tt), ctr("other", c))
	idsC := e.prepareOK(c)

	union := e.unionOf(idsS, idsT)
	if len(union) != 2 {
		t.Fatalf("the held claims hold %v, want 2 GPUs", union)
	}
	for _, order := range [][]string{slices.Concat(idsS, idsT), slices.Concat(idsT, idsS)} {
		env, devs := e.container(order...)
		sees := e.cudaSees(env, devs)
		slices.Sort(sees)
		if env["CUDA_VISIBLE_DEVICES"] != "0,1" || !slices.Equal(sees, union) {
			t.Errorf("container holding both held claims, injected as %v: CUDA_VISIBLE_DEVICES=%s, CUDA sees %v, want 0,1 and %v", order, env["CUDA_VISIBLE_DEVICES"], sees, union)
		}
	}
	if got, want := cuda(e, idsC), e.ownGPUs(idsC); got != want {
		t.Errorf("the new claim, alone in its container: CUDA_VISIBLE_DEVICES=%s, want its own GPU %s", got, want)
	}
}

// A container holds two claims of its pod; one is refused for a while
// (its group shares a GPU with a claim another pod still holds), so the
// kubelet calls again with both until it succeeds, and no container
// starts before. The other claim's spec then names the GPUs the container
// holds, not every GPU of the node: the failure gave its partner no width
// to keep.
func TestTransientFailureOfAPartnerLeavesNoWidth(t *testing.T) {
	var kubelet *podresourcestest.Server
	e := newEnv(t, "nvlink-2x4", seed, withPodResources(t, &kubelet))
	x := e.reserveFor(e.claim(class1x), "pod-x") // g0-1x
	kubelet.SetPod(x.Namespace, "pod-x", ctr("app", x))
	e.prepareOK(x)

	a := e.reserveFor(e.claimOnGPU("default", 4), "pod-p")
	b := e.claimOn(nodeName+"-per-seat", class2x)
	b.Status.Allocation.Devices.Results[0].Device = "g01-2x"
	b = e.update(b)
	b = e.reserveFor(b, "pod-p")
	kubelet.SetPod(a.Namespace, "pod-p", ctr("app", a, b))

	if r := e.prepare(a, b)[string(b.UID)]; r == nil || r.Error == "" {
		t.Fatalf("the test wants the 2x claim refused while claim %s holds GPU 0: %+v", x.Name, r)
	}
	if r := e.unprepare(x)[string(x.UID)]; r == nil || r.Error != "" {
		t.Fatalf("unprepare %s: %+v", x.Name, r)
	}
	ids := e.prepareAll(a, b)
	union := e.unionOf(ids...)
	if len(union) != 3 {
		t.Fatalf("the two claims hold %v, want 3 GPUs", union)
	}
	for _, order := range [][]string{slices.Concat(ids[0], ids[1]), slices.Concat(ids[1], ids[0])} {
		env, devs := e.container(order...)
		sees := e.cudaSees(env, devs)
		slices.Sort(sees)
		if env["CUDA_VISIBLE_DEVICES"] != "0,1,2" || !slices.Equal(sees, union) {
			t.Errorf("both claims in one container, injected as %v: CUDA_VISIBLE_DEVICES=%s, CUDA sees %v, want 0,1,2 and %v", order, env["CUDA_VISIBLE_DEVICES"], sees, union)
		}
	}
}

// The kubelet refuses PodResources calls over its rate limit, for every
// client of the node together. A prepare refused so waits for the next
// token instead of taking its claims for ones that may share a container:
// two claims of a pod, each alone in its container, keep their UUIDs.
func TestPrepareWaitsOutThePodResourcesRateLimit(t *testing.T) {
	var kubelet *podresourcestest.Server
	e := newEnv(t, "nvlink-2x4", seed, withPodResources(t, &kubelet))
	a, b := e.reserveFor(e.claim(class1x), "pod-p"), e.reserveFor(e.claim(class1x), "pod-p")
	kubelet.SetPod(a.Namespace, "pod-p", ctr("a", a), ctr("b", b))
	// The bucket is empty when the prepare asks: other clients took it.
	kubelet.Limit(rate.NewLimiter(rate.Limit(20), 1))
	client, err := podresources.NewClient(kubelet.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.PodClaims(e.ctx, a.Namespace, "pod-p"); err != nil {
		t.Fatal(err)
	}
	gets := kubelet.Gets()
	ids := e.prepareAll(a, b)
	for i, c := range []*resourceapi.ResourceClaim{a, b} {
		if got, want := cuda(e, ids[i]), e.ownGPUs(ids[i]); got != want {
			t.Errorf("claim %s alone in its container: CUDA_VISIBLE_DEVICES=%s, want its own GPU %s", c.Name, got, want)
		}
	}
	if kubelet.Gets()-gets < 2 {
		t.Errorf("the kubelet was asked %d times; the test wants a refused call and one answered", kubelet.Gets()-gets)
	}
}

// cuda is the CUDA_VISIBLE_DEVICES a container of the CDI devices gets.
func cuda(e *env, ids []string) string {
	env, _ := e.container(ids...)
	return env["CUDA_VISIBLE_DEVICES"]
}

// claimOnGPU is a pod's one-request claim in namespace, on GPU gpu.
func (e *env) claimOnGPU(namespace string, gpu int) *resourceapi.ResourceClaim {
	e.t.Helper()
	e.claimN++
	c := schedulertest.Claim(fmt.Sprintf("claim-%d", e.claimN), class1x, 1,
		schedulertest.WithSelector(fmt.Sprintf(`device.attributes["gpu.kyb.ai"].gpuIndices == "%d"`, gpu)))
	c.Namespace = namespace
	c.UID = types.UID(fmt.Sprintf("0000000%d-1111-2222-3333-444444444444", e.claimN))
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "pod", UID: "pod-uid", Controller: new(true)}}
	alloc, err := e.cluster.Allocate(e.ctx, c, nodeName)
	if err != nil || alloc == nil {
		e.t.Fatalf("allocate on GPU %d: %v %v", gpu, alloc, err)
	}
	for i := range alloc.Devices.Results {
		alloc.Devices.Results[i].Pool = nodeName
	}
	c.Status.Allocation = alloc
	return e.store(c)
}

// standaloneOnGPU is a standalone one-seat claim on GPU gpu.
func (e *env) standaloneOnGPU(gpu int) *resourceapi.ResourceClaim {
	e.t.Helper()
	c := e.claimOnGPU("default", gpu)
	c.OwnerReferences = nil
	c, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Update(e.ctx, c, metav1.UpdateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// unionOf is the UUIDs of the GPUs whose device nodes the CDI devices give,
// sorted.
func (e *env) unionOf(ids ...[]string) []string {
	var out []string
	for _, x := range ids {
		_, devs := e.container(x...)
		out = append(out, e.gpusOf(devs)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Where the kubelet cannot say (it does not know the pod yet), a claim
// that may share a container names every GPU of the node by index, as
// before the kubelet was asked.
func TestSpecsWhereTheKubeletCannotSay(t *testing.T) {
	var kubelet *podresourcestest.Server
	e := newEnv(t, "nvlink-2x4", seed, withPodResources(t, &kubelet))
	held := e.reserveFor(e.claim(class1x), "pod-a")
	kubelet.SetPod(held.Namespace, "pod-a", ctr("app", held))
	e.prepareOK(held)
	shared := e.reserveFor(e.standaloneClaim(class1x), "pod-unknown")
	env, _ := e.container(e.prepareOK(shared)...)
	if got, want := env["CUDA_VISIBLE_DEVICES"], "0,1,2,3,4,5,6,7"; got != want {
		t.Errorf("a standalone claim of a pod the kubelet does not know: CUDA_VISIBLE_DEVICES=%s, want %s", got, want)
	}
	// A pod the kubelet knows, none of whose containers it lists with the
	// claim (it has not cached the pod's claims yet).
	early := e.reserveFor(e.standaloneClaim(class1x), "pod-early")
	kubelet.SetPod(early.Namespace, "pod-early", ctr("app"))
	env, _ = e.container(e.prepareOK(early)...)
	if got, want := env["CUDA_VISIBLE_DEVICES"], "0,1,2,3,4,5,6,7"; got != want {
		t.Errorf("a pod the kubelet lists without the claim: CUDA_VISIBLE_DEVICES=%s, want %s", got, want)
	}
}

// Where the kubelet cannot say, a standalone claim the node holds is left
// unread only where its spec on the node names every GPU already, not
// where its record says so: the plugin may have stopped after recording
// it combined and before writing its spec again. A pod that references it
// beside a standalone claim of its own then gets it written again.
func TestAHeldClaimWhoseSpecLagsItsRecordIsWrittenAgain(t *testing.T) {
	var kubelet *podresourcestest.Server
	e := newEnv(t, "nvlink-2x4", seed, withPodResources(t, &kubelet))
	held := e.reserveFor(e.standaloneClaim(class1x), "pod-a")
	kubelet.SetPod(held.Namespace, "pod-a", ctr("app", held))
	heldIDs := e.prepareOK(held)
	spec := filepath.Join(e.dirs.cdi, cdi.SpecName(held.UID)+".json")
	narrow, err := os.ReadFile(spec)
	if err != nil {
		t.Fatal(err)
	}
	// pod-b, which the kubelet does not know yet, references it beside a
	// standalone claim of its own: it is combined over every GPU.
	e.reserveFor(held, "pod-b")
	e.prepareOK(e.reserveFor(e.standaloneClaim(class1x), "pod-b"))
	every := "0,1,2,3,4,5,6,7"
	if env, _ := e.container(heldIDs...); env["CUDA_VISIBLE_DEVICES"] != every {
		t.Fatalf("the held claim beside pod-b's: CUDA_VISIBLE_DEVICES=%s, want %s", env["CUDA_VISIBLE_DEVICES"], every)
	}
	// Its spec as it was before, its record combined.
	e.stop()
	if err := os.WriteFile(spec, narrow, 0o644); err != nil {
		t.Fatal(err)
	}
	e.start()
	e.reserveFor(held, "pod-c")
	e.prepareOK(e.reserveFor(e.standaloneClaim(class1x), "pod-c"))
	if env, _ := e.container(heldIDs...); env["CUDA_VISIBLE_DEVICES"] != every {
		t.Errorf("the held claim beside pod-c's, its spec behind its record: CUDA_VISIBLE_DEVICES=%s, want %s", env["CUDA_VISIBLE_DEVICES"], every)
	}
}
