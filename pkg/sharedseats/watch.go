package sharedseats

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/groupshare"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
)

// The watcher of the MPS daemons. A daemon that ends while its group is in
// use leaves its clients without MPS until the next prepare of the group,
// which may never come; daemons a restarted plugin adopted are not its
// children, so their end cannot be waited for. Every WatchInterval, and at
// every change of the GPUs' health, the watcher reads each recorded
// daemon's PID and start time from /proc (no daemon is asked anything):
// a daemon of a group in use that ended, or whose last start failed, is
// started again, with the limits wanted, counted
// (kyb_mps_daemon_restarts_total) and reported (a Warning event on the
// node) once it answers; a daemon of a group no claim holds any more,
// whose stop could not be confirmed at its release, is stopped now. What
// keeps failing (a start the driver refuses, a daemon that will not end)
// is tried again at every check but logged at most once a
// failureLogInterval, with how many attempts failed.

// failureLogInterval is how often the watcher logs a group whose daemon
// it keeps failing to settle.
const failureLogInterval = time.Minute

// watchFailure is a group whose daemon the watcher failed to settle, at
// each of its last attempts.
type watchFailure struct {
	attempts int
	// logged is when a failure was last logged; unlogged are the
	// failures since.
	logged   time.Time
	unlogged int
}

// Run keeps the MPS daemons of groups in use running, until ctx ends. A group one of whose GPUs is lost has its daemon halted (its
// clients went with the GPU, and a daemon on a lost GPU answers nothing
// useful), its directories kept for the containers that mount them, and
// started again there when the GPU comes back while the group is in use.
func (s *MPS) Run(ctx context.Context, view health.View, changed <-chan struct{}) {
	if s.mps == nil {
		return
	}
	tick := time.NewTicker(s.opts.WatchInterval)
	defer tick.Stop()
	for {
		s.checkHealth(ctx, view.Faults())
		s.checkDaemons(ctx)
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
		}
	}
}

func (s *MPS) checkHealth(ctx context.Context, faults map[int]health.Fault) {
	logger := klog.FromContext(ctx)
	for _, g := range s.opts.Node.Plan.Groups() {
		if !groupshare.UsesMPS(g) {
			continue
		}
		lost := slices.ContainsFunc(g.GPUs, func(x int) bool { f, ok := faults[x]; return ok && f.Kind == health.KindLost })
		name := g.DeviceName()
		switch wasDown := s.isDown(name); {
		case lost && !wasDown:
			s.setDown(name, true)
			if err := s.mps.Halt(ctx, s.hw.MPSGroup(g)); err != nil {
				logger.Error(err, "Cannot stop the MPS daemon of a group with a lost GPU", "mpsDaemon", name)
			} else {
				logger.Info("Stopped the MPS daemon of a group with a lost GPU", "mpsDaemon", name)
			}
		case !lost && wasDown:
			s.setDown(name, false)
			if err := s.mps.Ensure(ctx, s.hw.MPSGroup(g), s.want(ctx, g)); err != nil {
				logger.Error(err, "Cannot start the MPS daemon again after its GPU came back", "mpsDaemon", name)
			}
		}
	}
}

func (s *MPS) setDown(name string, down bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if down {
		s.down[name] = true
	} else {
		delete(s.down, name)
	}
}

// checkDaemons starts again the daemons of groups in use that ended, and
// stops those of groups no claim holds.
func (s *MPS) checkDaemons(ctx context.Context) {
	logger := klog.FromContext(ctx)
	u, known := s.opts.Usage.Last()
	if !known {
		return
	}
	names := u.InUse()
	dirs, err := s.mps.Known()
	if err != nil {
		logger.Error(err, "Cannot list MPS daemons")
	}
	names = append(names, dirs...)
	slices.Sort(names)
	for _, name := range slices.Compact(names) {
		g := s.opts.Node.Group(name)
		switch {
		case !groupshare.UsesMPS(g):
			err = s.retire(ctx, name, g)
		case s.isDown(name):
			continue
		default:
			var restarted bool
			restarted, err = s.mps.Revive(ctx, s.hw.MPSGroup(g), s.want(ctx, g))
			if restarted {
				s.restarts.WithLabelValues(name).Inc()
				s.opts.Events.Warning(ctx, nodeevents.ReasonMPSDaemonRestarted,
					fmt.Sprintf("the MPS control daemon of group %s (GPUs %s) ended while claims hold the group; it was started again, and clients that were connected to it must start again", g.Name, gpuListOf(g.GPUs)))
			}
		}
		s.report(ctx, name, err)
	}
}

// report logs what the watcher could not do to a group's daemon: the
// first failure at once, then at most one each failureLogInterval while
// the group keeps failing, and, once it no longer does, after how many
// attempts. Only the watcher's goroutine calls it.
func (s *MPS) report(ctx context.Context, name string, err error) {
	logger := klog.FromContext(ctx)
	f := s.failing[name]
	if err == nil {
		if f != nil {
			logger.Info("MPS daemon settled after failed attempts", "mpsDaemon", name, "failedAttempts", f.attempts)
			delete(s.failing, name)
		}
		return
	}
	if f == nil {
		f = &watchFailure{}
		s.failing[name] = f
	}
	f.attempts++
	now := time.Now()
	if f.attempts > 1 && now.Sub(f.logged) < failureLogInterval {
		f.unlogged++
		return
	}
	logger.Error(err, "Cannot settle MPS daemon", "mpsDaemon", name, "failedAttempts", f.attempts, "unloggedFailures", f.unlogged)
	f.logged, f.unlogged = now, 0
}

func gpuListOf(gpus []int) string {
	out := ""
	for i, x := range gpus {
		if i > 0 {
			out += ","
		}
		out += fmt.Sprint(x)
	}
	return out
}
