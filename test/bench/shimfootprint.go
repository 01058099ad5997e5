package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// ShimFootprintOptions configure the shim's footprint study.
type ShimFootprintOptions struct {
	// Shim is the shim binary (bin/kyb-device-plugin).
	Shim string
	// Allocations are the Allocate calls made after start, one seat each,
	// each after a GetPreferredAllocation, as the kubelet does.
	Allocations int
}

// ShimFootprintStudy is the shim's footprint after start and after the
// allocations.
type ShimFootprintStudy struct {
	Options   ShimFootprintOptions
	BinaryMiB float64
	Samples   []Sample
}

// registrar is the kubelet's Registration service, as the device manager
// serves it on kubelet.sock: it records each resource that registers.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	mu        sync.Mutex
	endpoints map[string]string // resource -> endpoint socket name
}

func (r *registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.endpoints[req.ResourceName] = req.Endpoint
	return &pluginapi.Empty{}, nil
}

func (r *registrar) registered() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]string, len(r.endpoints))
	for k, v := range r.endpoints {
		out[k] = v
	}
	return out
}

// RunShimFootprint starts the shim binary on a simulated dgx-h100 node as
// a DaemonSet would, serves it a kubelet registration socket, opens every
// resource's ListAndWatch stream as the device manager does, samples it,
// makes the allocations, and samples it again.
func RunShimFootprint(ctx context.Context, opts ShimFootprintOptions) (*ShimFootprintStudy, error) {
	shim, err := filepath.Abs(opts.Shim)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(shim)
	if err != nil {
		return nil, fmt.Errorf("shim footprint: the shim binary: %w (make build)", err)
	}
	if err := dropFromPageCache(shim); err != nil {
		return nil, fmt.Errorf("shim footprint: %w", err)
	}
	// Short: unix socket paths have 108 bytes.
	dir, err := os.MkdirTemp("", "kyb-shimfp-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	dp, plugins := filepath.Join(dir, "dp"), filepath.Join(dir, "plugins")
	if err := os.MkdirAll(dp, 0o750); err != nil {
		return nil, err
	}
	reg := &registrar{endpoints: map[string]string{}}
	lis, err := net.Listen("unix", filepath.Join(dp, "kubelet.sock"))
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, reg)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	logFile, err := os.Create(filepath.Join(dir, "shim.log"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = logFile.Close() }()
	// No kubelet serves PodResources here: the shim is told not to ask.
	cmd := exec.CommandContext(ctx, shim, "--simulate", "dgx-h100", "--node-name", "footprint-node",
		"--device-plugin-directory-path", dp, "--kubelet-plugins-directory-path", plugins, "--cdi-root", filepath.Join(dir, "cdi"), "--pod-resources-socket", "")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", shim, err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}()
	// The default configuration on a dgx-h100: 1x, 2x and 4x.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return len(reg.registered()) == 3, nil
	})
	if err != nil {
		return nil, fmt.Errorf("the shim registered %v: %w (log: %s)", reg.registered(), err, tail(logFile.Name()))
	}
	clients := map[string]pluginapi.DevicePluginClient{}
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	var seats []string
	for res, ep := range reg.registered() {
		conn, err := grpc.NewClient("unix://"+filepath.Join(dp, ep), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		conns = append(conns, conn)
		c := pluginapi.NewDevicePluginClient(conn)
		stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
		if err != nil {
			return nil, fmt.Errorf("ListAndWatch %s: %w", res, err)
		}
		first, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("ListAndWatch %s: %w", res, err)
		}
		// Keep the stream open, as the device manager does.
		go func() {
			for {
				if _, err := stream.Recv(); err != nil {
					return
				}
			}
		}()
		clients[res] = c
		if res == "kyb.ai/gpu-1x-seat" {
			for _, d := range first.Devices {
				seats = append(seats, d.ID)
			}
		}
	}
	slices.Sort(seats)
	if len(seats) == 0 {
		return nil, fmt.Errorf("the shim serves no kyb.ai/gpu-1x-seat seats")
	}
	st := &ShimFootprintStudy{Options: opts, BinaryMiB: float64(fi.Size()) / (1 << 20)}
	settle := func(when string) error {
		time.Sleep(3 * time.Second)
		s, err := sample(cmd.Process.Pid, "", when)
		st.Samples = append(st.Samples, s)
		return err
	}
	if err := settle("after start, registered, every ListAndWatch open"); err != nil {
		return nil, err
	}
	c := clients["kyb.ai/gpu-1x-seat"]
	for i := range opts.Allocations {
		pref, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: seats, AllocationSize: 1,
		}}})
		if err != nil || len(pref.ContainerResponses) != 1 || len(pref.ContainerResponses[0].DeviceIDs) != 1 {
			return nil, fmt.Errorf("preferred allocation %d: %v %v", i, pref, err)
		}
		id := seats[i%len(seats)]
		resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{id}}}})
		if err != nil || len(resp.ContainerResponses) != 1 || resp.ContainerResponses[0].Envs["KYB_GPU_SEAT"] == "" {
			return nil, fmt.Errorf("allocate %s: %v %v", id, resp, err)
		}
	}
	if err := settle(fmt.Sprintf("after %d allocations", opts.Allocations)); err != nil {
		return nil, err
	}
	return st, nil
}

// Table is the study's table.
func (st *ShimFootprintStudy) Table() *Table {
	t := &Table{
		Title:  fmt.Sprintf("Shim footprint (bin/kyb-device-plugin, %.1f MiB, started from a cold page cache; simulated dgx-h100, registered with a kubelet registration server)", st.BinaryMiB),
		Header: []string{"when", "RSS", "of it private (anon)", "peak RSS", "CPU since start"},
	}
	for _, s := range st.Samples {
		t.Rows = append(t.Rows, []string{s.When, fmt.Sprintf("%.1f MiB", s.RSSMiB), fmt.Sprintf("%.1f MiB", s.AnonMiB), fmt.Sprintf("%.1f MiB", s.PeakMiB), Dur(s.CPU)})
	}
	return t
}
