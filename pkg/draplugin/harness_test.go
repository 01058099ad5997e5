package draplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	oci "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/kyb-ai/kyb-dra-driver/pkg/bootid"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode/simnodetest"
)

const nodeName = "node-1"

// env is one node: its directories, its simulated GPUs, a fake API server
// client, and a running plugin that the test talks to as the kubelet does,
// over the plugin's real unix sockets.
type env struct {
	t       testing.TB
	ctx     context.Context
	dirs    struct{ reg, plugin, cdi, bootID string }
	sim     *simnode.Node
	inv     *inventory.Inventory
	plan    *planner.Plan
	client  *fake.Clientset
	cluster *schedulertest.Cluster
	driver  *draplugin.Driver
	dra     drapb.DRAPluginClient
	conn    *grpc.ClientConn
	opts    func(*draplugin.Options)
	claimN  int
}

// envOption changes an env before its plugin starts.
type envOption func(*env)

// withOptions changes the plugin's options.
func withOptions(f func(*draplugin.Options)) envOption { return func(e *env) { e.opts = f } }

// withClient changes the fake API server client.
func withClient(f func(*fake.Clientset)) envOption { return func(e *env) { f(e.client) } }

func newEnv(t testing.TB, preset, config string, options ...envOption) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx}
	// Unix socket paths are limited to 108 bytes; t.TempDir() under /tmp
	// keeps well inside.
	base, err := os.MkdirTemp("", "kyb-dra-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	e.dirs.reg = filepath.Join(base, "registry")
	e.dirs.plugin = filepath.Join(base, "plugins", driver.Name)
	e.dirs.cdi = filepath.Join(base, "cdi")
	e.dirs.bootID = filepath.Join(base, "boot_id")
	for _, d := range []string{e.dirs.reg, e.dirs.plugin, e.dirs.cdi} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	e.setBootID("boot-1")

	sn := simnodetest.New(t, preset, config)
	e.sim, e.inv, e.plan = sn.Sim, sn.Inv, sn.Plan
	e.client = newFakeClient(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "node-uid"}})
	e.cluster = schedulertest.New(schedulertest.SchedulerFeatures())
	e.cluster.AddNode(nodeName, draresources.Resources(e.plan, e.inv, nodeName, draresources.LayoutShared), driver.Name)
	e.cluster.AddNode(nodeName+"-per-seat", draresources.Resources(e.plan, e.inv, nodeName, draresources.LayoutPerSeat), driver.Name)
	e.cluster.AddClasses(draresources.DeviceClasses(e.plan.Profiles, draresources.DeviceClassOptions{})...)
	for _, o := range options {
		o(e)
	}
	e.start()
	return e
}

// newFakeClient returns a fake API server client on which ResourceSlices
// created with generateName get a name (the fake tracker does not).
func newFakeClient(objs ...runtime.Object) *fake.Clientset {
	client := fake.NewClientset(objs...)
	var n atomic.Int64
	client.PrependReactor("create", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		slice := action.(k8stesting.CreateAction).GetObject().(*resourceapi.ResourceSlice)
		if slice.Name == "" && slice.GenerateName != "" {
			slice.Name = fmt.Sprintf("%s%d", slice.GenerateName, n.Add(1))
		}
		return false, nil, nil
	})
	return client
}

