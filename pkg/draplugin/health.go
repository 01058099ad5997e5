package draplugin

import (
	"context"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
)

// healthCheckTimeout is how long the kubelet trusts a device's health
// report; the plugin re-sends well inside it (Options.HealthReportInterval).
const healthCheckTimeout = 30 * time.Second

// WatchHealthStatus reports every published device to the kubelet, then
// again whenever health changes and at least every HealthReportInterval,
// well inside the kubelet's timeout after which a device counts as
// Unknown.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	ticker := d.clock.NewTicker(d.opts.HealthReportInterval)
	defer ticker.Stop()
	changed, unsubscribe := d.publisher.health.view.Subscribe()
	defer unsubscribe()
	for {
		report := kubeletplugin.DeviceHealthReport{Devices: d.publisher.healthReports(d.clock.Now())}
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		case <-changed:
		}
	}
}

// healthReports is the health of every device published last.
func (p *publisher) healthReports(now time.Time) []kubeletplugin.DeviceHealth {
	bad := p.health.faults()
	var out []kubeletplugin.DeviceHealth
	for _, name := range p.devices() {
		h := kubeletplugin.DeviceHealth{
			PoolName: p.node.pool, DeviceName: name, Health: kubeletplugin.HealthStatusHealthy,
			LastUpdated: now, HealthCheckTimeout: healthCheckTimeout,
		}
		if ref, ok := p.node.index[name]; ok {
			if ok, msg := health.OfGPUs(ref.Group.GPUs, bad); !ok {
				h.Health = kubeletplugin.HealthStatusUnhealthy
				h.Message = msg
			}
		}
		out = append(out, h)
	}
	return out
}
