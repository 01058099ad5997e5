package draplugin_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"

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
// CUDA_VISIBLE_DEVICES and the runtime keeps the last. Claims prepared
// together for a pod name GPUs by index over the node's, the same in
// every spec, so CUDA sees every GPU the container holds in either order.
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

	// A claim prepared alone before (shared with another pod) and now
	// combined in a second pod: its spec is written again, and stays so
	// across a restart.
	other := e.claim(class1x)
	ids = e.prepareAll(alone, other)
	combined := slices.Concat(ids[0], ids[1])
	env, devs = e.container(combined...)
	if env["CUDA_VISIBLE_DEVICES"] != "0,1,2,3,4,5,6,7" {
		t.Errorf("a shared claim combined later keeps CUDA_VISIBLE_DEVICES=%s", env["CUDA_VISIBLE_DEVICES"])
	}
	if sees := e.cudaSees(env, devs); len(sees) != len(e.gpusOf(devs)) {
		t.Errorf("a shared claim combined later: CUDA_VISIBLE_DEVICES=%s, CUDA sees %v", env["CUDA_VISIBLE_DEVICES"], sees)
	}
	e.restart()
	e.prepareOK(alone)
	env, devs = e.container(ids[0]...)
	if sees := e.cudaSees(env, devs); env["CUDA_VISIBLE_DEVICES"] != "0,1,2,3,4,5,6,7" || len(sees) != len(e.gpusOf(devs)) {
		t.Errorf("after a restart: CUDA_VISIBLE_DEVICES=%s, CUDA sees %v", env["CUDA_VISIBLE_DEVICES"], sees)
	}
}
