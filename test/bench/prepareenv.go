package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	kubeletdra "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"

	"github.com/kyb-ai/kyb-dra-driver/pkg/bootid"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/schedulertest"
	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// PrepareConfig gives a dgx-h100 64 one-GPU seats (8 per GPU), so that 64
// claims can be prepared at once.
const PrepareConfig = `
profiles:
- {resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 8}
- {resource: kyb.ai/gpu-2x-seat, seatsPerGroup: 3}
- {resource: kyb.ai/gpu-4x-seat}
`

// prepareEnv is one simulated node of an in-process control plane with
// the kubelet's DRA manager and two drivers registered with it the same
// way (the kubeletplugin helper, equal client rate limits): ours, started
// in-process with timestamps at each step of prepare, and the no-op driver.
type prepareEnv struct {
	c    *harness.Cluster
	node *harness.Node
	// requests counts the API requests of our plugin's clients and of the
	// no-op driver's.
	requests *requestCounts
	limits   Limits
	ours     *draplugin.Driver
	noop     *kubeletplugin.Helper
	alloc    *schedulertest.Cluster
	class    string
	conns    map[string]drapb.DRAPluginClient
	steps    *stepClock
	n        int
	// cdiRoot is where our plugin writes its CDI specs; cdiOnTmpfs says
	// whether it is a tmpfs of ours, removed at the end.
	cdiRoot    string
	cdiOnTmpfs bool
}

// stepClock records when our plugin passes each step of prepare.
type stepClock struct {
	mu    sync.Mutex
	times map[draplugin.HookPoint]time.Time
	// saves counts checkpoint saves that recorded new seats: one per batch.
	saves int
}

func (s *stepClock) record(p draplugin.HookPoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.times[p] = time.Now()
	if p == draplugin.HookAfterSave {
		s.saves++
	}
}

// batches returns the batch count since the last call.
func (s *stepClock) batches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.saves
	s.saves = 0
	return n
}

func (s *stepClock) reset() map[draplugin.HookPoint]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.times
	s.times = map[draplugin.HookPoint]time.Time{}
	return t
}

// Limits are the drivers' client-side API rate limits: each driver has a
// client of its own, as each is a process of its own on a node.
// BackgroundQPS 0 gives our plugin one client for everything (its
// BackgroundClient unset), as before the two were split.
type Limits struct {
	QPS             float32
	Burst           int
	BackgroundQPS   float32
	BackgroundBurst int
}

// background is the QPS our plugin's work behind the calls gets.
func (l Limits) background() float32 {
	if l.BackgroundQPS > 0 {
		return l.BackgroundQPS
	}
	return l.QPS
}

func newPrepareEnv(ctx context.Context, c *harness.Cluster, name string, l Limits) (*prepareEnv, error) {
	node := c.AddNode(harness.NodeOptions{Name: name, Preset: "dgx-h100", NoPlugin: true})
	counts := &requestCounts{}
	client, err := counts.client(c.RESTConfig(l.QPS, l.Burst), "ours/prepare")
	if err != nil {
		return nil, err
	}
	background := client
	if l.BackgroundQPS > 0 {
		if background, err = counts.client(c.RESTConfig(l.BackgroundQPS, l.BackgroundBurst), "ours/background"); err != nil {
			return nil, err
		}
	}
	noopClient, err := counts.client(c.RESTConfig(l.QPS, l.Burst), "noop")
	if err != nil {
		return nil, err
	}
	plan, inv, sim, err := Plan(ctx, "dgx-h100", node.Name, PrepareConfig)
	if err != nil {
		return nil, err
	}
	cdiRoot, onTmpfs := cdiDir(node.CDIDir)
	e := &prepareEnv{c: c, node: node, cdiRoot: cdiRoot, cdiOnTmpfs: onTmpfs, requests: counts, limits: l, steps: &stepClock{times: map[draplugin.HookPoint]time.Time{}}, conns: map[string]drapb.DRAPluginClient{}}
	boot, err := bootid.Read(node.BootIDFile)
	if err != nil {
		return nil, err
	}
	e.ours, err = draplugin.Start(ctx, draplugin.Options{
		NodeName: node.Name, Client: client, BackgroundClient: background, Inventory: inv, Plan: plan,
		Containers: draplugin.ContainerOptions{Edits: containeredits.Options{DeviceNumbers: sim.DeviceNumbers}},
		Dirs:       draplugin.Dirs{CDI: cdiRoot, PluginData: filepath.Join(node.PluginsDir, driver.Name), Registrar: node.RegistryDir},
		BootID:     boot,
		Hooks:      e.steps.record,
	})
	if err != nil {
		return nil, fmt.Errorf("start our plugin: %w", err)
	}
	e.noop, err = startNoop(ctx, noopClient, node.Name, node.RegistryDir, filepath.Join(node.PluginsDir, NoopDriver))
	if err != nil {
		return nil, err
	}
	pm := node.DRAManager().GetWatcherHandler().(*kubeletdra.DRAPluginManager)
	for _, drv := range []string{driver.Name, NoopDriver} {
		err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			_, err := pm.GetPlugin(drv)
			return err == nil, nil
		})
		if err != nil {
			return nil, fmt.Errorf("driver %s did not register with the kubelet: %w", drv, err)
		}
		conn, err := dialDriver(ctx, node.RegistryDir, drv)
		if err != nil {
			return nil, err
		}
		e.conns[drv] = conn
	}
	e.alloc = schedulertest.New(schedulertest.SchedulerFeatures())
	e.alloc.AddNode(node.Name, draresources.Resources(plan, inv, node.Name, draresources.LayoutShared), driver.Name)
	e.alloc.AddClasses(draresources.DeviceClasses(plan.Profiles, draresources.DeviceClassOptions{})...)
	e.class = draresources.DeviceClassName(plan.Profile("1x").Resource)
	return e, nil
}

