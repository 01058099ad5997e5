package podresources

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

// StartWait is how long a surface starting on a node waits for the
// kubelet's PodResources API: a plugin's container may start before the
// kubelet serves it (a node booting, a kubelet restarting beside the
// plugin), and the kubelet must be up for either surface to register
// anyway.
const StartWait = 2 * time.Minute

// ListWhenServed lists through list, and while the kubelet does not serve
// the API yet (its socket missing or refusing: gRPC Unavailable), asks
// again with a growing pause, for up to within: a start check then waits
// for the kubelet instead of failing the plugin's start, and still ends
// with the kubelet's own error where it never answers. Any other error is
// returned at once.
func ListWhenServed(ctx context.Context, within time.Duration, list func(context.Context) (Listing, error)) (Listing, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var (
		l       Listing
		lastErr error
		logged  bool
	)
	backoff := wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 20, Cap: 5 * time.Second}
	err := wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		l, lastErr = list(ctx)
		if lastErr == nil {
			return true, nil
		}
		// status.Code finds the status under List's wrapping.
		if status.Code(lastErr) != codes.Unavailable {
			return false, lastErr
		}
		if !logged {
			klog.FromContext(ctx).Info("Waiting for the kubelet to serve its PodResources API", "within", within, "err", lastErr)
			logged = true
		}
		return false, nil
	})
	switch {
	case err == nil:
		return l, nil
	case lastErr == nil:
		return Listing{}, err
	case status.Code(lastErr) == codes.Unavailable:
		return Listing{}, fmt.Errorf("the kubelet did not serve its PodResources API within %s: %w", within, lastErr)
	}
	return Listing{}, lastErr
}
