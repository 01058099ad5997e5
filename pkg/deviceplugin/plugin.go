// Package deviceplugin is the device-plugin shim: it serves the node's GPU
// groups and seats through the kubelet's classic device-plugin API
// (v1beta1), for clusters without DRA. It is an adapter around the same
// planner and container edits as the DRA plugin, so a container sees the
// same environment and devices whichever surface served it.
//
// The shape, and why:
//
//   - One extended resource per profile (kyb.ai/gpu-1x-seat, ...), each on
//     its own socket, one device ID per seat (<group device>-seat-<n>, such
//     as g01-2x-seat-0). The ID carries everything Allocate needs, because
//     Allocate is not told which pod it serves; the shim keeps no
//     accounting of who holds what.
//   - The kubelet counts each resource on its own, so it cannot keep a 4x
//     group and a 2x group that share a GPU from being in use at once. The
//     shim therefore exports the planner's exclusive layout, in which no GPU
//     serves two profiles that exclude each other; profiles[].gpus in the
//     node configuration steers which GPUs serve which profile.
//   - GetPreferredAllocation keeps a request's seats on one group and packs
//     or spreads by the configured policy, in one pass over the groups.
//   - The kubelet removes every socket in its directory when it starts and
//     forgets every plugin; the shim watches the directory and serves and
//     registers again (see registration.go).
//   - Seat generations (KYB_SEAT_GEN) count hand-outs in memory, since the
//     kubelet never reports a release (see allocate.go).
//   - A sized profile is not served (sized.go): the kubelet's integer
//     resources cannot tie a seat's memory and compute to its group.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/miginstance"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
)

// Injection says how Allocate hands a container its seats.
type Injection string

const (
	// InjectionEnvVar returns environment variables, device nodes and
	// driver-file mounts for the kubelet to apply; it works with every
	// container runtime.
	InjectionEnvVar Injection = "envvar"
	// InjectionCDI writes a CDI spec and returns the CDI device name; the
	// runtime (containerd 1.7+, CRI-O 1.24+ with CDI on) applies it.
	InjectionCDI Injection = "cdi"
)

// Options configure the shim. Inventory, Plan and Edits.DeviceNumbers are
// required.
type Options struct {
	// NodeName is logged; the shim talks to no API server.
	NodeName  string
	Inventory *inventory.Inventory
	// Plan is the node's full plan; the shim serves its exclusive layout.
	Plan *planner.Plan
	// Edits says how containers get device nodes and driver files.
	Edits containeredits.Options
	// NVIDIACDIDevice, with CDI injection, names NVIDIA's own CDI device
	// for a GPU ("" for none), whose entry brings the driver files.
	NVIDIACDIDevice func(index int, uuid string) string
	// Injection is envvar (default) or cdi.
	Injection Injection
	// CDIRoot is where specs are written with CDI injection (default
	// /var/run/cdi).
	CDIRoot string
	// DevicePluginDir is the kubelet's device-plugin directory, which
	// holds kubelet.sock and the shim's sockets (default
	// /var/lib/kubelet/device-plugins/).
	DevicePluginDir string
	// KubeletPluginsDir is the kubelet's plugin directory, where a live DRA
	// plugin socket makes the shim refuse to start (default
	// /var/lib/kubelet/plugins).
	KubeletPluginsDir string
	// PodResources lists what the containers of the kubelet's active pods
	// hold (its PodResources API). The shim refuses to start while a
	// container holds devices the DRA plugin prepared, and destroys the
	// MIG instances of seats its configuration no longer has once no
	// container holds them. nil: neither is checked, and no made MIG
	// instance is destroyed at start.
	PodResources func(ctx context.Context) (podresources.Listing, error)
	// Health tells which GPUs are unhealthy; nil: all healthy.
	Health health.Source
	// Sharing applies the profiles' sharing strategies (MPS daemons,
	// time slices); see sharing.go.
	Sharing Sharing
	// MIG makes the instances of the MIG profiles' seats; see mig.go.
	MIG MIG
	// PollInterval is how often the shim checks its sockets and the
	// kubelet's even without a file event, a safety net for missed events
	// (default 5s; 1s where the directory cannot be watched).
	PollInterval time.Duration

	// noWatch, for tests, turns the directory watch off to prove the poll.
	noWatch bool
}

func (o *Options) setDefaults() error {
	switch {
	case o.Inventory == nil || o.Plan == nil:
		return errors.New("the inventory and the plan are required")
	case o.Edits.DeviceNumbers == nil:
		return errors.New("a device-number lookup is required")
	}
	switch o.Injection {
	case "":
		o.Injection = InjectionEnvVar
	case InjectionEnvVar, InjectionCDI:
	default:
		return fmt.Errorf("injection %q: must be %s or %s", o.Injection, InjectionEnvVar, InjectionCDI)
	}
	if o.CDIRoot == "" {
		o.CDIRoot = "/var/run/cdi"
	}
	if o.DevicePluginDir == "" {
		o.DevicePluginDir = pluginapi.DevicePluginPath
	}
	if o.KubeletPluginsDir == "" {
		o.KubeletPluginsDir = "/var/lib/kubelet/plugins"
	}
	if o.PollInterval <= 0 {
		o.PollInterval = 5 * time.Second
	}
	return nil
}

