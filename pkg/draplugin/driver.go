// Package draplugin is the kyb DRA kubelet plugin: it publishes the node's
// groups and seats as ResourceSlices and prepares the claims the scheduler
// allocated on them, through the upstream kubeletplugin helper (gRPC over
// the kubelet's unix sockets) and its resourceslice controller.
//
// A Driver is the plugin's gRPC surface and its life (start, stop); it
// calls the parts that each own one thing and the lock that guards it:
//
//   - the seat ledger (package seatledger): which claim holds which seats,
//     the checkpoint, the repair at start;
//   - the publisher: the layout, what is published, health taints, the
//     watch for wiped slices;
//   - the status writer: the queue that writes claims' seats into their
//     status behind the prepare;
//   - the claim specs: the CDI spec of each prepared claim.
package draplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containerclaims"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
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

// Options configure the plugin. NodeName, Client, Inventory, Plan and
// Edits.DeviceNumbers are required.
type Options struct {
	NodeName string
	// Client serves the prepare path: the helper's claim GET and what a
	// prepare must read before it answers.
	Client kubernetes.Interface
	// BackgroundClient serves what runs behind the calls: claim statuses,
	// events, ResourceSlices. A client of its own (its own rate limiter)
	// keeps that work from delaying the next prepare's reads; nil: Client.
	BackgroundClient kubernetes.Interface
	Inventory        *inventory.Inventory
	Plan             *planner.Plan
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
	// BootID is the node's boot (package bootid), read once at start and
	// handed to the seat ledger and the MIG journal: state recorded in
	// another boot tells a reboot. Required.
	BootID string
	// Layout chooses the ResourceSlice layout (default auto).
	Layout LayoutMode
	// DeviceMetadata gives every prepared device's attributes, seats,
	// generations and GPU UUIDs to its containers as a metadata file
	// (KEP-5304, at /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/gpu.kyb.ai-metadata.json,
	// resourceclaimtemplates/<pod's claim name>/... for a claim made from a
	// template). A start restores the files and specs a reboot took.
	DeviceMetadata bool
	// HealthReportInterval is how often device health is re-sent to the
	// kubelet (default 10s).
	HealthReportInterval time.Duration
	// Health tells which GPUs are unhealthy; nil: all healthy. The
	// devices of groups with an unhealthy GPU are tainted, and the slices
	// republished whenever health changes.
	Health health.Source
	// GPULostEffect is the taint effect for a lost GPU: NoSchedule
	// (default) or NoExecute. Other faults taint NoSchedule.
	GPULostEffect resourceapi.DeviceTaintEffect
	// Sharing applies the profiles' sharing strategies (MPS daemons, time
	// slices); see sharing.go.
	Sharing Sharing
	// MIG makes the instances of MIG seats at prepare; see mig.go.
	MIG MIG
	// Usage configures the per-pod GPU metrics; a nil Sampler: none.
	Usage podusage.Options
	// PodResources is the kubelet's PodResources API: which claims each
	// container of a pod references, for the specs of claims that share a
	// container and for the GPU metrics; nil: not asked (claims that may
	// share a container are then combined as when it cannot answer).
	PodResources podresources.ClaimsReader
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
	opts    Options
	node    draresources.Node
	clock   clock.WithTicker
	hooks   hooks
	metrics *metrics
	events  *nodeevents.Recorder

	ledger    *seatledger.Ledger
	specs     *claimSpecs
	sharing   *sharing
	mig       *migSeats
	usage     *podusage.Usage
	publisher *publisher
	statuses  *statusWriter
	helper    *kubeletplugin.Helper
	// recovered says the ledger rebuilt a lost checkpoint in the
	// background: the rebuilt claims' statuses are owed.
	recovered chan struct{}
	// holders finds the containers that hold a prepare call's claims.
	holders *containerclaims.Finder

	// ctx ends at Stop or on a fatal error (cancel). The goroutines the
	// Driver starts are in background; the ledger, the status writer's
	// queue and the event recorder track their own. Stop waits for all.
	ctx        context.Context
	cancel     context.CancelCauseFunc
	background sync.WaitGroup
}

var errStopped = errors.New("plugin stopped")

// Start repairs the node's state, registers with the kubelet and publishes
// the node's ResourceSlices.
func Start(ctx context.Context, opts Options) (*Driver, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	d := &Driver{
		opts: opts, clock: opts.Clock, hooks: hooks(opts.Hooks), metrics: newMetrics(), ctx: ctx, cancel: cancel,
		node: draresources.NewNode(opts.NodeName, opts.Plan, opts.Inventory),
	}
	ok := false
	defer func() {
		if !ok {
			d.Stop()
		}
	}()
	if err := d.open(ctx); err != nil {
		return nil, err
	}
	if err := d.startHelper(ctx); err != nil {
		return nil, err
	}
	d.runBackground(ctx)
	klog.FromContext(ctx).Info("Started", "node", opts.NodeName, "gpus", len(opts.Inventory.GPUs), "devices", len(d.publisher.devices()),
		"layout", d.publisher.currentLayout(), "pluginDir", opts.PluginDataDir, "cdiRoot", opts.CDIRoot)
	ok = true
	return d, nil
}