func (e *env) setBootID(id string) {
	if err := os.WriteFile(e.dirs.bootID, []byte(id+"\n"), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// bootID reads the node's boot ID as the plugin's command does at start.
func (e *env) bootID() string {
	id, err := bootid.Read(e.dirs.bootID)
	if err != nil {
		e.t.Fatal(err)
	}
	return id
}

func (e *env) options() draplugin.Options {
	o := draplugin.Options{
		NodeName:   nodeName,
		Client:     e.client,
		Inventory:  e.inv,
		Plan:       e.plan,
		Containers: draplugin.ContainerOptions{Edits: containeredits.Options{DeviceNumbers: e.sim.DeviceNumbers}},
		Dirs:       draplugin.Dirs{CDI: e.dirs.cdi, PluginData: e.dirs.plugin, Registrar: e.dirs.reg},
		BootID:     e.bootID(),
		Health:     draplugin.HealthOptions{ReportInterval: 100 * time.Millisecond},
	}
	if e.opts != nil {
		e.opts(&o)
	}
	return o
}

// start starts the plugin and registers it as the kubelet would.
func (e *env) start() {
	e.t.Helper()
	d, err := draplugin.Start(e.ctx, e.options())
	if err != nil {
		e.t.Fatalf("start plugin: %v", err)
	}
	e.driver = d
	e.t.Cleanup(d.Stop)
	regSock := driver.Name + "-reg.sock"
	if uid := e.options().PodUID; uid != "" {
		regSock = kubeletplugin.RollingUpdateRegistrarSocketFile(e.dirs.reg, driver.Name, uid)
	}
	reg := e.dial(filepath.Join(e.dirs.reg, regSock))
	info, err := registerapi.NewRegistrationClient(reg).GetInfo(e.ctx, &registerapi.InfoRequest{})
	if err != nil {
		e.t.Fatalf("GetInfo: %v", err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != driver.Name {
		e.t.Fatalf("GetInfo: %+v", info)
	}
	if _, err := registerapi.NewRegistrationClient(reg).NotifyRegistrationStatus(e.ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		e.t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
	e.conn = e.dial(info.Endpoint)
	e.dra = drapb.NewDRAPluginClient(e.conn)
}

// stop stops the plugin, as a pod being deleted or crashing would.
func (e *env) stop() {
	e.driver.Stop()
	e.conn.Close()
}

func (e *env) restart() {
	e.t.Helper()
	e.stop()
	e.start()
}

func (e *env) dial(path string) *grpc.ClientConn {
	e.t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		e.t.Fatalf("dial %s: %v", path, err)
	}
	e.t.Cleanup(func() { conn.Close() })
	return conn
}

// claim allocates a claim of class with the scheduler's allocator and
// stores it, allocated, in the fake API server.
func (e *env) claim(class string, mutate ...func(*resourceapi.DeviceRequest)) *resourceapi.ResourceClaim {
	return e.claimOn(nodeName, class, mutate...)
}

func (e *env) claimOn(node, class string, mutate ...func(*resourceapi.DeviceRequest)) *resourceapi.ResourceClaim {
	return e.allocate(node, class, true, mutate...)
}

// standaloneClaim is a claim no pod owns, which any pod may reference.
func (e *env) standaloneClaim(class string) *resourceapi.ResourceClaim {
	return e.allocate(nodeName, class, false)
}

// allocate makes a claim, owned by a pod as one made from the pod's
// template is unless standalone, and allocates it.
func (e *env) allocate(node, class string, podOwned bool, mutate ...func(*resourceapi.DeviceRequest)) *resourceapi.ResourceClaim {
	e.t.Helper()
	e.claimN++
	c := schedulertest.Claim(fmt.Sprintf("claim-%d", e.claimN), class, 1, mutate...)
	c.UID = types.UID(fmt.Sprintf("0000000%d-1111-2222-3333-444444444444", e.claimN))
	if podOwned {
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: fmt.Sprintf("pod-%d", e.claimN), UID: types.UID(fmt.Sprintf("p%d", e.claimN)), Controller: new(true)}}
	}
	alloc, err := e.cluster.Allocate(e.ctx, c, node)
	if err != nil || alloc == nil {
		e.t.Fatalf("allocate %s on %s: %v %v", class, node, alloc, err)
	}
	for i := range alloc.Devices.Results {
		alloc.Devices.Results[i].Pool = nodeName
	}
	c.Status.Allocation = alloc
	return e.store(c)
}

func (e *env) store(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	e.t.Helper()
	created, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Create(e.ctx, c, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return created
}

func ref(c *resourceapi.ResourceClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}

func prepareRequest(claims ...*resourceapi.ResourceClaim) *drapb.NodePrepareResourcesRequest {
	req := &drapb.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, ref(c))
	}
	return req
}

func (e *env) prepare(claims ...*resourceapi.ResourceClaim) map[string]*drapb.NodePrepareResourceResponse {
	e.t.Helper()
	resp, err := e.dra.NodePrepareResources(e.ctx, prepareRequest(claims...))
	if err != nil {
		e.t.Fatalf("NodePrepareResources: %v", err)
	}
	return resp.Claims
}

func (e *env) prepareOK(c *resourceapi.ResourceClaim) []string {
	e.t.Helper()
	r := e.prepare(c)[string(c.UID)]
	if r == nil || r.Error != "" {
		e.t.Fatalf("prepare %s: %+v", c.Name, r)
	}
	var ids []string
	for _, d := range r.Devices {
		ids = append(ids, d.CdiDeviceIds...)
	}
	return ids
}

func unprepareRequest(claims ...*resourceapi.ResourceClaim) *drapb.NodeUnprepareResourcesRequest {
	req := &drapb.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, ref(c))
	}
	return req
}

func (e *env) unprepare(claims ...*resourceapi.ResourceClaim) map[string]*drapb.NodeUnprepareResourceResponse {
	e.t.Helper()
	resp, err := e.dra.NodeUnprepareResources(e.ctx, unprepareRequest(claims...))
	if err != nil {
		e.t.Fatalf("NodeUnprepareResources: %v", err)
	}
	return resp.Claims
}

func cdiapiCache(dir string) (*cdiapi.Cache, error) {
	return cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
}

func ociSpec() *oci.Spec { return &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}} }

// container injects CDI devices into an empty OCI spec the way a container
// runtime does, reading the specs from the CDI directory, and returns the
// container's environment and device nodes.
func (e *env) container(ids ...string) (map[string]string, map[string]oci.LinuxDevice) {
	e.t.Helper()
	spec := e.inject(ids...)
	envs := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		envs[k] = v
	}
	devs := map[string]oci.LinuxDevice{}
	for _, d := range spec.Linux.Devices {
		devs[d.Path] = d
	}
	return envs, devs
}

// inject injects the CDI devices ids into an empty OCI spec, as a
// container runtime does.
func (e *env) inject(ids ...string) *oci.Spec {
	e.t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(e.dirs.cdi), cdiapi.WithAutoRefresh(false))
	if err != nil {
		e.t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		e.t.Fatalf("inject %v: unresolved %v: %v", ids, unresolved, err)
	}
	return spec
}

func (e *env) uuids(indices ...int) string {
	var out []string
	for _, i := range indices {
		out = append(out, e.inv.GPUs[i].UUID)
	}
	return strings.Join(out, ",")
}
