package draplugin_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
)

// dropAdvancedFields makes the fake API server behave like one with
// DRAConsumableCapacity and DRAPartitionableDevices off: it silently drops
// the fields those gates guard, as a real one does on write.
func dropAdvancedFields(action k8stesting.Action) (bool, runtime.Object, error) {
	// Creates and updates both carry the object written.
	var obj runtime.Object
	if a, ok := action.(interface{ GetObject() runtime.Object }); ok {
		obj = a.GetObject()
	}
	slice, ok := obj.(*resourceapi.ResourceSlice)
	if !ok {
		return false, nil, nil
	}
	slice.Spec.SharedCounters = nil
	for i := range slice.Spec.Devices {
		d := &slice.Spec.Devices[i]
		d.AllowMultipleAllocations = nil
		d.ConsumesCounters = nil
		for k, c := range d.Capacity {
			c.RequestPolicy = nil
			d.Capacity[k] = c
		}
	}
	return false, nil, nil
}

func publishedDevices(t *testing.T, e *env) []string {
	t.Helper()
	list, err := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			names = append(names, d.Name)
		}
	}
	slices.Sort(names)
	return names
}

func TestFallbackWhenTheAPIServerDropsFields(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed, withClient(func(c *fake.Clientset) {
		c.PrependReactor("create", "resourceslices", dropAdvancedFields)
		c.PrependReactor("update", "resourceslices", dropAdvancedFields)
	}))
	deadline := time.Now().Add(30 * time.Second)
	for e.driver.Layout() != draresources.LayoutPerSeat {
		if time.Now().After(deadline) {
			t.Fatal("the plugin did not fall back to the per-seat layout")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The per-seat layout: 2x keeps G01 and G23 (3 seats each), 1x gets GPUs 4-7 (4 seats each).
	var devices []string
	for time.Now().Before(deadline) {
		devices = publishedDevices(t, e)
		if len(devices) == 6+16 && !slices.Contains(devices, "g01-2x") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(devices) != 22 || !slices.Contains(devices, "g01-2x-seat-2") || !slices.Contains(devices, "g7-1x-seat-3") || slices.Contains(devices, "g0-1x-seat-0") {
		t.Fatalf("published after fallback: %v", devices)
	}
	var event string
	for time.Now().Before(deadline) && event == "" {
		events, err := e.client.EventsV1().Events("").List(e.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range events.Items {
			if ev.Reason == "SeatLayoutFallback" && ev.Regarding.Kind == "Node" && ev.Regarding.Name == nodeName {
				event = ev.Note
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(event, "DRAConsumableCapacity") || !strings.Contains(event, "2x gets G01 G23") {
		t.Errorf("fallback event on the Node: %q", event)
	}
	// And a pod still gets a seat: a claim on a per-seat device prepares.
	c := e.claimOn(nodeName+"-per-seat", class1x)
	env, _ := e.container(e.prepareOK(c)...)
	if env["KYB_GPU_GROUP"] != "G4" {
		t.Errorf("seat after fallback: %v", env)
	}
}
