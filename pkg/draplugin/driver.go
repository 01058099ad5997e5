// Package draplugin is the kyb DRA kubelet plugin: it publishes the node's
// groups and seats as ResourceSlices and prepares the claims the scheduler
// allocated on them, through the upstream kubeletplugin helper (gRPC over
// the kubelet's unix sockets) and its resourceslice controller.
package draplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// LayoutMode chooses the ResourceSlice layout.
type LayoutMode string

const (
	// LayoutAuto publishes shared devices and falls back to one device per
	// seat when the API server drops the fields shared devices need.
	LayoutAuto LayoutMode = "auto"
	// LayoutShared and LayoutPerSeat force a layout.
	LayoutShared  LayoutMode = "shared"
	LayoutPerSeat LayoutMode = "per-seat"
)

// Options configure the plugin. NodeName, Client, Inventory and Plan are
// required.
type Options struct {
	NodeName  string
	Client    kubernetes.Interface
	Inventory *inventory.Inventory
	Plan      *planner.Plan
	// Edits says how containers get device nodes and driver files.
	Edits containeredits.Options
	// NVIDIACDIDevice, when set, names NVIDIA's own CDI device for a GPU
	// ("" for none); its entry brings the driver files into the container.
	NVIDIACDIDevice func(index int, uuid string) string
	// CDIRoot is where claim specs are written (default /var/run/cdi).
	CDIRoot string
	// PluginDataDir holds the DRA socket and the checkpoint (default
	// /var/lib/kubelet/plugins/gpu.kyb.ai).
	PluginDataDir string
	// RegistrarDir is the kubelet's plugin registry (default
	// /var/lib/kubelet/plugins_registry).
	RegistrarDir string
	// PodUID enables rolling updates: two plugin pods serve the node at
	// once during an update, with their own sockets and a shared lock.
	PodUID types.UID
	// BootIDFile is read to tell a reboot (default
	// /proc/sys/kernel/random/boot_id).
	BootIDFile string
	// Layout chooses the ResourceSlice layout (default auto).
	Layout LayoutMode
	// HealthReportInterval is how often device health is re-sent to the
	// kubelet (default 10s).
	HealthReportInterval time.Duration
	// Health tells which GPUs are unhealthy; nil: all healthy. The
	// devices of groups with an unhealthy GPU are tainted, and the slices
	// republished whenever health changes.
	Health HealthSource
	// GPULostEffect is the taint effect for a lost GPU: NoSchedule
	// (default) or NoExecute. Other faults taint NoSchedule.
	GPULostEffect resourceapi.DeviceTaintEffect
	// Collectors are further metrics to serve with the plugin's, such as
	// the health monitor's.
	Collectors []prometheus.Collector
	// Hooks, for tests only, are called at each step of prepare/unprepare.
	Hooks func(HookPoint)
	// Clock, for tests; default the real clock.
	Clock clock.WithTicker
}

// Driver is a running plugin.
type Driver struct {
	opts        Options
	pool        string
	inv         *inventory.Inventory
	plan        *planner.Plan
	index       map[string]draresources.DeviceRef
	store       *checkpoint.Store
	cdi         *cdi.Writer
	editOptions containeredits.Options
	client      kubernetes.Interface
	clock       clock.WithTicker
	hooks       hooks
	health      healthView
	metrics     *metrics

	helper      *kubeletplugin.Helper
	broadcaster events.EventBroadcaster
	recorder    events.EventRecorder
	nodeRef     *corev1.ObjectReference

	ctx    context.Context
	cancel context.CancelCauseFunc
	// background goroutines (the health watch) that Stop waits for.
	background sync.WaitGroup

	// mu serialises every change of the checkpoint: batches of prepares,
	// unprepares, the start-up repair. st is the checkpoint in memory (nil:
	// read it from the file); pending are prepares waiting for a batch.
	mu        sync.Mutex
	st        *checkpoint.State
	pendingMu sync.Mutex
	pending   []*reservation
	// flushCh asks the flusher to make the last save durable; heldCh says
	// the groups in use changed (publish again).
	flushCh chan struct{}
	heldCh  chan struct{}
	// statusQueue holds the claims whose status still lacks their seats.
	statusQueue workqueue.TypedRateLimitingInterface[types.UID]
	// lost is set while the checkpoint is lost and not yet rebuilt;
	// releasedWhileLost holds the claims unprepared meanwhile.
	lost              atomic.Bool
	releasedWhileLost sync.Map

	// publishMu serialises publishing: start-up, a health change, a layout
	// fallback and a kubelet's wipe may republish at once.
	publishMu sync.Mutex

	layoutMu  sync.Mutex
	layout    draresources.Layout
	published []string
	// held are the seats of the checkpoint's claims per group device.
	held   draresources.Held
	warned map[string]bool
}

