package mps

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"
)

// A daemon is what one verb of the Manager does to one group's daemon,
// under the group's locks: the Manager keeps the verbs, the options, the
// root and the locks; a daemon carries its group's directory and record
// (groupDir), the control client that talks to it (controlClient), and
// its start and stop (lifecycle.go). It is made for each verb and holds
// nothing between them: what lasts is on disk, so that a restarted plugin
// finds it.
type daemon struct {
	m   *Manager
	g   Group
	dir groupDir
	ctl controlClient
}

// daemon is the group's daemon, for a verb that holds its locks.
func (m *Manager) daemon(g Group) *daemon {
	dir := m.dirOf(g.Name)
	return &daemon{m: m, g: g, dir: dir, ctl: controlClient{dir: dir, opts: &m.opts}}
}

// runsWith tells whether the recorded daemon runs and holds limits.
func (d *daemon) runsWith(limits Limits) bool {
	rec, err := d.dir.readRecord()
	return err == nil && rec.alive(d.m.opts.BootID) && rec.limited(limits)
}

// ensure makes the group's recorded daemon answer with limits: adopted
// when it answers on its own socket; stopped by its PID and started anew
// when it runs but does not; started when it ended or never ran, once
// no daemon without a record runs in its pipe directory and no other
// group's daemon serves its GPUs.
func (d *daemon) ensure(ctx context.Context, limits Limits) error {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "mpsDaemon", d.g.Name)
	rec, err := d.dir.readRecord()
	if err != nil {
		return err
	}
	if rec.alive(d.m.opts.BootID) {
		servers, err := d.ctl.servers(ctx, rec)
		if err == nil {
			return d.limit(ctx, rec, limits, servers)
		}
		// Its socket gone or replaced, or the daemon hung: its clients
		// cannot join, and a second daemon beside it would serve the
		// same GPUs. It is stopped, and only then started anew.
		logger.Info("MPS control daemon runs but does not answer on its control socket: stopping it to start it anew", "pid", rec.PID, "reason", err.Error())
		if terr := d.terminate(ctx, rec, false); terr != nil {
			return fmt.Errorf("MPS daemon %s does not answer on its control socket (%v), and %w", d.g.Name, err, terr)
		}
	} else if err := d.quitUnrecorded(ctx); err != nil {
		return fmt.Errorf("start MPS daemon %s: %w", d.g.Name, err)
	}
	if err := d.checkFree(ctx); err != nil {
		return err
	}
	if rec, err = d.start(ctx); err != nil {
		return err
	}
	logger.Info("Started MPS control daemon", "gpus", d.g.UUIDs, "dir", d.dir.path, "pid", rec.PID)
	return d.limit(ctx, rec, limits, nil)
}

// revive is Revive for a group in use.
func (d *daemon) revive(ctx context.Context, limits Limits) (restarted bool, err error) {
	rec, err := d.dir.readRecord()
	switch {
	case err != nil || rec == nil:
		return false, err
	case rec.alive(d.m.opts.BootID) && rec.limited(limits):
		return false, nil
	case rec.alive(d.m.opts.BootID):
		// A change of share the watcher saw first.
		return false, d.ensure(ctx, limits)
	case rec.PID == 0:
		klog.FromContext(ctx).V(2).Info("No MPS control daemon runs for a group in use (its last start failed): starting it", "mpsDaemon", d.g.Name)
	default:
		klog.FromContext(ctx).Info("MPS control daemon ended while its group is in use: starting it again", "mpsDaemon", d.g.Name, "pid", rec.PID)
	}
	if err := d.ensure(ctx, limits); err != nil {
		return false, err
	}
	return true, nil
}

// retire is Retire for a group a claim still holds: a daemon that runs
// stays; one that ended is stopped for good, its directories kept.
func (d *daemon) retire(ctx context.Context) error {
	if rec, err := d.dir.readRecord(); err != nil || rec == nil || rec.alive(d.m.opts.BootID) {
		return err
	}
	return d.stop(ctx, false)
}

// limit sets the limits wanted where the record says they are not set
// yet, and records them. Servers that start later get the daemon's
// defaults, which are the same limits.
func (d *daemon) limit(ctx context.Context, rec *record, limits Limits, servers []int) error {
	if rec.limited(limits) {
		return nil
	}
	if err := d.ctl.setLimits(ctx, rec, limits, servers); err != nil {
		return err
	}
	rec.Limits = &limits
	if err := d.dir.writeRecord(rec); err != nil {
		return fmt.Errorf("MPS daemon %s: %w", d.g.Name, err)
	}
	klog.FromContext(ctx).V(2).Info("Set MPS limits", "mpsDaemon", d.g.Name, "activeThreadPercentage", limits.ActiveThreadPercentage, "pinnedMemLimit", limits.MemLimitEnv(), "servers", servers)
	return nil
}
