package containerclaims

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// A spec on disk names GPUs by index where the claim was combined: where
// its configuration says UUIDs, or for requests that one container may
// hold together; not for an extended-resource claim's requests, each one
// container's, configured to name their GPUs by index.
func TestCombinedWidthByConfiguration(t *testing.T) {
	dev := func(name, request, visible string) checkpoint.Device {
		d := checkpoint.Device{Requests: []string{request}, CDIDevice: name, VisibleDevices: visible}
		d.GPUUUIDs = []string{"GPU-" + name}
		return d
	}
	for _, tc := range []struct {
		name     string
		devices  []checkpoint.Device
		combined bool
	}{
		{"one GPU by index, configured uuid", []checkpoint.Device{dev("d0", "gpu", "")}, true},
		{"one GPU by index, configured index", []checkpoint.Device{dev("d0", "gpu", "index")}, false},
		{"one request per container, configured index", []checkpoint.Device{dev("d0", "container-0-request-0", "index"), dev("d1", "container-1-request-0", "index")}, false},
		{"two requests, configured index", []checkpoint.Device{dev("d0", "a", "index"), dev("d1", "b", "index")}, true},
	} {
		env := map[string]map[string]string{}
		for _, d := range tc.devices {
			env[d.CDIDevice] = map[string]string{"CUDA_VISIBLE_DEVICES": "0"}
		}
		if n, combined := CombinedInSpec(&checkpoint.Claim{Devices: tc.devices}, env); combined != tc.combined || n != 1 {
			t.Errorf("%s: %d, %v; want 1, %v", tc.name, n, combined, tc.combined)
		}
	}
}

// A rebuilt checkpoint learns from the spec on disk that a claim was
// combined, and over how many GPUs: its containers keep getting the form
// every spec agreed on.
func TestCombinedWidth(t *testing.T) {
	dev := func(request string) checkpoint.Device {
		d := checkpoint.Device{Requests: []string{request}}
		d.GPUUUIDs = []string{"GPU-a"}
		return d
	}
	one := &checkpoint.Claim{Devices: []checkpoint.Device{dev("gpu")}}
	two := &checkpoint.Claim{Devices: []checkpoint.Device{dev("a"), dev("b")}}
	for _, tc := range []struct {
		claim    *checkpoint.Claim
		value    string
		n        int
		combined bool
	}{
		{one, "GPU-a", 0, false},
		{one, "0", 1, false},
		{one, "0,1", 2, true},
		{one, "0,1,2,3,4,5,6,7", 8, true},
		{one, "", 0, false},
		{two, "0", 1, true},
		{two, "GPU-a", 0, false},
	} {
		env := map[string]map[string]string{"dev": {"CUDA_VISIBLE_DEVICES": tc.value}}
		if n, combined := CombinedInSpec(tc.claim, env); n != tc.n || combined != tc.combined {
			t.Errorf("%d requests, CUDA_VISIBLE_DEVICES=%q: %d, %v; want %d, %v", len(tc.claim.Devices), tc.value, n, combined, tc.n, tc.combined)
		}
	}
}

func TestOwnedByPod(t *testing.T) {
	yes, no := true, false
	for _, tt := range []struct {
		refs []metav1.OwnerReference
		want bool
	}{
		{nil, false},
		{[]metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "p", Controller: &yes}}, true},
		{[]metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "p", Controller: &no}}, false},
		{[]metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "r", Controller: &yes}}, false},
	} {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{OwnerReferences: tt.refs}}
		if got := ownedByPod(c); got != tt.want {
			t.Errorf("owners %+v: owned by a pod %v, want %v", tt.refs, got, tt.want)
		}
	}
}

// The scheduler names an extended-resource claim's requests
// container-<i>-request-<j>; any other name is not one container's.
func TestExtendedRequestContainer(t *testing.T) {
	for _, tc := range []struct {
		name string
		i    int
		ok   bool
	}{
		{"container-0-request-0", 0, true},
		{"container-12-request-3", 12, true},
		{"container--request-0", 0, false},
		{"container-1-request-", 0, false},
		{"container-+1-request-0", 0, false},
		{"container-1-request-0-x", 0, false},
		{"gpu", 0, false},
	} {
		if i, ok := extendedRequestContainer(tc.name); i != tc.i || ok != tc.ok {
			t.Errorf("%q: %d, %v; want %d, %v", tc.name, i, ok, tc.i, tc.ok)
		}
	}
}
