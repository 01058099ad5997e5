package app

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/fragmentation"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatview"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// objects are n nodes of dgx-h100 slices and, on each, claims holding
// every one-GPU group's seat but the last.
func objects(tb testing.TB, n int) []runtime.Object {
	sn := simnodetest.New(tb, "dgx-h100", "")
	var objs []runtime.Object
	for i := range n {
		node := fmt.Sprintf("node-%03d", i)
		for j, s := range draresources.ResourceSlices(draresources.Resources(sn.Plan, sn.Inv, node, draresources.LayoutShared), node) {
			s.Name = fmt.Sprintf("%s-%d", node, j)
			objs = append(objs, s)
		}
		for g := range 7 {
			c := &resourceapi.ResourceClaim{}
			c.Namespace, c.Name = fmt.Sprintf("team-%d", g%2), fmt.Sprintf("%s-c%d", node, g)
			c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: "gpu.kyb.ai", Pool: node, Device: fmt.Sprintf("g%d-1x", g)},
			}}}
			c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: c.Name + "-pod"}}
			objs = append(objs, c)
		}
	}
	return objs
}

func TestSeatsFromTheAPI(t *testing.T) {
	client := fake.NewClientset(objects(t, 3)...)
	var warn bytes.Buffer
	v, err := Seats(context.Background(), client, "node-001", "team-0", &warn)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Nodes) != 1 || v.Nodes[0].Name != "node-001" || len(v.Nodes[0].Groups) != 14 {
		t.Fatalf("--node node-001: %+v", v.Nodes)
	}
	// 7 of 8 one-GPU groups full: every 2x and 4x group is blocked.
	want := []seatview.ProfileSeats{{Profile: "1x", Free: 1, Total: 8}, {Profile: "2x", Free: 0, Total: 4}, {Profile: "4x", Free: 0, Total: 2}}
	if fmt.Sprint(v.Free) != fmt.Sprint(want) || warn.Len() != 0 {
		t.Errorf("free %v, want %v; warnings %q", v.Free, want, warn.String())
	}
	// GPU 7 alone is free, in no free 4x group.
	if frag := (fragmentation.Measure{Free: 1, Largest: 4, Inside: 0, Fragmented: 1}); v.Nodes[0].Fragmentation != frag || v.Fragmentation != frag {
		t.Errorf("fragmentation of node-001 %+v and of the nodes shown %+v, want %+v", v.Nodes[0].Fragmentation, v.Fragmentation, frag)
	}

	// Not allowed to list claims cluster-wide: the namespace's alone, and
	// a warning that says so.
	client.PrependReactor("list", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() == "" {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "", fmt.Errorf("no"))
		}
		return false, nil, nil
	})
	v, err = Seats(context.Background(), client, "node-001", "team-0", &warn)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(warn.String(), "count namespace team-0 only") || v.Free[0].Free != 4 {
		t.Errorf("forbidden cluster-wide: warnings %q, free %v", warn.String(), v.Free)
	}
	if _, err := Seats(context.Background(), client, "", "", &warn); err == nil || !strings.Contains(err.Error(), "list ResourceClaims of every namespace") {
		t.Errorf("-A without the right: %v", err)
	}
}

func TestCommandLine(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "config")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(string) string { return "" }
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{}, 2, "the subcommand is seats"},
		{[]string{"nodes"}, 2, "the subcommand is seats"},
		{[]string{"seats", "-o", "yaml"}, 2, "must be one of table, wide, json"},
		{[]string{"seats", "--kubeconfig", kubeconfig}, 1, "kubeconfig: "},
		{[]string{"seats", "--kubeconfig", filepath.Join(dir, "none")}, 1, "kubeconfig: "},
	} {
		var out, errOut bytes.Buffer
		code := Run(context.Background(), tt.args, env, &out, &errOut)
		if code != tt.code || !strings.Contains(errOut.String(), tt.want) {
			t.Errorf("%v: exit %d %q, want %d with %q", tt.args, code, errOut.String(), tt.code, tt.want)
		}
	}
	var out bytes.Buffer
	if code := Run(context.Background(), []string{"seats", "-h"}, env, &out, &out); code != 0 || !strings.Contains(out.String(), "kubectl kyb seats -A") {
		t.Errorf("-h: %d %q", code, out.String())
	}
}

// BenchmarkSeats500Nodes is the command's work over 500 dgx-h100 nodes of
// slices and 3,500 claims: listing (from the fake API), building and
// printing the table. The goal is under a second.
func BenchmarkSeats500Nodes(b *testing.B) {
	client := fake.NewClientset(objects(b, 500)...)
	b.ResetTimer()
	for b.Loop() {
		v, err := Seats(context.Background(), client, "", "", nil)
		if err != nil {
			b.Fatal(err)
		}
		if len(v.Nodes) != 500 {
			b.Fatalf("%d nodes", len(v.Nodes))
		}
		if err := seatview.WriteTable(&bytes.Buffer{}, v, false); err != nil {
			b.Fatal(err)
		}
	}
}

// A sized group's memory and compute come from the slices' capacities and
// the claims' allocations as the API server holds them: what each
// consumed, and a capacity a result does not name at the group's default
// (an H200's 143771Mi over 8 seats: 17Gi, and 12 %).
func TestSizedSeatsFromTheAPI(t *testing.T) {
	sn := simnodetest.New(t, "dgx-h200", `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 8
  sharing: {strategy: mps, sized: true}
`)
	var objs []runtime.Object
	for j, s := range draresources.ResourceSlices(draresources.Resources(sn.Plan, sn.Inv, "node-a", draresources.LayoutShared), "node-a") {
		s.Name = fmt.Sprintf("node-a-%d", j)
		objs = append(objs, s)
	}
	claim := func(name, share string, consumed map[resourceapi.QualifiedName]resource.Quantity) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{}
		c.Namespace, c.Name = "team-a", name
		id := types.UID(share)
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: "gpu.kyb.ai", Pool: "node-a", Device: "g3-1x-sized", ShareID: &id, ConsumedCapacity: consumed},
		}}}
		c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name}}
		return c
	}
	objs = append(objs,
		claim("infer", "3a4f4b8e-5c1c-4d55-9bb6-0c1a8d1f0001", map[resourceapi.QualifiedName]resource.Quantity{
			"seats": resource.MustParse("1"), "memory": resource.MustParse("100Gi"), "compute": resource.MustParse("60")}),
		claim("plain", "3a4f4b8e-5c1c-4d55-9bb6-0c1a8d1f0002", nil))
	v, err := Seats(context.Background(), fake.NewClientset(objs...), "", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := seatview.WriteTable(&out, v, false); err != nil {
		t.Fatal(err)
	}
	// Columns are aligned by tabwriter: compare word by word.
	got := strings.Join(strings.Fields(out.String()), " ")
	for _, line := range []string{
		"g3-1x-sized G3 1x-sized 3 8 2 117Gi/143771Mi 72/100 % in use ?: team-a/infer (team-a/infer) 100Gi 60 %; ?: team-a/plain (team-a/plain) 17Gi 12 %",
		"g4-1x-sized G4 1x-sized 4 8 0 0/143771Mi 0/100 % free -",
		// 8 GPUs of 143771Mi (1150168Mi), 117Gi (119808Mi) and 72 %
		// held on one: the most free is an idle GPU's.
		"1x-sized 1030360Mi 143771Mi 1150168Mi 728 % 100 % 800 %",
	} {
		if !strings.Contains(got, line) {
			t.Errorf("table lacks\n%s\n%s", line, out.String())
		}
	}
}
