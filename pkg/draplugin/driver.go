// Package draplugin is the kyb DRA kubelet plugin: it publishes the node's
// groups and seats as ResourceSlices and prepares the claims the scheduler
// allocated on them, through the upstream kubeletplugin helper (gRPC over
// the kubelet's unix sockets) and its resourceslice controller.
//
// A Driver is the plugin's gRPC surface, its life (start, stop) and the
// route every claim takes through a prepare (prepare.go); it calls the
// parts that each own one thing and the lock that guards it:
//
//   - the seat ledger (package seatledger): which claim holds which seats,
//     the checkpoint, the repair at start;
//   - the seat kinds (package seatkind): what the hardware does for a
//     seat: time slices and MPS daemons (sharedseats), MIG instances
//     (migseats);
//   - the publisher: the layout, what is published, health taints, the
//     watch for wiped slices;
//   - the status writer: the queue that writes claims' seats into their
//     status behind the prepare;
//   - the claim specs: the CDI spec of each prepared claim.
//
// Each part is made with what it needs, in the order open gives; none is
// handed another after it is made.
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
	"github.com/kyb-ai/kyb-dra-driver/pkg/containerclaims"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/migseats"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatkind"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sharedseats"
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

// Options configure the plugin. NodeName, Client, Inventory, Plan,
// Containers.Edits.DeviceNumbers and BootID are required.
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
	// Containers say what the claims' specs give containers.
	Containers ContainerOptions
	// Dirs are where the plugin's files and sockets are.
	Dirs Dirs
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
	// Health says how the GPUs' health reaches the slices and the kubelet.
	Health HealthOptions
	// Sharing applies the profiles' sharing strategies (MPS daemons, time
	// slices); package sharedseats fills in what the plugin gives it.
	Sharing sharedseats.Options
	// MIG makes the instances of MIG seats at prepare; package migseats
	// fills in what the plugin gives it.
	MIG migseats.Options
	// Usage configures the per-pod GPU metrics; a nil Sampler: none.
	Usage podusage.Options
	// PodResources is the kubelet's PodResources API: which claims each
	// container of a pod references, for the specs of claims that share a
	// container and for the GPU metrics; nil: not asked (claims that may
	// share a container are then combined as when it cannot answer).
	PodResources podresources.ClaimsReader
	// Hooks, for tests only, are called at each step of prepare/unprepare.
	Hooks func(HookPoint)
	// Clock, for tests; default the real clock.
	Clock clock.WithTicker
}

// ContainerOptions say what the claims' specs give containers.
type ContainerOptions struct {
	// Edits says how containers get device nodes and driver files.
	Edits containeredits.Options
	// NVIDIACDIDevice, when set, names NVIDIA's own CDI device for a GPU
	// ("" for none); its entry brings the driver files into the container.
	NVIDIACDIDevice func(index int, uuid string) string
}

// Dirs are where the plugin keeps its files and sockets.
type Dirs struct {
	// CDI is where claim specs are written (default /var/run/cdi).
	CDI string
	// PluginData holds the DRA socket and the checkpoint (default
	// /var/lib/kubelet/plugins/gpu.kyb.ai).
	PluginData string
	// Registrar is the kubelet's plugin registry (default
	// /var/lib/kubelet/plugins_registry).
	Registrar string
}

// HealthOptions say how the GPUs' health reaches the slices and the
// kubelet.
type HealthOptions struct {
	// Source tells which GPUs are unhealthy; nil: all healthy. The devices
	// of groups with an unhealthy GPU are tainted, and the slices
	// republished whenever health changes.
	Source health.Source
	// Collector serves the health monitor's metrics with the plugin's;
	// nil: none.
	Collector prometheus.Collector
	// ReportInterval is how often device health is re-sent to the kubelet
	// (default 10s).
	ReportInterval time.Duration
	// LostEffect is the taint effect for a lost GPU: NoSchedule (default)
	// or NoExecute. Other faults taint NoSchedule.
	LostEffect resourceapi.DeviceTaintEffect
}