// Plugin is a running shim.
type Plugin struct {
	opts      Options
	layout    *planner.Plan
	why       string
	endpoints []*endpoint
	kubelet   string // path of kubelet.sock

	// Owned by the registration loop: the kubelet.sock the endpoints are
	// registered with, and whether the wait for one was logged.
	kubeletFile os.FileInfo
	waitLogged  bool

	sharing *shimSharing
	// sharingDone is closed when the sharing loop has ended.
	sharingDone chan struct{}
	cancel      context.CancelFunc
	stopped     chan struct{} // closed by Stop: ends every ListAndWatch
	running     bool          // the registration loop was started
	loopDone    chan struct{}
	stopOnce    sync.Once
}

// Start serves every profile of the exclusive layout on its socket and
// registers with the kubelet, now if kubelet.sock is there, else as soon as
// it appears. It refuses to start beside a live DRA plugin or another live
// shim, and while pods of the DRA plugin hold the node's GPUs. Stop ends
// it.
func Start(ctx context.Context, opts Options) (*Plugin, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx)
	if err := claimNode(logger, opts); err != nil {
		return nil, err
	}
	listing, err := checkDrained(ctx, opts)
	if err != nil {
		return nil, err
	}
	layout, why := opts.Plan.ExclusiveLayout()
	logger.Info("Device-plugin layout", "layout", "exclusive", "why", why)
	// The layout's warnings are the plan's (the caller logs those) and
	// then its own: profiles the layout left without GPUs.
	for _, w := range layout.Warnings[len(opts.Plan.Warnings):] {
		logger.Info("Exclusive layout", "warning", w)
	}
	ctx, cancel := context.WithCancel(ctx)
	p := &Plugin{
		opts: opts, layout: layout, why: why, cancel: cancel,
		kubelet: filepath.Join(opts.DevicePluginDir, "kubelet.sock"),
		stopped: make(chan struct{}), loopDone: make(chan struct{}),
	}
	ok := false
	defer func() {
		if !ok {
			p.Stop()
		}
	}()
	sharing, err := newShimSharing(opts.Sharing, opts.Inventory, layout)
	if err != nil {
		return nil, err
	}
	p.sharing = sharing
	instances, err := startMIG(opts)
	if err != nil {
		return nil, err
	}
	if err := p.makeEndpoints(ctx, instances, listing); err != nil {
		return nil, err
	}
	// Watch before serving and registering, so that a kubelet.sock created
	// meanwhile is not missed.
	w := p.watch(logger)
	for _, e := range p.endpoints {
		if err := e.serve(logger); err != nil {
			if w != nil {
				_ = w.Close()
			}
			return nil, err
		}
		logger.Info("Serving", "resource", e.res.name, "socket", e.path, "groups", groupNames(e.res), "seats", len(e.res.ids), "injection", opts.Injection)
	}
	p.running = true
	go p.run(ctx, w)
	p.sharingDone = make(chan struct{})
	go func() {
		defer close(p.sharingDone)
		p.sharing.run(ctx)
	}()
	logger.Info("Started", "node", opts.NodeName, "resources", len(p.endpoints), "devicePluginDir", opts.DevicePluginDir, "policy", layout.Policy)
	ok = true
	return p, nil
}

// claimNode makes sure the shim is the only one of the driver's surfaces
// on the node, and clears what a crashed shim left in the directory.
func claimNode(logger klog.Logger, opts Options) error {
	if err := driver.CheckNoLiveDRA(opts.KubeletPluginsDir); err != nil {
		return err
	}
	if live := driver.LiveSockets(filepath.Join(opts.DevicePluginDir, driver.ShimSocketGlob)); len(live) > 0 {
		return fmt.Errorf("another kyb device-plugin shim serves this node (%s answers); a node runs one", strings.Join(live, ", "))
	}
	if err := os.MkdirAll(opts.DevicePluginDir, 0o750); err != nil {
		return fmt.Errorf("create the device-plugin directory: %w", err)
	}
	removeStaleSockets(logger, opts.DevicePluginDir)
	return nil
}

