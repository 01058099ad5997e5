package deviceplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

// fakeKubelet is the kubelet's side of the device-plugin API over real
// unix sockets: it serves the Registration service on kubelet.sock,
// records every RegisterRequest, and for each one dials the plugin's
// endpoint back, asks for its options and keeps a ListAndWatch stream open,
// recording every list, as the kubelet's device manager does.
type fakeKubelet struct {
	t    *testing.T
	dir  string
	sock string

	mu       sync.Mutex
	srv      *grpc.Server
	requests []*pluginapi.RegisterRequest
	options  map[string]*pluginapi.DevicePluginOptions
	lists    map[string][][]*pluginapi.Device
	clients  map[string]*grpc.ClientConn
}

type registrationServer struct {
	pluginapi.UnimplementedRegistrationServer
	k *fakeKubelet
}

func newFakeKubelet(t *testing.T, dir string) *fakeKubelet {
	k := &fakeKubelet{t: t, dir: dir, sock: filepath.Join(dir, "kubelet.sock"),
		options: map[string]*pluginapi.DevicePluginOptions{}, lists: map[string][][]*pluginapi.Device{}, clients: map[string]*grpc.ClientConn{}}
	t.Cleanup(k.stop)
	return k
}

// start serves kubelet.sock.
func (k *fakeKubelet) start() {
	k.t.Helper()
	lis, err := net.Listen("unix", k.sock)
	if err != nil {
		k.t.Fatalf("fake kubelet: %v", err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, &registrationServer{k: k})
	k.mu.Lock()
	k.srv = srv
	k.mu.Unlock()
	// Serve ends when the test stops the server; its error says nothing
	// the test needs.
	go func() { _ = srv.Serve(lis) }()
}

// stop stops serving, closes the connections to the plugin and removes
// kubelet.sock, as a kubelet that exits does.
func (k *fakeKubelet) stop() {
	k.mu.Lock()
	srv, clients := k.srv, k.clients
	k.srv, k.clients = nil, map[string]*grpc.ClientConn{}
	k.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	for _, c := range clients {
		c.Close()
	}
	os.Remove(k.sock)
}

// restart stops and starts again. With wipe, it first removes every file
// in the directory, as a starting kubelet does.
func (k *fakeKubelet) restart(wipe bool) {
	k.t.Helper()
	k.stop()
	if wipe {
		entries, _ := os.ReadDir(k.dir)
		for _, e := range entries {
			os.Remove(filepath.Join(k.dir, e.Name()))
		}
	}
	k.start()
}

func (s *registrationServer) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k := s.k
	k.mu.Lock()
	k.requests = append(k.requests, req)
	k.mu.Unlock()
	if req.Version != pluginapi.Version {
		return nil, fmt.Errorf("unsupported version %q", req.Version)
	}
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, req.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	client := pluginapi.NewDevicePluginClient(conn)
	opts, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("GetDevicePluginOptions: %w", err)
	}
	stream, err := client.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("ListAndWatch: %w", err)
	}
	k.mu.Lock()
	if old := k.clients[req.ResourceName]; old != nil {
		old.Close()
	}
	k.clients[req.ResourceName] = conn
	k.options[req.ResourceName] = opts
	k.mu.Unlock()
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			k.mu.Lock()
			k.lists[req.ResourceName] = append(k.lists[req.ResourceName], resp.Devices)
			k.mu.Unlock()
		}
	}()
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) registrations() []*pluginapi.RegisterRequest {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.requests)
}

// registered returns the resource names registered so far, sorted.
func (k *fakeKubelet) registered() []string {
	var out []string
	for _, r := range k.registrations() {
		out = append(out, r.ResourceName)
	}
	slices.Sort(out)
	return out
}

func (k *fakeKubelet) listsOf(resource string) [][]*pluginapi.Device {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.lists[resource])
}

// connected counts the resources the current kubelet instance holds a
// connection to.
func (k *fakeKubelet) connected() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.clients)
}

