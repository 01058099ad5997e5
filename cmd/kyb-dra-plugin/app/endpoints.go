package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
)

// endpoints are the plugin's network endpoints beside its sockets: the
// gRPC health service the kubelet's liveness probe asks, and the
// Prometheus metrics.
type endpoints struct {
	healthPort     int
	healthAddress  string
	metricsAddress string
}

func (e *endpoints) addFlags(f *cli.FlagSet) {
	f.IntVar(&e.healthPort, "healthcheck-port", "HEALTHCHECK_PORT", -1, "port of the gRPC health service (liveness probe); -1: off")
	f.StringVar(&e.healthAddress, "healthcheck-address", "HEALTHCHECK_ADDRESS", "127.0.0.1", "IP address the gRPC health service listens on; the kubelet's gRPC probes dial the pod IP, so a chart sets it from status.podIP")
	f.StringVar(&e.metricsAddress, "metrics-address", "METRICS_ADDRESS", "", "address of the Prometheus metrics endpoint (/metrics), such as :8080; empty: off")
}

func (e *endpoints) check() error {
	if e.healthPort < -1 || e.healthPort > 65535 {
		return fmt.Errorf("--healthcheck-port %d is not a port (or -1 for off)", e.healthPort)
	}
	if net.ParseIP(e.healthAddress) == nil {
		return fmt.Errorf("--healthcheck-address %q is not an IP address", e.healthAddress)
	}
	if e.metricsAddress != "" {
		if _, _, err := net.SplitHostPort(e.metricsAddress); err != nil {
			return fmt.Errorf("--metrics-address %q: %w", e.metricsAddress, err)
		}
	}
	return nil
}

// serve runs the plugin's endpoints beside it until ctx ends or the plugin
// stops, and waits for them to end.
func (e *endpoints) serve(ctx context.Context, d *draplugin.Driver) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	if e.metricsAddress != "" {
		if err := serveMetrics(ctx, &wg, e.metricsAddress, promhttp.HandlerFor(d.Registry(), promhttp.HandlerOpts{})); err != nil {
			return err
		}
	}
	if e.healthPort >= 0 {
		if err := d.ServeLiveness(ctx, &wg, e.healthAddress, e.healthPort); err != nil {
			return err
		}
	}
	select {
	case <-ctx.Done():
		klog.FromContext(ctx).Info("Shutting down")
		return nil
	case <-d.Done():
		return d.Err()
	}
}

// serveMetrics serves h on addr/metrics until ctx ends; wg tracks the
// server.
func serveMetrics(ctx context.Context, wg *sync.WaitGroup, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics endpoint: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	logger := klog.FromContext(ctx)
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "Metrics endpoint failed")
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		_ = srv.Close()
	})
	logger.Info("Serving metrics", "address", ln.Addr().String())
	return nil
}
