package draplugin_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// cudaSees is the GPUs CUDA enumerates in a container, by UUID: those
// whose device nodes it has, in PCI order, narrowed by
// CUDA_VISIBLE_DEVICES (indices into that order, or UUIDs) up to the
// first entry that names none of them.
func (e *env) cudaSees(env map[string]string, devs map[string]oci.LinuxDevice) []string {
	var present []inventory.GPU
	for _, g := range e.inv.GPUs {
		if _, ok := devs["/dev/nvidia"+strconv.Itoa(g.Minor)]; ok {
			present = append(present, g)
		}
	}
	slices.SortFunc(present, func(a, b inventory.GPU) int { return strings.Compare(a.PCIBusID, b.PCIBusID) })
	v, set := env["CUDA_VISIBLE_DEVICES"]
	if !set {
		v = strings.Join(slices.Collect(func(yield func(string) bool) {
			for i := range present {
				if !yield(strconv.Itoa(i)) {
					return
				}
			}
		}), ",")
	}
	var out []string
	for _, entry := range strings.Split(v, ",") {
		i := slices.IndexFunc(present, func(g inventory.GPU) bool { return g.UUID == entry })
		if n, err := strconv.Atoi(entry); err == nil && n >= 0 && n < len(present) {
			i = n
		}
		if i < 0 {
			break
		}
		out = append(out, present[i].UUID)
	}
	return out
}

// gpusOf is the UUIDs of the GPUs whose device nodes a container has.
func (e *env) gpusOf(devs map[string]oci.LinuxDevice) []string {
	var out []string
	for _, g := range e.inv.GPUs {
		if _, ok := devs["/dev/nvidia"+strconv.Itoa(g.Minor)]; ok {
			out = append(out, g.UUID)
		}
	}
	slices.Sort(out)
	return out
}

func (e *env) prepareAll(claims ...*resourceapi.ResourceClaim) [][]string {
	e.t.Helper()
	res := e.prepare(claims...)
	var out [][]string
	for _, c := range claims {
		r := res[string(c.UID)]
		if r == nil || r.Error != "" {
			e.t.Fatalf("prepare %s: %+v", c.Name, r)
		}
		var ids []string
		for _, d := range r.Devices {
			ids = append(ids, d.CdiDeviceIds...)
		}
		out = append(out, ids)
	}
	return out
}

// Two claims in one container: each claim's spec sets
// CUDA_VISIBLE_DEVICES and the runtime keeps the last. Claims that may
// share a container name GPUs by index over the node's, the same in every
// spec, so CUDA sees every GPU the container holds in either order.
func TestTwoClaimsInOneContainer(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	alone := e.claim(class1x)
	aloneIDs := e.prepareOK(alone)
	env, devs := e.container(aloneIDs...)
	if got, want := env["CUDA_VISIBLE_DEVICES"], strings.Join(e.gpusOf(devs), ","); got != want {
		t.Errorf("a claim prepared alone names its own GPU: %s, want %s", got, want)
	}

	one, two := e.claim(class1x), e.claim(class2x)
	ids := e.prepareAll(one, two)
	_, devsOne := e.container(ids[0]...)
	_, devsTwo := e.container(ids[1]...)
	union := slices.Concat(e.gpusOf(devsOne), e.gpusOf(devsTwo))
	slices.Sort(union)
	if len(union) != 3 {
		t.Fatalf("a 1x and a 2x claim hold %v", union)
	}
	for _, order := range [][]string{slices.Concat(ids[0], ids[1]), slices.Concat(ids[1], ids[0])} {
		env, devs := e.container(order...)
		sees := e.cudaSees(env, devs)
		slices.Sort(sees)
		if !slices.Equal(sees, union) {
			t.Errorf("injected as %v: CUDA_VISIBLE_DEVICES=%s, CUDA sees %v, want %v", order, env["CUDA_VISIBLE_DEVICES"], sees, union)
		}
	}
	// Each alone still sees only its own.
	for i, devs := range []map[string]oci.LinuxDevice{devsOne, devsTwo} {
		env, _ := e.container(ids[i]...)
		if sees := e.cudaSees(env, devs); len(sees) != len(e.gpusOf(devs)) {
			t.Errorf("claim %d alone: CUDA sees %v of %v", i, sees, e.gpusOf(devs))
		}
	}

	// A standalone claim (any pod may reference it) names GPUs by index
	// from its first prepare. A pod that references it beside a claim of
	// its own gets that one prepared alone (the kubelet prepared the
	// standalone one before): the plugin finds the pod in the standalone
	// claim's reservations and names GPUs by index there too. A pod that
	// does not reference it keeps UUIDs.
	reserveFor := func(c *resourceapi.ResourceClaim, pods ...string) *resourceapi.ResourceClaim {
		for _, p := range pods {
			c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID(p + "-uid")})
		}
		return e.update(c)
	}
	shared := reserveFor(e.standaloneClaim(class1x), "pod-a")
	sharedIDs := e.prepareOK(shared)
	if env, _ := e.container(sharedIDs...); env["CUDA_VISIBLE_DEVICES"] != "0,1,2,3,4,5,6,7" {
		t.Errorf("a standalone claim: CUDA_VISIBLE_DEVICES=%s", env["CUDA_VISIBLE_DEVICES"])
	}
	unrelated := reserveFor(e.claim(class1x), "pod-b")
	env, devs = e.container(e.prepareOK(unrelated)...)
	if got, want := env["CUDA_VISIBLE_DEVICES"], strings.Join(e.gpusOf(devs), ","); got != want {
		t.Errorf("a pod that does not reference the standalone claim: CUDA_VISIBLE_DEVICES=%s, want %s", got, want)
	}
	shared, err := e.client.ResourceV1().ResourceClaims(shared.Namespace).Get(e.ctx, shared.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reserveFor(shared, "pod-c")
	later := reserveFor(e.claim(class2x), "pod-c")
	laterIDs := e.prepareOK(later)
	for _, order := range [][]string{slices.Concat(sharedIDs, laterIDs), slices.Concat(laterIDs, sharedIDs)} {
		env, devs := e.container(order...)
		if sees := e.cudaSees(env, devs); env["CUDA_VISIBLE_DEVICES"] != "0,1,2,3,4,5,6,7" || len(sees) != len(e.gpusOf(devs)) {
			t.Errorf("a standalone claim and the pod's own, injected as %v: CUDA_VISIBLE_DEVICES=%s, CUDA sees %v of %v", order, env["CUDA_VISIBLE_DEVICES"], sees, e.gpusOf(devs))
		}
	}
	// The spec lost (a reboot empties a tmpfs CDI directory) is written
	// again from the checkpoint, combined.
	e.restart()
	lost, _ := filepath.Glob(filepath.Join(e.dirs.cdi, "*"+string(later.UID)+"*"))
	if len(lost) != 1 {
		t.Fatalf("spec files of the later claim: %v", lost)
	}
	if err := os.Remove(lost[0]); err != nil {
		t.Fatal(err)
	}
	e.prepareOK(later)
	env, devs = e.container(laterIDs...)
	if sees := e.cudaSees(env, devs); env["CUDA_VISIBLE_DEVICES"] != "0,1,2,3,4,5,6,7" || len(sees) != len(e.gpusOf(devs)) {
		t.Errorf("after a restart: CUDA_VISIBLE_DEVICES=%s, CUDA sees %v", env["CUDA_VISIBLE_DEVICES"], sees)
	}
}
