// Package health watches the node's GPUs through NVML and says which are
// unhealthy and why. Both surfaces consume it: the DRA plugin taints the
// group devices that contain an unhealthy GPU and reports them on the
// kubelet's health stream, the device-plugin shim reports their seats
// Unhealthy in ListAndWatch.
//
// How it differs from NVIDIA's device plugin and DRA driver, and why:
//
//   - Recovery. A GPU marked unhealthy by an XID, an ECC error or a failed
//     probe becomes healthy again once NVML has answered normally for the
//     recovery period (health.recoveryPeriod, default 5m); every new fault
//     restarts the clock. Upstream leaves it unhealthy until the plugin
//     restarts (k8s-device-plugin#1014, #234; dra-driver#1455). Only a lost
//     GPU (ERROR_GPU_IS_LOST, a GPU-unavailable event) stays unhealthy: it
//     needs a reset, after which the plugin is restarted anyway.
//   - One GPU at a time. An event set Wait that fails with an error other
//     than a timeout does not mark every GPU unhealthy (upstream's
//     behaviour, which takes a whole node down for one driver hiccup): each
//     GPU is probed instead, and only those that do not answer are marked.
//     An event for a device the monitor does not know is handled the same.
//   - Probes. Every GPU is probed periodically (GetUUID, GetMemoryInfo), so
//     a GPU that stops answering is noticed without an event, and recovery
//     is proven rather than assumed.
//   - XIDs that are the application's fault are ignored by default; see
//     DefaultIgnoredXIDs for which and why, and health.ignoredXIDs /
//     health.criticalXIDs to change the list.
//   - MIG. An XID or ECC error that NVML gives a GPU instance ID makes
//     that MIG instance unhealthy, not its GPU, so that the GPU's other
//     instances keep their seats (instance.go).
//   - The driver's own word. Where the driver reports a GPU recovery
//     action, a GPU is unhealthy while it asks for one, whatever the XID
//     policy says (recovery.go).
package health

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// DefaultRecoveryPeriod is how long an unhealthy GPU must answer normally
// before it is healthy again, unless the configuration says otherwise.
const DefaultRecoveryPeriod = 5 * time.Minute

// Options configure a monitor. NVML and Inventory are required.
type Options struct {
	// NVML is the initialised library the inventory came from.
	NVML nvml.Interface
	// Inventory names the GPUs to watch; GPU i is Inventory.GPUs[i].
	Inventory *inventory.Inventory
	// Config is the node configuration's health section; nil: defaults.
	Config *v1alpha1.HealthConfig
	// Clock drives probes and recovery; default the real clock.
	Clock clock.WithTicker
	// ProbeInterval is how often every GPU is probed. Default: a quarter of
	// the recovery period, at most 10s, so that a recovery is seen soon
	// after the period ends.
	ProbeInterval time.Duration
	// WaitTimeout is how long one NVML event wait blocks (default 1s). It
	// bounds how long Stop takes: NVML cannot interrupt a wait, and the
	// event set must not be freed while one runs.
	WaitTimeout time.Duration
}

// Monitor watches a node's GPUs. It is the Source both surfaces read.
type Monitor struct {
	opts   Options
	policy XIDPolicy
	// status is what is known of the GPUs' health, which the surfaces
	// read (Faults, InstanceFaults, Subscribe); handles are the GPUs'
	// NVML handles and what each last answered.
	*status
	*handles

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New checks the options and builds a monitor; Start starts it.
func New(opts Options) (*Monitor, error) {
	if opts.NVML == nil || opts.Inventory == nil {
		return nil, errors.New("health monitor: NVML and the inventory are required")
	}
	cfg := opts.Config
	if cfg == nil {
		cfg = &v1alpha1.HealthConfig{}
	}
	policy, err := NewXIDPolicy(cfg.IgnoredXIDs, cfg.CriticalXIDs)
	if err != nil {
		return nil, fmt.Errorf("health monitor: %w", err)
	}
	recovery := DefaultRecoveryPeriod
	if cfg.RecoveryPeriod != nil && cfg.RecoveryPeriod.Duration > 0 {
		recovery = cfg.RecoveryPeriod.Duration
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = min(recovery/4, 10*time.Second)
	}
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = time.Second
	}
	return &Monitor{
		opts: opts, policy: policy,
		status:  newStatus(recovery, opts.Clock, opts.Inventory),
		handles: newHandles(opts.NVML, opts.Inventory),
	}, nil
}

// Start takes the GPUs' handles, registers for their events and probes
// them once, then keeps watching until ctx ends or Stop is called. Events
// that happen after Start returns are seen.
func (m *Monitor) Start(ctx context.Context) {
	logger := klog.LoggerWithName(klog.FromContext(ctx), "health")
	ctx = klog.NewContext(ctx, logger)
	ctx, m.cancel = context.WithCancel(ctx)
	for i := range m.devices {
		m.device(ctx, i)
	}
	set, err := m.openEvents(ctx)
	if err != nil {
		// Probes still notice GPUs that stop answering.
		logger.Error(err, "No NVML health events; GPUs are watched by probes only")
	}
	m.probeAll(ctx)
	actions := 0
	for _, ok := range m.ReportsRecoveryActions() {
		if ok {
			actions++
		}
	}
	logger.Info("Watching GPU health", "gpus", len(m.devices), "events", set != nil, "ignoredXIDs", m.policy.String(),
		"recoveryPeriod", m.recovery, "probeInterval", m.opts.ProbeInterval, "gpusReportingRecoveryActions", actions)
	if set != nil {
		m.wg.Go(func() { m.watchEvents(ctx, set) })
	}
	m.wg.Go(func() { m.probeLoop(ctx) })
}

// Stop stops watching and waits until the NVML event set is freed.
func (m *Monitor) Stop() {
	if m.cancel != nil {
		m.cancel()
	}
	m.wg.Wait()
}

// RecoveryPeriod is how long an unhealthy GPU must answer normally before
// it is healthy again.
func (m *Monitor) RecoveryPeriod() time.Duration { return m.recovery }

// Collector is the monitor's metrics, for the registry of the plugin that
// serves them.
func (m *Monitor) Collector() prometheus.Collector { return m.metrics.events }