// Start repairs the node's state, registers with the kubelet and publishes
// the node's ResourceSlices.
func Start(ctx context.Context, opts Options) (*Driver, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	d := &Driver{
		opts: opts, pool: opts.NodeName, inv: opts.Inventory, plan: opts.Plan,
		index: draresources.Index(opts.Plan), client: opts.Client, clock: opts.Clock,
		hooks: hooks(opts.Hooks), health: healthView{src: opts.Health, lostEffect: opts.GPULostEffect}, metrics: newMetrics(),
		editOptions: opts.Edits, ctx: ctx, cancel: cancel, layout: draresources.LayoutShared,
		flushCh: make(chan struct{}, 1), heldCh: make(chan struct{}, 1), statusQueue: newStatusQueue(),
	}
	if opts.Layout == LayoutPerSeat {
		d.layout = draresources.LayoutPerSeat
	}
	ok := false
	defer func() {
		if !ok {
			d.Stop()
		}
	}()
	for _, c := range opts.Collectors {
		if err := d.metrics.registry.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	if err := os.MkdirAll(opts.PluginDataDir, 0o750); err != nil {
		return nil, fmt.Errorf("create plugin data directory: %w", err)
	}
	d.store = checkpoint.NewStore(opts.PluginDataDir)
	w, err := cdi.NewWriter(opts.CDIRoot)
	if err != nil {
		return nil, err
	}
	d.cdi = w
	d.startEvents(ctx)
	d.background.Add(1)
	go func() {
		defer d.background.Done()
		d.flush(ctx)
	}()
	if err := d.repair(ctx); err != nil {
		return nil, err
	}

	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(driver.Name),
		kubeletplugin.KubeClient(opts.Client),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.RegistrarDirectoryPath(opts.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(opts.PluginDataDir),
		kubeletplugin.CDIDirectory(opts.CDIRoot),
		// The plugin serialises only what must be: changes of the
		// checkpoint, in batches (state.go), with the rolling-update file
		// lock where two instances serve the node. Specs are written and
		// answers sent concurrently.
		kubeletplugin.Serialize(false),
	}
	if opts.PodUID != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(opts.PodUID))
	}
	helper, err := kubeletplugin.Start(ctx, d, helperOpts...)
	if err != nil {
		return nil, fmt.Errorf("start the kubelet plugin: %w", err)
	}
	d.helper = helper
	// Subscribe before the first publish, so that no change is missed.
	changed, unsubscribe := d.health.subscribe()
	// Publishing waits for the API server (the resourceslice controller
	// syncs its informer first). The kubelet may already call: unprepare
	// and repeated prepares need no slices, so an API server that is down
	// at start must not hold them up. The device names are known now.
	d.resources()
	d.queueMissingStatuses()
	d.background.Add(4)
	go func() {
		defer d.background.Done()
		if err := d.publish(ctx); err != nil {
			logger.Error(err, "Cannot publish ResourceSlices")
		}
		d.watchForWipes(ctx)
	}()
	go func() {
		defer d.background.Done()
		defer unsubscribe()
		d.watchChanges(ctx, changed)
	}()
	go func() {
		defer d.background.Done()
		d.writeStatuses(ctx)
	}()
	go func() {
		defer d.background.Done()
		d.releaseStale(ctx)
	}()
	logger.Info("Started", "node", opts.NodeName, "gpus", len(opts.Inventory.GPUs), "devices", len(d.publishedDevices()), "layout", d.currentLayout(), "pluginDir", opts.PluginDataDir, "cdiRoot", opts.CDIRoot)
	ok = true
	return d, nil
}