// Driver is a running plugin.
type Driver struct {
	opts    Options
	node    draresources.Node
	hooks   hooks
	metrics *metrics
	events  *nodeevents.Recorder

	ledger    *seatledger.Ledger
	kinds     kinds
	specs     *claimSpecs
	holders   *containerclaims.Finder
	usage     *podusage.Usage
	publisher *publisher
	statuses  *statusWriter
	helper    *kubeletplugin.Helper
	// recovered says the ledger rebuilt a lost checkpoint in the
	// background: the rebuilt claims' statuses are owed.
	recovered chan struct{}

	// ctx ends at Stop or on a fatal error (cancel). The goroutines the
	// Driver starts are in background; the ledger, the status writer's
	// queue and the event recorder track their own. Stop waits for all.
	ctx        context.Context
	cancel     context.CancelCauseFunc
	background sync.WaitGroup
}

// kinds are the seat kinds, in the order a claim's route asks them: MIG
// first, which turns MIG mode off on whole GPUs before their groups'
// daemons start.
type kinds struct {
	mig        *migseats.Seats
	mps        *sharedseats.MPS
	timeSliced *sharedseats.TimeSliced
}

func (k kinds) list() []seatkind.Kind { return []seatkind.Kind{k.mig, k.mps, k.timeSliced} }

var errStopped = errors.New("plugin stopped")

// Start repairs the node's state, registers with the kubelet and publishes
// the node's ResourceSlices.
func Start(ctx context.Context, opts Options) (*Driver, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	d := &Driver{
		opts: opts, hooks: hooks(opts.Hooks), metrics: newMetrics(), ctx: ctx, cancel: cancel,
		node: draresources.NewNode(opts.NodeName, opts.Plan, opts.Inventory), recovered: make(chan struct{}, 1),
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
		"layout", d.publisher.currentLayout(), "pluginDir", opts.Dirs.PluginData, "cdiRoot", opts.Dirs.CDI)
	ok = true
	return d, nil
}

// open makes the parts, each with what it needs, and repairs the node's
// state before the kubelet can call. The order is what each needs: the
// seat kinds before the claim specs that ask them, the specs and the
// publisher before the ledger that keeps them told, the ledger before the
// parts that read it.
func (d *Driver) open(ctx context.Context) error {
	opts := d.opts
	if opts.Health.Collector != nil {
		if err := d.metrics.registry.Register(opts.Health.Collector); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	// The registration directory too: a plugin that starts before the
	// kubelet (a node booting, a kubelet being upgraded) would fail to
	// listen in a directory the kubelet has not made yet. The kubelet
	// finds a socket already there when it starts watching.
	for _, dir := range []string{opts.Dirs.PluginData, opts.Dirs.Registrar} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("create the kubelet plugin directory: %w", err)
		}
	}
	w, err := cdi.NewWriter(opts.Dirs.CDI)
	if err != nil {
		return err
	}
	// Before the MIG journal is first read: a damaged one is reported.
	d.events = nodeevents.Start(ctx, opts.BackgroundClient, opts.NodeName, driver.Name)
	feed := &seatledger.UsageFeed{}
	if err := d.openKinds(ctx, feed); err != nil {
		return err
	}
	d.specs = &claimSpecs{writer: w, inv: opts.Inventory, containers: opts.Containers, kinds: d.kinds.list()}
	d.publisher = newPublisher(d.node, opts.Layout, healthTaints{view: health.View{Source: opts.Health.Source}, lostEffect: opts.Health.LostEffect},
		d.kinds.mig, d.events, d.metrics, opts.BackgroundClient, opts.Clock)
	layout := d.publisher.currentLayout()
	if err := draresources.CheckPoolBounds(draresources.Resources(d.node.Plan, d.node.Inv, d.node.Pool, layout), layout); err != nil {
		return err
	}
	if err := d.metrics.registry.Register(seatCollector{d.publisher}); err != nil {
		return fmt.Errorf("register the seat metrics: %w", err)
	}
	if err := d.openLedger(ctx, feed); err != nil {
		return err
	}
	if err := d.metrics.registry.Register(sizeCollector{p: d.publisher, ledger: d.ledger}); err != nil {
		return fmt.Errorf("register the sized seat metrics: %w", err)
	}
	d.holders = containerclaims.NewFinder(opts.PodResources, opts.Client.ResourceV1(), d.ledger)
	d.kinds.mig.Start(ctx, d.ledger, d.specs)
	d.statuses = newStatusWriter(opts.BackgroundClient.ResourceV1(), d.ledger, d.kinds.mig, d.metrics, func() { d.hooks.run(HookAfterStatusWrite) })
	if opts.Usage.Sampler != nil {
		d.usage = podusage.New(ctx, opts.Usage, d.ledger, opts.PodResources, opts.Dirs.PluginData, d.node.Index)
		if err := d.metrics.registry.Register(d.usage.Collector()); err != nil {
			return fmt.Errorf("register the GPU usage metrics: %w", err)
		}
	}
	// Before the kubelet can call: adopt the MPS daemons of groups in use,
	// start those that went away, stop those no claim uses.
	d.kinds.mps.Settle(ctx, true)
	return nil
}

