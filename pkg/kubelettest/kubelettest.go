// Package kubelettest stands in for the kubelet in front of a DRA plugin,
// over the plugin's real unix sockets: it finds the plugin's registration
// socket, registers it as the kubelet's plugin watcher does, and calls
// NodePrepareResources and NodeUnprepareResources on the endpoint the
// plugin names. It is for tests and checks that run a plugin without a
// kubelet (make gpu-check); no binary links it (hack/deps-check.sh).
package kubelettest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Kubelet is a registered plugin's kubelet side.
type Kubelet struct {
	conns []*grpc.ClientConn
	dra   drapb.DRAPluginClient
	// Endpoint is the DRA socket the plugin registered.
	Endpoint string
}

// Register waits up to timeout for driver's registration socket in
// registrarDir (<driver>-reg.sock), registers the plugin and connects to
// the endpoint it names. Close closes the connections.
func Register(ctx context.Context, registrarDir, driver string, timeout time.Duration) (*Kubelet, error) {
	sock := filepath.Join(registrarDir, driver+"-reg.sock")
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no registration socket %s after %s", sock, timeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	k := &Kubelet{}
	reg, err := k.dial(sock)
	if err != nil {
		return nil, err
	}
	rc := registerapi.NewRegistrationClient(reg)
	info, err := rc.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		k.Close()
		return nil, fmt.Errorf("GetInfo on %s: %w", sock, err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != driver {
		k.Close()
		return nil, fmt.Errorf("GetInfo on %s: a %s plugin named %q, want the DRA plugin %s", sock, info.Type, info.Name, driver)
	}
	if _, err := rc.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		k.Close()
		return nil, fmt.Errorf("NotifyRegistrationStatus on %s: %w", sock, err)
	}
	conn, err := k.dial(info.Endpoint)
	if err != nil {
		k.Close()
		return nil, err
	}
	k.dra, k.Endpoint = drapb.NewDRAPluginClient(conn), info.Endpoint
	return k, nil
}

func (k *Kubelet) dial(path string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", path, err)
	}
	k.conns = append(k.conns, conn)
	return conn, nil
}

// Close closes the connections.
func (k *Kubelet) Close() {
	for _, c := range k.conns {
		_ = c.Close()
	}
}

func ref(c *resourceapi.ResourceClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}

// Prepare prepares one claim and returns the CDI device IDs of its
// devices, in the plugin's order; the plugin's error for the claim is an
// error.
func (k *Kubelet) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]string, error) {
	resp, err := k.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{ref(claim)}})
	if err != nil {
		return nil, fmt.Errorf("NodePrepareResources: %w", err)
	}
	r := resp.Claims[string(claim.UID)]
	switch {
	case r == nil:
		return nil, fmt.Errorf("NodePrepareResources answered nothing for claim %s/%s", claim.Namespace, claim.Name)
	case r.Error != "":
		return nil, fmt.Errorf("prepare claim %s/%s: %s", claim.Namespace, claim.Name, r.Error)
	}
	var ids []string
	for _, d := range r.Devices {
		ids = append(ids, d.CdiDeviceIds...)
	}
	if len(ids) == 0 {
		return nil, errors.New("the claim was prepared with no CDI device")
	}
	return ids, nil
}

// Unprepare unprepares one claim; the plugin's error for it is an error.
func (k *Kubelet) Unprepare(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	resp, err := k.dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{ref(claim)}})
	if err != nil {
		return fmt.Errorf("NodeUnprepareResources: %w", err)
	}
	r := resp.Claims[string(claim.UID)]
	switch {
	case r == nil:
		return fmt.Errorf("NodeUnprepareResources answered nothing for claim %s/%s", claim.Namespace, claim.Name)
	case r.Error != "":
		return fmt.Errorf("unprepare claim %s/%s: %s", claim.Namespace, claim.Name, r.Error)
	}
	return nil
}
