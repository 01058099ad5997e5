package draplugin

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
)

// HandleError is called by the helper for errors in the background. A
// ResourceSlice whose fields the API server dropped switches the plugin to
// the per-seat layout; other recoverable errors are logged (the helper
// retries), and those of publishing are counted, a slice the API server
// refuses with a Warning event; a fatal one stops the plugin.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	logger := klog.FromContext(ctx)
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) {
		// Dropped taints cost the scheduler's view of health, not seats:
		// no reason to change the layout for them.
		features := dropped.DisabledFeatures()
		rest := slices.DeleteFunc(slices.Clone(features), func(f string) bool { return f == "DRADeviceTaints" })
		if len(rest) < len(features) {
			d.publisher.taintsDropped(ctx)
		}
		if len(rest) > 0 {
			d.publisher.fallBack(ctx, d.helper, dropped, rest)
		}
		return
	}
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		switch {
		case apierrors.IsInvalid(err):
			// Retrying cannot fix a slice the API server refuses: say so
			// where an operator looks, once per distinct refusal.
			d.metrics.errors.WithLabelValues("publish", "invalid").Inc()
			d.events.WarningOnce(ctx, nodeevents.ReasonInvalidResourceSlice, "The API server refuses this node's ResourceSlices; the node offers no seats until the configuration or the plugin is fixed: "+err.Error())
		case isAPIError(err):
			d.metrics.errors.WithLabelValues("publish", "api").Inc()
		}
		logger.Error(err, msg)
		return
	}
	logger.Error(err, "Fatal error; stopping the plugin", "context", msg)
	d.cancel(fmt.Errorf("%s: %w", msg, err))
}

// isAPIError reports whether err is the API server's answer to a request
// (a status error, with or without details: a conflict on a slice, a 500
// from an overloaded server, a timeout) or a request that failed on its
// way there. Of the helper's background work only its resourceslice
// controller talks to the API server (the health stream and the gRPC
// servers do not), so such an error is one of publishing.
func isAPIError(err error) bool {
	var status apierrors.APIStatus
	var uerr *url.Error
	return errors.As(err, &status) || errors.As(err, &uerr)
}