// openKinds makes the seat kinds. The MIG seats settle what a crash left
// half made before the ledger writes the specs a start owes, so that no
// spec names an instance that is not there; the MPS daemons are sized by
// what the ledger will tell feed.
func (d *Driver) openKinds(ctx context.Context, feed *seatledger.UsageFeed) error {
	mig := d.opts.MIG
	mig.Node, mig.Dir, mig.BootID, mig.Events, mig.Registry, mig.Clock = d.node, d.opts.Dirs.PluginData, d.opts.BootID, d.events, d.metrics.registry, d.opts.Clock
	var err error
	if d.kinds.mig, err = migseats.Open(ctx, mig); err != nil {
		return err
	}
	sharing := d.opts.Sharing
	sharing.Node, sharing.Usage, sharing.Events, sharing.Registry = d.node, feed, d.events, d.metrics.registry
	if d.kinds.mps, err = sharedseats.NewMPS(sharing); err != nil {
		return err
	}
	d.kinds.timeSliced = sharedseats.NewTimeSliced(sharing)
	return nil
}

// openLedger opens the seat ledger, which repairs the node's state.
func (d *Driver) openLedger(ctx context.Context, feed *seatledger.UsageFeed) error {
	opts := d.opts
	specs, err := d.ledgerSpecs(ctx)
	if err != nil {
		return err
	}
	d.ledger, err = seatledger.Open(ctx, seatledger.Options{
		Pool: d.node.Pool, Plan: opts.Plan, Inventory: opts.Inventory, Dir: opts.Dirs.PluginData,
		SharedWithPeer: opts.PodUID != "", BootID: opts.BootID, Specs: specs, Claims: opts.Client.ResourceV1(),
		Events: d.events, Clock: opts.Clock, UsageChanged: d.publisher.setUsage, Feed: feed,
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
	return err
}

// startHelper registers with the kubelet through the upstream helper.
func (d *Driver) startHelper(ctx context.Context) error {
	opts := d.opts
	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(driver.Name),
		kubeletplugin.KubeClient(opts.Client),
		kubeletplugin.NodeName(opts.NodeName),
		kubeletplugin.RegistrarDirectoryPath(opts.Dirs.Registrar),
		kubeletplugin.PluginDataDirectoryPath(opts.Dirs.PluginData),
		kubeletplugin.CDIDirectory(opts.Dirs.CDI),
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
	return nil
}

// runBackground starts the plugin's background work. Publishing waits for
// the API server (the resourceslice controller syncs its informer first).
// The kubelet may already call: unprepare and repeated prepares need no
// slices, so an API server that is down at start must not hold them up.
func (d *Driver) runBackground(ctx context.Context) {
	logger := klog.FromContext(ctx)
	view := d.publisher.health.view
	// Subscribe before the first publish, so that no change is missed.
	healthChanged, unsubscribe := view.Subscribe()
	// The device names are known now, for the health stream.
	d.publisher.resources()
	d.statuses.queueOwed()
	d.background.Go(func() {
		if err := d.publisher.publish(ctx, d.helper); err != nil {
			logger.Error(err, "Cannot publish ResourceSlices")
		}
		d.publisher.watchForWipes(ctx, d.helper)
	})
	d.background.Go(func() {
		defer unsubscribe()
		d.publisher.watchChanges(ctx, d.helper, healthChanged)
	})
	d.background.Go(func() { d.statuses.run(ctx) })
	mpsHealth, unsubscribeMPS := view.Subscribe()
	d.background.Go(func() {
		defer unsubscribeMPS()
		d.kinds.mps.Run(ctx, view, mpsHealth)
	})
	if d.usage != nil {
		d.background.Go(func() { d.usage.Run(klog.NewContext(ctx, klog.LoggerWithName(logger, "gpu-usage"))) })
	}
	d.background.Go(func() {
		d.ledger.ReleaseStale(ctx)
		d.kinds.mps.Settle(ctx, false)
		// A stale claim's MIG instances go with it, and so does what was
		// reported of them.
		d.kinds.mig.Settle(ctx, d.ledger, d.specs)
	})
	d.background.Go(func() { d.kinds.mig.Run(ctx, d.ledger, d.specs) })
	d.background.Go(func() { d.follow(ctx) })
}

// follow keeps what is written of the claims in step with what changed
// behind the calls, until ctx ends: the statuses of a rebuilt checkpoint's
// claims, and of claims whose MIG instance went or was made again (their
// devices' taints are published too).
func (d *Driver) follow(ctx context.Context) {
	changes := d.kinds.mig.Changes()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.recovered:
			d.statuses.queueOwed()
			d.kinds.mps.Settle(ctx, true)
		case <-changes.C():
			for _, uid := range changes.Take() {
				d.statuses.rewrite(uid)
			}
			d.publisher.nudge()
		}
	}
}

