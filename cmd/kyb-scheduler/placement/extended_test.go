package placement

import (
	"fmt"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// classResolver serves extended resources by the DeviceClasses it maps
// them to.
type classResolver map[v1.ResourceName]*resourceapi.DeviceClass

func (r classResolver) GetDeviceClass(name v1.ResourceName) *resourceapi.DeviceClass { return r[name] }

// The requests of a pod's extended resources are those of the claim the
// DynamicResources plugin makes for them, in its order (by request name,
// container-<container>-request-<resource among the container's>): one
// per container that runs with the pod, an init container that runs
// first asking only for what the containers after it do not hold, the
// largest such rest once.
func TestExtendedRequestsAreTheSchedulersClaim(t *testing.T) {
	const seat1x, seat2x = v1.ResourceName("kyb.ai/gpu-1x-seat"), v1.ResourceName("kyb.ai/gpu-2x-seat")
	resolver := classResolver{}
	for _, r := range []v1.ResourceName{seat1x, seat2x} {
		name := string(r[len("kyb.ai/"):]) + ".kyb.ai"
		resolver[r] = &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"}}
	}
	container := func(asks ...any) v1.Container {
		l := v1.ResourceList{v1.ResourceCPU: resource.MustParse("1")}
		for i := 0; i < len(asks); i += 2 {
			l[asks[i].(v1.ResourceName)] = *resource.NewQuantity(int64(asks[i+1].(int)), resource.DecimalSI)
		}
		return v1.Container{Name: "app", Resources: v1.ResourceRequirements{Requests: l, Limits: l}}
	}
	sidecar := func(c v1.Container) v1.Container {
		c.RestartPolicy = ptr.To(v1.ContainerRestartPolicyAlways)
		return c
	}
	for _, tc := range []struct {
		name       string
		init, main []v1.Container
		want       []string
	}{
		{name: "one container, two seats", main: []v1.Container{container(seat1x, 2)},
			want: []string{"gpu-1x-seat.kyb.ai/2"}},
		{name: "two containers, a seat each", main: []v1.Container{container(seat1x, 1), container(seat1x, 1)},
			want: []string{"gpu-1x-seat.kyb.ai/1", "gpu-1x-seat.kyb.ai/1"}},
		{name: "two resources of one container, by name", main: []v1.Container{container(seat2x, 1, seat1x, 1)},
			want: []string{"gpu-1x-seat.kyb.ai/1", "gpu-2x-seat.kyb.ai/1"}},
		{name: "an init container asking more than the containers after it", init: []v1.Container{container(seat1x, 3)}, main: []v1.Container{container(seat1x, 1)},
			want: []string{"gpu-1x-seat.kyb.ai/2", "gpu-1x-seat.kyb.ai/1"}},
		{name: "an init container asking less", init: []v1.Container{container(seat1x, 1)}, main: []v1.Container{container(seat1x, 2)},
			want: []string{"gpu-1x-seat.kyb.ai/2"}},
		{name: "the largest rest of two init containers", init: []v1.Container{container(seat1x, 2), container(seat1x, 4)}, main: []v1.Container{container(seat1x, 1)},
			want: []string{"gpu-1x-seat.kyb.ai/3", "gpu-1x-seat.kyb.ai/1"}},
		{name: "a sidecar runs with the pod", init: []v1.Container{sidecar(container(seat1x, 1))}, main: []v1.Container{container(seat1x, 1)},
			want: []string{"gpu-1x-seat.kyb.ai/1", "gpu-1x-seat.kyb.ai/1"}},
		{name: "container 10 before container 2", main: []v1.Container{{}, {}, container(seat1x, 1), {}, {}, {}, {}, {}, {}, {}, container(seat2x, 1)},
			want: []string{"gpu-2x-seat.kyb.ai/1", "gpu-1x-seat.kyb.ai/1"}},
		{name: "a resource no class serves", main: []v1.Container{container(v1.ResourceName("example.com/fpga"), 1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &v1.Pod{Spec: v1.PodSpec{InitContainers: tc.init, Containers: tc.main}}
			var got []string
			for _, r := range extendedRequests(pod, resolver) {
				for _, a := range r.alternatives {
					got = append(got, fmt.Sprintf("%s/%d", a.class.Name, a.count))
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("requests %v, want %v", got, tc.want)
			}
		})
	}
}
