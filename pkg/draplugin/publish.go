package draplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
)

// HandleError is called by the helper for errors in the background. A
// ResourceSlice whose fields the API server dropped switches the plugin to
// the per-seat layout; other recoverable errors are logged (the helper
// retries); a fatal one stops the plugin.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	logger := klog.FromContext(ctx)
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) {
		// Dropped taints cost the scheduler's view of health, not seats:
		// no reason to change the layout for them.
		features := dropped.DisabledFeatures()
		rest := slices.DeleteFunc(slices.Clone(features), func(f string) bool { return f == "DRADeviceTaints" })
		if len(rest) < len(features) {
			d.taintsDropped(ctx)
		}
		if len(rest) > 0 {
			d.fallBack(ctx, dropped, rest)
		}
		return
	}
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		if apierrors.IsInvalid(err) {
			// Retrying cannot fix a slice the API server refuses: say so
			// where an operator looks, once per distinct refusal.
			d.metrics.errors.WithLabelValues("publish", "invalid").Inc()
			d.warnOnce("InvalidResourceSlice", "The API server refuses this node's ResourceSlices; the node offers no seats until the configuration or the plugin is fixed: "+err.Error())
		} else if strings.Contains(msg, "ResourceSlice") {
			d.metrics.errors.WithLabelValues("publish", "api").Inc()
		}
		logger.Error(err, msg)
		return
	}
	logger.Error(err, "Fatal error; stopping the plugin", "context", msg)
	d.cancel(fmt.Errorf("%s: %w", msg, err))
}

// fallBack switches to one device per seat on the exclusive layout.
func (d *Driver) fallBack(ctx context.Context, dropped *resourceslice.DroppedFieldsError, features []string) {
	d.layoutMu.Lock()
	if d.layout == draresources.LayoutPerSeat || d.opts.Layout == LayoutShared {
		d.layoutMu.Unlock()
		klog.FromContext(ctx).Error(dropped, "The API server dropped fields of the ResourceSlices and the plugin cannot fall back further", "disabledFeatures", features, "layout", d.opts.Layout)
		return
	}
	d.layout = draresources.LayoutPerSeat
	d.layoutMu.Unlock()
	_, why := d.plan.ExclusiveLayout()
	msg := fmt.Sprintf("The API server dropped fields that shared GPU groups need (features off: %s); publishing one device per seat instead, where %s. Enable DRAConsumableCapacity and DRAPartitionableDevices to get shared groups.",
		strings.Join(features, ", "), why)
	klog.Warning(msg)
	d.event(corev1.EventTypeWarning, "SeatLayoutFallback", msg)
	if err := d.publish(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot publish the per-seat layout")
	}
}

// publish publishes the plan in the current layout, with the taints of
// the unhealthy GPUs.
func (d *Driver) publish(ctx context.Context) error {
	d.publishMu.Lock()
	defer d.publishMu.Unlock()
	res := d.resources()
	if err := d.helper.PublishResources(ctx, res); err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	return nil
}

// resources computes what to publish in the current layout, with the
// taints of unhealthy GPUs, and records the device names (the health
// stream reports them).
func (d *Driver) resources() resourceslice.DriverResources {
	layout := d.currentLayout()
	res := draresources.Resources(d.plan, d.inv, d.pool, layout)
	hidden := 0
	if layout == draresources.LayoutShared && d.plan.HideUnavailable {
		hidden = draresources.HideUnavailable(res, d.plan, d.heldSeats())
	}
	d.metrics.hidden.Set(float64(hidden))
	draresources.Taint(res, d.plan, taintsOf(d.health.faults(), d.health.lostEffect))
	var names []string
	perProfile := map[string]int{}
	for _, s := range res.Pools[d.pool].Slices {
		for _, dev := range s.Devices {
			names = append(names, dev.Name)
			if ref, ok := d.index[dev.Name]; ok {
				perProfile[ref.Group.Profile.Name]++
			}
		}
	}
	d.layoutMu.Lock()
	d.published = names
	d.layoutMu.Unlock()
	d.metrics.published.Reset()
	for p, n := range perProfile {
		d.metrics.published.WithLabelValues(p, string(layout)).Set(float64(n))
	}
	return res
}

func (d *Driver) currentLayout() draresources.Layout {
	d.layoutMu.Lock()
	defer d.layoutMu.Unlock()
	return d.layout
}

func (d *Driver) publishedDevices() []string {
	d.layoutMu.Lock()
	defer d.layoutMu.Unlock()
	return slices.Clone(d.published)
}

// Layout is the layout currently published.
func (d *Driver) Layout() draresources.Layout { return d.currentLayout() }