func (o *Options) setDefaults() error {
	switch {
	case o.NodeName == "":
		return errors.New("the node name is required")
	case o.Client == nil:
		return errors.New("a Kubernetes client is required")
	case o.Inventory == nil || o.Plan == nil:
		return errors.New("the inventory and the plan are required")
	case o.Containers.Edits.DeviceNumbers == nil:
		return errors.New("a device-number lookup is required")
	case o.BootID == "":
		return errors.New("the node's boot ID is required")
	}
	if o.BackgroundClient == nil {
		o.BackgroundClient = o.Client
	}
	if o.Dirs.CDI == "" {
		o.Dirs.CDI = "/var/run/cdi"
	}
	if o.Dirs.PluginData == "" {
		o.Dirs.PluginData = driver.PluginDir(kubeletplugin.KubeletPluginsDir)
	}
	if o.Dirs.Registrar == "" {
		o.Dirs.Registrar = kubeletplugin.KubeletRegistryDir
	}
	if o.Layout == "" {
		o.Layout = LayoutAuto
	}
	if o.Health.ReportInterval <= 0 {
		o.Health.ReportInterval = 10 * time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	switch o.Health.LostEffect {
	case "":
		o.Health.LostEffect = resourceapi.DeviceTaintEffectNoSchedule
	case resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute:
	default:
		return fmt.Errorf("GPU-lost taint effect %q: must be NoSchedule or NoExecute", o.Health.LostEffect)
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