// checkDrained asks the kubelet what its pods' containers hold, and
// refuses while any holds devices the DRA plugin prepared: the shim would
// hand the same GPUs out again. The listing is nil where the kubelet is
// not asked.
func checkDrained(ctx context.Context, opts Options) (*podresources.Listing, error) {
	if opts.PodResources == nil {
		klog.FromContext(ctx).Info("Not checking that no pod of the DRA plugin holds a GPU", "warning", "the kubelet's PodResources API is not asked; drain the node before the shim takes it over")
		return nil, nil
	}
	l, err := podresources.ListWhenServed(ctx, podresources.StartWait, opts.PodResources)
	if err != nil {
		return nil, fmt.Errorf("ask the kubelet whether pods of the kyb DRA plugin still hold this node's GPUs: %w", err)
	}
	if err := driver.CheckNoDRAPods(l.DriverHolders(driver.Name)); err != nil {
		return nil, err
	}
	return &l, nil
}

// makeEndpoints makes one endpoint per profile of the layout that has
// groups, and one per MIG profile that has seats. listing is what the
// kubelet said its containers hold, nil where it was not asked.
func (p *Plugin) makeEndpoints(ctx context.Context, instances *miginstance.Manager, listing *podresources.Listing) error {
	logger := klog.FromContext(ctx)
	var writer *cdi.Writer
	if p.opts.Injection == InjectionCDI {
		var err error
		if writer, err = cdi.NewWriter(p.opts.CDIRoot); err != nil {
			return err
		}
	}
	names := map[string]string{}
	migSeats, warnings := migLayout(p.opts.Plan)
	for _, w := range warnings {
		logger.Info("MIG seats", "warning", w)
	}
	blocked := surveyMIG(ctx, instances, p.opts.MIG.NVML, p.opts.Inventory, migSeats, listing)
	for _, prof := range p.layout.Profiles {
		if prof.Sizes != nil {
			logger.Info("Not serving a sized profile", "resource", prof.Resource, "profile", prof.Name, "why", notServedSized)
			continue
		}
		var res *resource
		switch {
		case prof.MIG != nil && len(migSeats[prof.Resource]) > 0:
			res = newMIGResource(p.layout, prof, migSeats[prof.Resource], blocked, &p.opts, writer, instances, p.stopped, logger)
		case prof.MIG == nil:
			res = newResource(p.layout, prof, &p.opts, writer, p.sharing, p.stopped, logger)
		}
		if res == nil || len(res.ids) == 0 {
			logger.Info("Not serving a profile without groups", "resource", prof.Resource, "profile", prof.Name)
			continue
		}
		e, err := newEndpoint(res, p.opts.DevicePluginDir)
		if err != nil {
			return err
		}
		if other, dup := names[e.path]; dup {
			return fmt.Errorf("resources %s and %s would share socket %s; give them different names after the domain", other, prof.Resource, e.path)
		}
		names[e.path] = prof.Resource
		p.endpoints = append(p.endpoints, e)
	}
	if len(p.endpoints) == 0 {
		if sized := sizedProfiles(p.layout); len(sized) > 0 {
			return fmt.Errorf("no profile has groups on this node (%s), and sized profile(s) %s are not served through the device-plugin API (%s): nothing to serve", p.opts.Inventory.Summary(), strings.Join(sized, ", "), notServedSized)
		}
		return fmt.Errorf("no profile has groups on this node (%s): nothing to serve", p.opts.Inventory.Summary())
	}
	return nil
}

// Stop stops registering and serving, ends every stream and removes the
// shim's sockets, so that the kubelet sees the resources go at once.
func (p *Plugin) Stop() {
	p.stopOnce.Do(func() {
		p.cancel()
		close(p.stopped)
		if p.running {
			<-p.loopDone
		}
		if p.sharingDone != nil {
			<-p.sharingDone
		}
		for _, e := range p.endpoints {
			e.stop()
		}
	})
}

// Layout is the exclusive layout the shim serves, and why it is so.
func (p *Plugin) Layout() (*planner.Plan, string) { return p.layout, p.why }

// Resources are the served resource names, smallest profile first.
func (p *Plugin) Resources() []string {
	out := make([]string, len(p.endpoints))
	for i, e := range p.endpoints {
		out[i] = e.res.name
	}
	return out
}

// removeStaleSockets removes the shim's sockets that nobody listens on
// (Start has checked that none answers): left by a crash, they would make
// the kubelet dial a dead endpoint.
func removeStaleSockets(logger klog.Logger, dir string) {
	matches, _ := filepath.Glob(filepath.Join(dir, driver.ShimSocketGlob))
	for _, m := range matches {
		st, err := os.Lstat(m)
		if err != nil || st.Mode()&os.ModeSocket == 0 {
			continue
		}
		if err := os.Remove(m); err != nil && !errors.Is(err, os.ErrNotExist) {
			logger.Error(err, "Cannot remove a stale socket", "socket", m)
			continue
		}
		logger.Info("Removed a stale socket", "socket", m)
	}
}

func groupNames(r *resource) string {
	names := make([]string, len(r.groups))
	for i, g := range r.groups {
		names[i] = g.Name
	}
	return strings.Join(names, " ")
}
