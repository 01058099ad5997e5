package podresources_test

import (
	"context"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources/podresourcestest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// List reads each container's claims with the drivers whose devices the
// kubelet prepared for them (a claim named without a namespace is of the
// pod's), beside its device-plugin devices; the holders of one surface
// are named from them.
func TestListNamesTheHoldersOfEachSurfaceOverRealSocket(t *testing.T) {
	srv := podresourcestest.Start(t, filepath.Join(sockettest.Dir(t), "kubelet.sock"))
	srv.SetPodResources(&podresourcesapi.PodResources{Namespace: "team-a", Name: "trainer", Containers: []*podresourcesapi.ContainerResources{{
		Name: "app", DynamicResources: []*podresourcesapi.DynamicResource{
			{ClaimName: "gpus", ClaimResources: []*podresourcesapi.ClaimResource{
				{DriverName: "gpu.kyb.ai", DeviceName: "g01-2x"}, {DriverName: "gpu.kyb.ai", DeviceName: "g23-2x"}, {DriverName: "rdma.example.com", DeviceName: "mlx5-0"}}},
			{ClaimName: "nic", ClaimNamespace: "team-a", ClaimResources: []*podresourcesapi.ClaimResource{{DriverName: "rdma.example.com", DeviceName: "mlx5-1"}}},
		},
	}}})
	srv.SetPodResources(&podresourcesapi.PodResources{Namespace: "team-b", Name: "legacy", Containers: []*podresourcesapi.ContainerResources{
		{Name: "app", Devices: []*podresourcesapi.ContainerDevices{
			{ResourceName: "kyb.ai/mig-1g.10gb", DeviceIds: []string{"g0-mig-1g-10gb-6"}}, {ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-0"}}}},
		{Name: "sidecar"},
	}})
	client, err := podresources.NewClient(srv.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	l, err := client.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	wantClaims := []podresources.ClaimAssignment{
		{Pod: "team-a/trainer", Container: "app", Claim: types.NamespacedName{Namespace: "team-a", Name: "gpus"}, Drivers: []string{"gpu.kyb.ai", "rdma.example.com"}},
		{Pod: "team-a/trainer", Container: "app", Claim: types.NamespacedName{Namespace: "team-a", Name: "nic"}, Drivers: []string{"rdma.example.com"}},
	}
	if !reflect.DeepEqual(l.Claims, wantClaims) {
		t.Errorf("claims %+v, want %+v", l.Claims, wantClaims)
	}
	if got, want := l.DriverHolders("gpu.kyb.ai"), []string{"team-a/trainer container app: claim team-a/gpus"}; !slices.Equal(got, want) {
		t.Errorf("holders of gpu.kyb.ai %v, want %v", got, want)
	}
	kyb := func(r string) bool { return strings.HasPrefix(r, "kyb.ai/") }
	if got, want := l.ResourceHolders(kyb), []string{"team-b/legacy container app: kyb.ai/mig-1g.10gb g0-mig-1g-10gb-6"}; !slices.Equal(got, want) {
		t.Errorf("holders of kyb.ai/* %v, want %v", got, want)
	}
	if got := l.AssignedIDs(kyb); !reflect.DeepEqual(got, map[string]bool{"g0-mig-1g-10gb-6": true}) {
		t.Errorf("assigned IDs of kyb.ai/* %v", got)
	}
	if got := l.DriverHolders("gpu.nvidia.com"); len(got) != 0 {
		t.Errorf("holders of a driver nobody uses: %v", got)
	}
}