// dialDriver connects to a driver's DRA socket as the kubelet does: the
// registration socket's GetInfo names the endpoint.
func dialDriver(ctx context.Context, registryDir, driverName string) (drapb.DRAPluginClient, error) {
	reg, err := grpc.NewClient("unix://"+filepath.Join(registryDir, driverName+"-reg.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	info, err := registerapi.NewRegistrationClient(reg).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("driverName %s: GetInfo: %w", driverName, err)
	}
	conn, err := grpc.NewClient("unix://"+info.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return drapb.NewDRAPluginClient(conn), nil
}

// benchClaim is a claim allocated on the node and reserved for a pod that
// exists only in memory (the kubelet's DRA manager needs no pod object).
type benchClaim struct {
	claim  *resourceapi.ResourceClaim
	pod    *v1.Pod
	result *resourceapi.AllocationResult // ours, to release
}

// claims creates n allocated claims for driver.
func (e *prepareEnv) claims(ctx context.Context, driverName string, n int) ([]*benchClaim, error) {
	out := make([]*benchClaim, n)
	for i := range out {
		e.n++
		name := fmt.Sprintf("%s-c%05d", e.node.Name, e.n)
		claim := schedulertest.Claim(name, e.class, 1)
		claim.UID = ""
		var alloc *resourceapi.AllocationResult
		if driverName == driver.Name {
			r, err := e.alloc.Allocate(ctx, schedulertest.Claim(name, e.class, 1), e.node.Name)
			if err != nil || r == nil {
				return nil, fmt.Errorf("allocate claim %s: %v (fits: %t)", name, err, r != nil)
			}
			alloc = r
		} else {
			claim.Spec.Devices.Requests[0].Exactly.DeviceClassName = "noop"
			alloc = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: NoopDriver, Pool: e.node.Name, Device: fmt.Sprintf("dev-%d", i)},
			}}}
		}
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p" + name, Namespace: "default"}}
		pod.Spec.NodeName = "no-kubelet"
		pod.Spec.Containers = []v1.Container{{Name: "c", Image: "pause"}}
		pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}}
		out[i] = &benchClaim{claim: claim, pod: pod, result: alloc}
		if driverName != driver.Name {
			out[i].result = nil
		}
		claim.Status.Allocation = alloc
	}
	// Create them in parallel: setup, not measured.
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, bc := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = e.store(ctx, bc)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (e *prepareEnv) store(ctx context.Context, bc *benchClaim) error {
	// The resource-claim controller drops reservations of pods that do
	// not exist, so the pod must; bound to a node without a kubelet, it is
	// neither scheduled nor run by anyone.
	pod, err := e.c.Client.CoreV1().Pods("default").Create(ctx, bc.pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create pod %s: %w", bc.pod.Name, err)
	}
	bc.pod = pod
	status := bc.claim.Status
	created, err := e.c.Client.ResourceV1().ResourceClaims("default").Create(ctx, bc.claim, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create claim %s: %w", bc.claim.Name, err)
	}
	created.Status = status
	created.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: bc.pod.Name, UID: bc.pod.UID}}
	updated, err := e.c.Client.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("allocate claim %s: %w", bc.claim.Name, err)
	}
	bc.claim = updated
	return nil
}

// release frees our seats in the local allocator after the claims were
// unprepared, so that the next batch fits.
func (e *prepareEnv) release(claims []*benchClaim) {
	for _, bc := range claims {
		if bc.result != nil {
			e.alloc.Release(bc.result)
		}
	}
}

func claimRef(bc *benchClaim) *drapb.Claim {
	return &drapb.Claim{Namespace: bc.claim.Namespace, Name: bc.claim.Name, Uid: string(bc.claim.UID)}
}

func checkPrepared(resp *drapb.NodePrepareResourcesResponse, bc *benchClaim) error {
	r := resp.Claims[string(bc.claim.UID)]
	if r == nil || r.Error != "" {
		return fmt.Errorf("prepare %s: %v", bc.claim.Name, r)
	}
	return nil
}

func errorsJoin(errs []error) error {
	var msgs []string
	for _, err := range errs {
		if err != nil {
			msgs = append(msgs, err.Error())
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(msgs, "; "))
}

// cdiDir is where our plugin writes its specs in the study. On a node that
// is /var/run/cdi, a tmpfs (a reboot empties it); the harness's directory
// is on this machine's disk, where each spec's create and rename would
// cost a journal entry a node never pays. So the specs go to a tmpfs when
// the machine has one (/dev/shm), else to the harness's directory.
func cdiDir(fallback string) (dir string, onTmpfs bool) {
	dir, err := os.MkdirTemp("/dev/shm", "kyb-bench-cdi-")
	if err != nil {
		return fallback, false
	}
	return dir, true
}

// requestCounts counts API requests per client and verb.
type requestCounts struct {
	mu     sync.Mutex
	counts map[string]int
}

// client is a client of cfg whose requests count under name.
func (r *requestCounts) client(cfg *rest.Config, name string) (kubernetes.Interface, error) {
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			r.mu.Lock()
			if r.counts == nil {
				r.counts = map[string]int{}
			}
			r.counts[name+" "+req.Method]++
			r.mu.Unlock()
			return rt.RoundTrip(req)
		})
	})
	return kubernetes.NewForConfig(cfg)
}

// take returns the counts since the last call.
func (r *requestCounts) take() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.counts
	r.counts = map[string]int{}
	return out
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