func (o *Options) setDefaults() error {
	switch {
	case o.NodeName == "":
		return errors.New("the node name is required")
	case o.Client == nil:
		return errors.New("a Kubernetes client is required")
	case o.Inventory == nil || o.Plan == nil:
		return errors.New("the inventory and the plan are required")
	case o.Edits.DeviceNumbers == nil:
		return errors.New("a device-number lookup is required")
	}
	if o.CDIRoot == "" {
		o.CDIRoot = "/var/run/cdi"
	}
	if o.PluginDataDir == "" {
		o.PluginDataDir = kubeletplugin.KubeletPluginsDir + "/" + driver.Name
	}
	if o.RegistrarDir == "" {
		o.RegistrarDir = kubeletplugin.KubeletRegistryDir
	}
	if o.BootIDFile == "" {
		o.BootIDFile = "/proc/sys/kernel/random/boot_id"
	}
	if o.Layout == "" {
		o.Layout = LayoutAuto
	}
	if o.HealthReportInterval <= 0 {
		o.HealthReportInterval = 10 * time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	switch o.GPULostEffect {
	case "":
		o.GPULostEffect = resourceapi.DeviceTaintEffectNoSchedule
	case resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute:
	default:
		return fmt.Errorf("GPU-lost taint effect %q: must be NoSchedule or NoExecute", o.GPULostEffect)
	}
	return nil
}

// Stop unregisters from the kubelet and stops publishing. Published
// ResourceSlices stay: a restarting plugin keeps its node schedulable.
// Claim statuses still queued get a few seconds to be written, and the
// checkpoint is flushed to disk.
func (d *Driver) Stop() {
	if d.helper != nil {
		d.helper.Stop()
	}
	d.drainStatuses()
	d.cancel(errStopped)
	d.background.Wait()
	if d.broadcaster != nil {
		d.broadcaster.Shutdown()
	}
	if d.store != nil {
		if err := d.store.Sync(); err != nil {
			klog.Background().Error(err, "Cannot flush the checkpoint to disk at stop")
		}
	}
}

// drainStatuses stops the status queue, giving queued writes a bounded
// time to finish.
func (d *Driver) drainStatuses() {
	// Statuses still waiting out their delay are written now: the next
	// start, or a rebuild of a lost checkpoint, finds them in place.
	d.queueMissingStatuses()
	drained := make(chan struct{})
	go func() {
		d.statusQueue.ShutDownWithDrain()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(stopDrainTimeout):
		// Writes left are retried by the next start (StatusWritten).
		d.statusQueue.ShutDown()
	}
}

// Done is closed when the plugin stops, on Stop or on a fatal error.
func (d *Driver) Done() <-chan struct{} { return d.ctx.Done() }

// Err is why the plugin stopped: nil while it runs, errStopped after Stop,
// or the fatal error that stopped it.
func (d *Driver) Err() error {
	if err := context.Cause(d.ctx); err != nil && !errors.Is(err, errStopped) && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// Registry is the plugin's Prometheus registry.
func (d *Driver) Registry() *prometheus.Registry { return d.metrics.registry }

// Helper is the kubelet plugin helper (for liveness checks).
func (d *Driver) Helper() *kubeletplugin.Helper { return d.helper }