// drop closes the kubelet's connection to a resource and forgets it
// without a new registration, as the kubelet's device manager does when a
// ListAndWatch stream ends.
func (k *fakeKubelet) drop(resource string) {
	k.mu.Lock()
	conn := k.clients[resource]
	delete(k.clients, resource)
	k.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

// client is the kubelet's connection to a registered resource.
func (k *fakeKubelet) client(resource string) pluginapi.DevicePluginClient {
	k.t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	conn := k.clients[resource]
	if conn == nil {
		k.t.Fatalf("fake kubelet: %s is not registered", resource)
	}
	return pluginapi.NewDevicePluginClient(conn)
}

// eventually waits up to 10 s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// env is one simulated node with a device-plugin directory, a fake kubelet
// and the shim under test.
type env struct {
	t          *testing.T
	ctx        context.Context
	dir        string // the kubelet's device-plugin directory
	pluginsDir string // the kubelet's (DRA) plugin directory
	cdiDir     string
	sim        *simnode.Node
	inv        *inventory.Inventory
	plan       *planner.Plan
	kubelet    *fakeKubelet
	plugin     *Plugin
}

func newEnv(t *testing.T, preset, config string) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	// Unix socket paths must stay under 108 bytes, which t.TempDir()
	// (named after the test) does not promise.
	base, err := os.MkdirTemp("", "kyb-dp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	e := &env{t: t, ctx: ctx, dir: filepath.Join(base, "dp"), pluginsDir: filepath.Join(base, "plugins"), cdiDir: filepath.Join(base, "cdi")}
	for _, d := range []string{e.dir, e.pluginsDir, e.cdiDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	node := simnodetest.New(t, preset, config)
	e.sim, e.inv, e.plan = node.Sim, node.Inv, node.Plan
	e.kubelet = newFakeKubelet(t, e.dir)
	return e
}

func (e *env) options() Options {
	return Options{
		NodeName:          "node-1",
		Inventory:         e.inv,
		Plan:              e.plan,
		Edits:             containeredits.Options{DeviceNumbers: e.sim.DeviceNumbers},
		CDIRoot:           e.cdiDir,
		DevicePluginDir:   e.dir,
		KubeletPluginsDir: e.pluginsDir,
	}
}

// startPlugin starts the shim with the env's options, changed by mutate.
func (e *env) startPlugin(mutate ...func(*Options)) {
	e.t.Helper()
	p, err := e.tryStart(mutate...)
	if err != nil {
		e.t.Fatalf("start the shim: %v", err)
	}
	e.plugin = p
}

func (e *env) tryStart(mutate ...func(*Options)) (*Plugin, error) {
	opts := e.options()
	for _, m := range mutate {
		m(&opts)
	}
	p, err := Start(e.ctx, opts)
	if err == nil {
		e.t.Cleanup(p.Stop)
	}
	return p, err
}

// start starts the fake kubelet, then the shim, and waits until every
// resource is registered and watched.
func (e *env) start(mutate ...func(*Options)) {
	e.t.Helper()
	e.kubelet.start()
	e.startPlugin(mutate...)
	e.waitRegistered(len(e.plugin.Resources()))
}

// waitRegistered waits for n registrations in all and a list from each
// registered resource.
func (e *env) waitRegistered(n int) {
	e.t.Helper()
	eventually(e.t, fmt.Sprintf("%d registrations", n), func() bool { return len(e.kubelet.registrations()) >= n })
	for _, r := range e.plugin.Resources() {
		eventually(e.t, "a device list of "+r, func() bool { return len(e.kubelet.listsOf(r)) > 0 })
	}
}

// fakeHealth is a health.Source the test sets by hand.
type fakeHealth struct {
	mu   sync.Mutex
	bad  map[int]string
	subs map[int]chan struct{}
	next int
}

func newFakeHealth() *fakeHealth {
	return &fakeHealth{bad: map[int]string{}, subs: map[int]chan struct{}{}}
}

func (f *fakeHealth) Faults() map[int]health.Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[int]health.Fault, len(f.bad))
	for k, v := range f.bad {
		out[k] = health.Fault{Kind: health.KindXID, Message: v}
	}
	return out
}

func (f *fakeHealth) Subscribe() (<-chan struct{}, func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{}, 1)
	id := f.next
	f.next++
	f.subs[id] = ch
	return ch, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.subs, id)
	}
}

// set marks GPU i unhealthy (reason != "") or healthy, and tells the
// subscribers.
func (f *fakeHealth) set(i int, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if reason == "" {
		delete(f.bad, i)
	} else {
		f.bad[i] = reason
	}
	for _, ch := range f.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// dial connects to a socket of the shim, as the kubelet does.
func dial(t *testing.T, path string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}