// open makes the parts and repairs the node's state before the kubelet
// can call.
func (d *Driver) open(ctx context.Context) error {
	opts := d.opts
	for _, c := range opts.Collectors {
		if err := d.metrics.registry.Register(c); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	// The registration directory too: a plugin that starts before the
	// kubelet (a node booting, a kubelet being upgraded) would fail to
	// listen in a directory the kubelet has not made yet. The kubelet
	// finds a socket already there when it starts watching.
	for _, dir := range []string{opts.PluginDataDir, opts.RegistrarDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("create the kubelet plugin directory: %w", err)
		}
	}
	w, err := cdi.NewWriter(opts.CDIRoot)
	if err != nil {
		return err
	}
	d.sharing = newSharing(opts.Sharing, d.node)
	// Before the MIG journal is first read: a damaged one is reported.
	d.events = nodeevents.Start(ctx, opts.BackgroundClient, opts.NodeName, driver.Name)
	if d.mig, err = newMIGSeats(opts.MIG, d.node, opts.PluginDataDir, migJournal{bootID: opts.BootID, events: d.events}); err != nil {
		return err
	}
	// Before the ledger writes the specs a start owes: half-made
	// instances go, and records of instances a reboot took are forgotten,
	// so that no spec names an instance that is not there.
	d.mig.reconcile(ctx, nil)
	d.specs = &claimSpecs{writer: w, inv: opts.Inventory, edits: opts.Edits, nvidiaCDI: opts.NVIDIACDIDevice, sharing: d.sharing, mig: d.mig}
	d.mig.reportNoMIGGeometry(ctx, d.events)
	if err := d.sharing.reportTo(d.events, d.metrics.registry); err != nil {
		return err
	}
	d.publisher = newPublisher(d.node, opts.Layout, healthTaints{view: health.View{Source: opts.Health}, lostEffect: opts.GPULostEffect},
		d.events, d.metrics, opts.BackgroundClient, opts.Clock)
	layout := d.publisher.currentLayout()
	if err := draresources.CheckPoolBounds(draresources.Resources(d.node.Plan, d.node.Inv, d.node.Pool, layout), layout); err != nil {
		return err
	}
	if err := d.metrics.registry.Register(seatCollector{d.publisher}); err != nil {
		return fmt.Errorf("register the seat metrics: %w", err)
	}
	d.recovered = make(chan struct{}, 1)
	specs, err := d.ledgerSpecs(ctx)
	if err != nil {
		return err
	}
	d.ledger, err = seatledger.Open(ctx, seatledger.Options{
		Pool: d.node.Pool, Plan: opts.Plan, Inventory: opts.Inventory, Dir: opts.PluginDataDir,
		SharedWithPeer: opts.PodUID != "", BootID: opts.BootID, Specs: specs, Claims: opts.Client.ResourceV1(),
		Events: d.events, Clock: opts.Clock, UsageChanged: d.usageChanged,
		Hooks: seatledger.Hooks{
			BeforeSave:       func() { d.hooks.run(HookBeforeSave) },
			AfterSave:        func() { d.hooks.run(HookAfterSave) },
			AfterSpecRemove:  func() { d.hooks.run(HookAfterCDIRemove) },
			AfterReleaseSave: func() { d.hooks.run(HookAfterUnprepareSave) },
		},
		CountError: func(operation, kind string) { d.metrics.errors.WithLabelValues(operation, kind).Inc() },
		Recovered: func() {
			select {
			case d.recovered <- struct{}{}:
			default:
			}
		},
	})
	if err != nil {
		return err
	}
	d.holders = containerclaims.NewFinder(opts.PodResources, opts.Client.ResourceV1(), d.ledger)
	if opts.PodUID != "" {
		// The other instance's claims count before a daemon is stopped,
		// or a MIG instance destroyed.
		d.sharing.reload = d.ledger.Refresh
		d.mig.refresh = d.ledger.Refresh
	}
	// Instances made for claims the checkpoint no longer holds (an
	// unprepare lost in a crash) go; those nobody recorded stay.
	d.mig.reconcile(ctx, d.ledger)
	// What is left that the plugin did not make is what the node
	// publishes around, from its first publish on.
	if d.publisher.migPartitions, err = d.mig.survey(ctx, d.events, d.metrics.registry); err != nil {
		return err
	}
	d.publisher.noMIG = append(d.mig.surveyMIGMode(ctx, opts.MIG.NVML, d.events), d.mig.unlisted...)
	d.statuses = newStatusWriter(opts.BackgroundClient.ResourceV1(), d.ledger, d.metrics, func() { d.hooks.run(HookAfterStatusWrite) })
	d.statuses.migUUID = d.mig.instanceUUID
	d.statuses.migLost = d.mig.lostDevice
	d.statuses.held = func(uid types.UID) *checkpoint.Claim { return d.ledger.PreparedClaims()[uid] }
	d.publisher.lost = d.mig.lost.byDevice
	// Before the kubelet can call: a prepared claim whose instance this
	// start's reconcile (or an earlier one) found gone.
	d.lostAtStart(ctx)
	if opts.Usage.Sampler != nil {
		d.usage = podusage.New(ctx, opts.Usage, d.ledger, opts.PodResources, opts.PluginDataDir, d.node.Index)
		if err := d.metrics.registry.Register(d.usage.Collector()); err != nil {
			return fmt.Errorf("register the GPU usage metrics: %w", err)
		}
	}
	// Before the kubelet can call: adopt the MPS daemons of groups in use,
	// start those that went away, stop those no claim uses.
	d.sharing.settle(ctx, true)
	return nil
}

