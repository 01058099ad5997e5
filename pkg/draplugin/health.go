package draplugin

import (
	"context"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// WatchHealthStatus reports every published device to the kubelet, then
// again whenever health changes and at least every reportInterval, well
// inside the kubelet's 30 s timeout after which a device counts as Unknown.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	ticker := d.clock.NewTicker(d.opts.HealthReportInterval)
	defer ticker.Stop()
	changed, unsubscribe := d.health.subscribe()
	defer unsubscribe()
	for {
		report := kubeletplugin.DeviceHealthReport{Devices: d.healthOfPublished()}
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

// healthOfPublished is the health of every device currently published.
func (d *Driver) healthOfPublished() []kubeletplugin.DeviceHealth {
	now := d.clock.Now()
	bad := d.health.faults()
	var out []kubeletplugin.DeviceHealth
	for _, name := range d.publishedDevices() {
		h := kubeletplugin.DeviceHealth{
			PoolName: d.pool, DeviceName: name, Health: kubeletplugin.HealthStatusHealthy,
			LastUpdated: now, HealthCheckTimeout: 30 * time.Second,
		}
		if ref, ok := d.index[name]; ok {
			if ok, msg := groupHealthOf(ref.Group, bad); !ok {
				h.Health = kubeletplugin.HealthStatusUnhealthy
				h.Message = msg
			}
		}
		out = append(out, h)
	}
	return out
}
