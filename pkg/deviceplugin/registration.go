package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Registration and re-registration.
//
// A kubelet that starts removes every file in its device-plugin directory,
// the shim's sockets included, creates kubelet.sock, and knows no plugin.
// The shim must then serve its sockets again and register each resource
// again. It learns of this three ways:
//
//   - file events on the directory (fsnotify): kubelet.sock created or
//     removed, one of the shim's sockets removed;
//   - a poll every PollInterval that compares what is there with what was
//     registered, the safety net for missed events (an overflowing inotify
//     queue, a re-created directory, a kubelet.sock that appeared before the
//     watch);
//   - a failed registration, retried with a growing delay.
//
// Events come in bursts (the kubelet removes each file, then creates its
// socket), so the shim acts once the directory has been quiet for
// settleDelay: a burst costs one re-registration, not one per event.
//
// A registration counts once the kubelet watches the resource. The kubelet
// ignores a registration for a resource it still holds a client for, and
// drops that client only when its ListAndWatch stream ends; a socket served
// again while the same kubelet runs can thus lose the race and end up
// unknown to the kubelet. So a resource registered streamGrace ago that
// nobody watches is registered again.

const (
	settleDelay     = 250 * time.Millisecond
	registerTimeout = 5 * time.Second
	firstRetryDelay = 500 * time.Millisecond
	maxRetryDelay   = 10 * time.Second
	streamGrace     = 2 * time.Second
)

// watch starts watching the device-plugin directory; nil where it cannot
// (the poll then runs every second).
func (p *Plugin) watch(logger klog.Logger) *fsnotify.Watcher {
	if p.opts.noWatch {
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err == nil {
		if err = w.Add(p.opts.DevicePluginDir); err != nil {
			w.Close()
		}
	}
	if err != nil {
		logger.Error(err, "Cannot watch the device-plugin directory; checking it every second instead", "dir", p.opts.DevicePluginDir)
		p.opts.PollInterval = min(p.opts.PollInterval, time.Second)
		return nil
	}
	return w
}

// run keeps the sockets served and registered until ctx ends.
func (p *Plugin) run(ctx context.Context, w *fsnotify.Watcher) {
	defer close(p.loopDone)
	logger := klog.FromContext(ctx)
	var events <-chan fsnotify.Event
	var watchErrs <-chan error
	if w != nil {
		defer w.Close()
		events, watchErrs = w.Events, w.Errors
	}
	poll := time.NewTicker(p.opts.PollInterval)
	defer poll.Stop()
	settle := time.NewTimer(settleDelay)
	settle.Stop()
	retry := time.NewTimer(firstRetryDelay)
	retry.Stop()
	var delay time.Duration
	// kubeletRestarted forces registration even where kubelet.sock looks
	// like the file registered with: a new file may get the old inode.
	kubeletRestarted := false
	check := func() {
		if err := p.reconcile(ctx, kubeletRestarted); err != nil {
			if ctx.Err() != nil {
				return
			}
			delay = min(max(2*delay, firstRetryDelay), maxRetryDelay)
			logger.Error(err, "Cannot serve or register every resource; retrying", "in", delay)
			retry.Reset(delay)
			return
		}
		kubeletRestarted, delay = false, 0
		retry.Stop()
	}
	check()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			if !p.relevant(ev) {
				continue
			}
			logger.V(4).Info("Device-plugin directory changed", "event", ev.String())
			if ev.Name == p.kubelet && ev.Has(fsnotify.Create) {
				kubeletRestarted = true
			}
			settle.Reset(settleDelay)
		case err, ok := <-watchErrs:
			if !ok {
				watchErrs = nil
				continue
			}
			logger.Error(err, "Watching the device-plugin directory failed; the periodic check catches what was missed")
		case <-settle.C:
			check()
		case <-retry.C:
			check()
		case <-poll.C:
			check()
		}
	}
}

// relevant reports whether an event may need the shim to act: anything on
// kubelet.sock, and the removal of one of the shim's sockets (their
// creation is the shim's own doing).
func (p *Plugin) relevant(ev fsnotify.Event) bool {
	if ev.Name == p.kubelet {
		return true
	}
	if !ev.Has(fsnotify.Remove) && !ev.Has(fsnotify.Rename) {
		return false
	}
	for _, e := range p.endpoints {
		if ev.Name == e.path {
			return true
		}
	}
	return false
}

// reconcile serves every socket that is gone and registers every resource
// the current kubelet does not know.
func (p *Plugin) reconcile(ctx context.Context, kubeletRestarted bool) error {
	logger := klog.FromContext(ctx)
	var errs []error
	for _, e := range p.endpoints {
		if e.intact() {
			continue
		}
		if e.srv != nil {
			logger.Info("Socket gone (a starting kubelet removes every socket in its directory); serving it again", "socket", e.path, "resource", e.res.name)
		}
		e.stop()
		if err := e.serve(logger); err != nil {
			errs = append(errs, err)
		}
	}
	st, err := os.Stat(p.kubelet)
	if err != nil {
		if p.kubeletFile != nil {
			logger.Info("The kubelet's socket is gone; registering again when it is back", "socket", p.kubelet)
		} else if !p.waitLogged {
			logger.Info("Waiting for the kubelet's socket", "socket", p.kubelet)
		}
		p.waitLogged = true
		p.kubeletFile = nil
		for _, e := range p.endpoints {
			e.registered = false
		}
		return errors.Join(errs...)
	}
	if kubeletRestarted || p.kubeletFile == nil || !os.SameFile(st, p.kubeletFile) {
		for _, e := range p.endpoints {
			e.registered = false
		}
	}
	p.kubeletFile = st
	var pending []*endpoint
	for _, e := range p.endpoints {
		if e.registered && e.res.streams.Load() == 0 && time.Since(e.registeredAt) > streamGrace {
			logger.Info("The kubelet does not watch a registered resource; registering it again", "resource", e.res.name)
			e.registered = false
		}
		if !e.registered && e.serving() {
			pending = append(pending, e)
		}
	}
	if len(pending) == 0 {
		return errors.Join(errs...)
	}
	conn, err := grpc.NewClient("unix://"+p.kubelet, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("connect to the kubelet at %s: %w", p.kubelet, err))...)
	}
	defer conn.Close()
	client := pluginapi.NewRegistrationClient(conn)
	for _, e := range pending {
		if err := p.register(ctx, client, e); err != nil {
			errs = append(errs, err)
			continue
		}
		e.registered, e.registeredAt = true, time.Now()
	}
	return errors.Join(errs...)
}

func (p *Plugin) register(ctx context.Context, client pluginapi.RegistrationClient, e *endpoint) error {
	ctx, cancel := context.WithTimeout(ctx, registerTimeout)
	defer cancel()
	req := &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(e.path),
		ResourceName: e.res.name,
		Options:      pluginOptions(),
	}
	if _, err := client.Register(ctx, req); err != nil {
		return fmt.Errorf("register %s with the kubelet at %s: %w", e.res.name, p.kubelet, err)
	}
	klog.FromContext(ctx).Info("Registered with the kubelet", "resource", e.res.name, "endpoint", req.Endpoint)
	return nil
}
