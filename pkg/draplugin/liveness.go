package draplugin

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// ServeLiveness serves the gRPC health service on address:port for the
// pod's liveness probe. A check passes when the plugin can really serve:
// its registration socket answers GetInfo, and its DRA socket answers an
// empty NodePrepareResources (which runs the whole gRPC path, checkpoint
// read included, without preparing anything).
//
// It serves until ctx ends; wg tracks the server.
func (d *Driver) ServeLiveness(ctx context.Context, wg *sync.WaitGroup, address string, port int) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("health service: %w", err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, &liveness{d: d})
	logger := klog.FromContext(ctx)
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil {
			logger.Error(err, "Health service failed")
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		srv.Stop()
	})
	klog.FromContext(ctx).Info("Serving the gRPC health service", "address", ln.Addr().String())
	return nil
}

type liveness struct {
	healthpb.UnimplementedHealthServer
	d *Driver
}

func (l *liveness) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := l.d.CheckLive(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Liveness check failed")
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (l *liveness) Watch(*healthpb.HealthCheckRequest, grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	return status.Error(codes.Unimplemented, "use Check")
}

// CheckLive dials the plugin's own sockets as the kubelet does.
func (d *Driver) CheckLive(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	select {
	case <-d.Done():
		return fmt.Errorf("the plugin stopped: %v", context.Cause(d.ctx))
	default:
	}
	reg := filepath.Join(d.opts.Dirs.Registrar, driver.Name+"-reg.sock")
	draSock := filepath.Join(d.opts.Dirs.PluginData, "dra.sock")
	if d.opts.PodUID != "" {
		reg = kubeletplugin.RollingUpdateRegistrarSocketFile(d.opts.Dirs.Registrar, driver.Name, d.opts.PodUID)
		if !filepath.IsAbs(reg) {
			reg = filepath.Join(d.opts.Dirs.Registrar, reg)
		}
		draSock = filepath.Join(d.opts.Dirs.PluginData, "dra-"+string(d.opts.PodUID)+".sock")
	}
	conn, err := grpc.NewClient("unix://"+reg, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial registration socket %s: %w", reg, err)
	}
	defer conn.Close()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return fmt.Errorf("registration socket %s: GetInfo: %w", reg, err)
	}
	if info.Name != driver.Name {
		return fmt.Errorf("registration socket %s answers for %q", reg, info.Name)
	}
	dconn, err := grpc.NewClient("unix://"+draSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dial DRA socket %s: %w", draSock, err)
	}
	defer dconn.Close()
	if _, err := drapb.NewDRAPluginClient(dconn).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{}); err != nil {
		return fmt.Errorf("DRA socket %s: NodePrepareResources: %w", draSock, err)
	}
	return nil
}
