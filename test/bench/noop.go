package bench

import (
	"context"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// NoopDriver is the name of the no-op driver the prepare latency is
// compared with.
const NoopDriver = "noop.bench.kyb.ai"

// noop is a DRA plugin that prepares nothing: it answers every claim with
// its allocated devices and no CDI IDs. Registered through the same
// kubeletplugin helper as ours, it pays exactly what every driver pays (the
// kubelet's gRPC call, the helper's claim GET and its serialisation), so
// the difference to it is our own cost.
type noop struct{}

func (noop) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		var r kubeletplugin.PrepareResult
		for _, d := range c.Status.Allocation.Devices.Results {
			if d.Driver != NoopDriver {
				continue
			}
			r.Devices = append(r.Devices, kubeletplugin.Device{Requests: []string{d.Request}, PoolName: d.Pool, DeviceName: d.Device})
		}
		out[c.UID] = r
	}
	return out, nil
}

func (noop) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

// WatchHealthStatus is never called: the helper's health service is off.
func (noop) WatchHealthStatus(ctx context.Context, _ chan<- kubeletplugin.DeviceHealthReport) error {
	<-ctx.Done()
	return nil
}

func (noop) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

// startNoop registers the no-op driver with a node's kubelet.
func startNoop(ctx context.Context, client kubernetes.Interface, node, registryDir, dataDir string) (*kubeletplugin.Helper, error) {
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return nil, fmt.Errorf("start the no-op driver: %w", err)
	}
	h, err := kubeletplugin.Start(ctx, noop{},
		kubeletplugin.DriverName(NoopDriver),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(node),
		kubeletplugin.RegistrarDirectoryPath(registryDir),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		return nil, fmt.Errorf("start the no-op driver: %w", err)
	}
	return h, nil
}