// usageChanged is the ledger's UsageChanged (called with its lock held).
func (d *Driver) usageChanged(u seatledger.Usage) {
	d.publisher.setUsage(u)
	d.sharing.setUsage(u)
}

// startHelper registers with the kubelet through the upstream helper.
func (d *Driver) startHelper(ctx context.Context) error {
	opts := d.opts
	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(driver.Name),
		kubeletplugin.KubeClient(opts.Client),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.RegistrarDirectoryPath(opts.RegistrarDir),
		kubeletplugin.PluginDataDirectoryPath(opts.PluginDataDir),
		kubeletplugin.CDIDirectory(opts.CDIRoot),
		// The plugin serialises only what must be: changes of the seat
		// ledger, in batches, with the rolling-update file lock where two
		// instances serve the node. Specs are written and answers sent
		// concurrently.
		kubeletplugin.Serialize(false),
	}
	if opts.PodUID != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(opts.PodUID))
	}
	if opts.DeviceMetadata {
		helperOpts = append(helperOpts, kubeletplugin.EnableDeviceMetadata(true, metadataVersions()))
	}
	helper, err := kubeletplugin.Start(ctx, d, helperOpts...)
	if err != nil {
		return fmt.Errorf("start the kubelet plugin: %w", err)
	}
	d.helper = helper
	d.publisher.helper = helper
	return nil
}

// runBackground starts the plugin's background work. Publishing waits for
// the API server (the resourceslice controller syncs its informer first).
// The kubelet may already call: unprepare and repeated prepares need no
// slices, so an API server that is down at start must not hold them up.
func (d *Driver) runBackground(ctx context.Context) {
	logger := klog.FromContext(ctx)
	// Subscribe before the first publish, so that no change is missed.
	healthChanged, unsubscribe := d.publisher.health.view.Subscribe()
	// The device names are known now, for the health stream.
	d.publisher.resources()
	d.statuses.queueOwed()
	d.background.Go(func() {
		if err := d.publisher.publish(ctx); err != nil {
			logger.Error(err, "Cannot publish ResourceSlices")
		}
		d.publisher.watchForWipes(ctx)
	})
	d.background.Go(func() {
		defer unsubscribe()
		d.publisher.watchChanges(ctx, healthChanged)
	})
	d.background.Go(func() { d.statuses.run(ctx) })
	mpsHealth, unsubscribeMPS := d.publisher.health.view.Subscribe()
	d.background.Go(func() {
		defer unsubscribeMPS()
		d.sharing.watchDaemons(ctx, d.publisher.health.view, mpsHealth)
	})
	if d.usage != nil {
		d.background.Go(func() { d.usage.Run(klog.NewContext(ctx, klog.LoggerWithName(logger, "gpu-usage"))) })
	}
	d.background.Go(func() {
		d.ledger.ReleaseStale(ctx)
		d.sharing.settle(ctx, false)
		// A stale claim's MIG instances go with it, and so does what was
		// reported of them.
		d.mig.reconcile(ctx, d.ledger)
		if d.mig.instances != nil {
			d.checkLost(ctx)
		}
	})
	if d.mig.instances != nil {
		interval := d.opts.MIG.CheckInterval
		if interval <= 0 {
			interval = defaultMIGCheckInterval
		}
		d.background.Go(func() { d.watchLost(ctx, interval) })
	}
	d.background.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-d.recovered:
				d.statuses.queueOwed()
				d.sharing.settle(ctx, true)
			}
		}
	})
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
	case o.BootID == "":
		return errors.New("the node's boot ID is required")
	}
	if o.BackgroundClient == nil {
		o.BackgroundClient = o.Client
	}
	if o.CDIRoot == "" {
		o.CDIRoot = "/var/run/cdi"
	}
	if o.PluginDataDir == "" {
		o.PluginDataDir = driver.PluginDir(kubeletplugin.KubeletPluginsDir)
	}
	if o.RegistrarDir == "" {
		o.RegistrarDir = kubeletplugin.KubeletRegistryDir
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
// Claim statuses still queued get a few seconds to be written, every
// goroutine the plugin started is waited for, and the checkpoint is
// flushed to disk.
func (d *Driver) Stop() {
	if d.helper != nil {
		d.helper.Stop()
	}
	if d.statuses != nil {
		d.statuses.drain()
	}
	d.cancel(errStopped)
	d.background.Wait()
	if d.ledger != nil {
		d.ledger.Close(d.ctx)
	}
	d.events.Shutdown()
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

// Layout is the layout currently published.
func (d *Driver) Layout() draresources.Layout { return d.publisher.currentLayout() }
