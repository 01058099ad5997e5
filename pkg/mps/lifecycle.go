package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// A daemon is stopped by its record, never by what its pipe directory
// says: quit on its own socket (checked first), then SIGTERM to its PID
// once its start time shows it is still the same process, each followed
// by a bounded wait. A daemon still running after both is left as it is,
// GPUs in EXCLUSIVE_PROCESS and directory in place, and the stop fails:
// reporting it stopped would give its GPUs to processes that bypass it,
// and a daemon started beside it would serve the same GPUs twice. There
// is no SIGKILL: a daemon that ignores SIGTERM is stopped (SIGSTOP, by
// someone on the host; SIGCONT lets the pending SIGTERM end it) or stuck
// in the driver, where SIGKILL does not end it either, and a control
// daemon killed outright leaves its MPS servers, with their GPU contexts,
// behind. The watcher of the daemons (Revive) finishes such a stop once
// the process has gone.

// start starts a daemon for the group, records it, and waits until it
// answers. On failure the daemon is killed and, once it has ended, the
// GPUs go back to compute mode DEFAULT; the error carries the end of the
// daemon's log, and the record stays, without a PID, for the watcher to
// try again. The directories of an earlier daemon of the group are kept
// (containers may have them mounted); what that daemon left in its pipe
// directory goes.
func (d *daemon) start(ctx context.Context) (*record, error) {
	rec, err := d.launch(ctx)
	if err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", d.g.Name, err)
	}
	return rec, nil
}

// launch is start, its errors not yet saying which daemon.
func (d *daemon) launch(ctx context.Context) (*record, error) {
	dir, err := d.dir.make()
	if err != nil {
		return nil, err
	}
	defer func() { _ = dir.Close() }()
	if err := d.prepare(ctx, dir); err != nil {
		return nil, err
	}
	logFile, err := openLog(dir)
	if err != nil {
		d.giveBack(ctx, d.g.UUIDs)
		return nil, err
	}
	defer func() { _ = logFile.Close() }()
	opts := &d.m.opts
	// Not CommandContext: the daemon outlives this call and the plugin.
	cmd := exec.Command(opts.Control[0], append(opts.Control[1:], "-f")...) //nolint:gosec // the command is the operator's flag
	cmd.Env = d.ctl.env(d.g.UUIDs)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		d.giveBack(ctx, d.g.UUIDs)
		return nil, err
	}
	// The process is this one's child until it is waited for: its PID
	// cannot be reused before it is killed here, and its start time can
	// be read even if it has exited already.
	rec, err := newRecord(cmd.Process.Pid, opts.BootID)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	abort := func(err error) error {
		_ = cmd.Process.Kill()
		select {
		case werr := <-exited:
			d.ended(ctx)
			return fmt.Errorf("%w (the daemon was stopped: %v)", err, werr)
		case <-time.After(opts.StopTimeout):
			return fmt.Errorf("%w; killed, it still runs %s after: it is left as it is, its GPUs in EXCLUSIVE_PROCESS", err, opts.StopTimeout)
		}
	}
	if err == nil {
		err = d.dir.writeRecord(rec)
	}
	if err != nil {
		return nil, abort(err)
	}
	if opts.Cgroup != "" {
		if err := moveToCgroup(opts.Cgroup, cmd.Process.Pid); err != nil {
			klog.FromContext(ctx).Error(err, "MPS daemon stays in the plugin's cgroup: it will stop with the plugin's container", "mpsDaemon", d.g.Name)
		}
	}
	return d.await(ctx, rec, exited, abort, filepath.Join(dir.Name(), PipeDir))
}

// await waits until the daemon just started answers on its control
// socket in pipe, and records that socket. exited tells that the process
// ended; abort kills it and waits for its end.
func (d *daemon) await(ctx context.Context, rec *record, exited <-chan error, abort func(error) error, pipe string) (*record, error) {
	opts := &d.m.opts
	deadline := time.Now().Add(opts.StartTimeout)
	for {
		if sock, ok := d.ctl.answers(ctx); ok {
			// From now on only this socket is the daemon's.
			rec.Socket = sock
			if err := d.dir.writeRecord(rec); err != nil {
				return nil, abort(err)
			}
			return rec, nil
		}
		select {
		case werr := <-exited:
			d.ended(ctx)
			return nil, fmt.Errorf("%s exited (%v): %s", opts.Control[0], werr, d.dir.logTail())
		case <-ctx.Done():
			return nil, abort(ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, abort(fmt.Errorf("no answer on %s after %s: %s", pipe, opts.StartTimeout, d.dir.logTail()))
		}
	}
}

// prepare readies the daemon's directory, dir, and its GPUs for a start:
// whether the start changes their compute mode, and its GPUs, for a stop
// by name alone (a later plugin whose plan lacks the group must still set
// them back to DEFAULT) and for the groups that share them; then the
// record, with no PID yet; a clear pipe directory, the shm directory, and
// the GPUs in EXCLUSIVE_PROCESS unless the group keeps their mode.
func (d *daemon) prepare(ctx context.Context, dir *os.File) error {
	if err := d.markComputeMode(ctx, dir); err != nil {
		return err
	}
	if err := writeAt(dir, gpusFile, []byte(strings.Join(d.g.UUIDs, "\n")), 0o644); err != nil {
		return err
	}
	if err := d.dir.writeRecord(&record{}); err != nil {
		return err
	}
	if err := d.dir.clearPipe(dir); err != nil {
		return err
	}
	if err := d.makeShm(ctx, dir); err != nil {
		return err
	}
	for i, uuid := range d.g.UUIDs {
		if d.g.KeepComputeMode {
			break
		}
		if err := d.m.opts.SetExclusive(ctx, uuid, true); err != nil {
			d.giveBack(ctx, d.g.UUIDs[:i])
			return fmt.Errorf("set GPU %s to EXCLUSIVE_PROCESS: %w", uuid, err)
		}
	}
	return nil
}

// ended is a start that failed once its daemon has ended: the GPUs go
// back to DEFAULT, and the record, without a PID, says a daemon is still
// wanted.
func (d *daemon) ended(ctx context.Context) {
	if err := d.dir.writeRecord(&record{}); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot record the failed start of an MPS daemon", "mpsDaemon", d.g.Name)
	}
	d.giveBack(ctx, d.g.UUIDs)
}

// giveBack sets GPUs back to DEFAULT after a start that failed before its
// daemon ran, or once it has ended.
func (d *daemon) giveBack(ctx context.Context, uuids []string) {
	if err := d.setDefault(ctx, uuids); err != nil {
		klog.FromContext(ctx).Error(err, "MPS daemon did not start, and its GPUs stay in compute mode EXCLUSIVE_PROCESS", "mpsDaemon", d.g.Name)
	}
}

func moveToCgroup(dir string, pid int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create cgroup %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("move PID %d into cgroup %s: %w", pid, dir, err)
	}
	return nil
}

// stop ends the group's daemon and, once it is known to have ended, sets
// its GPUs back to compute mode DEFAULT (but those another group's daemon
// serves) and removes its directory (removeDirs) or only its record. A
// group without a directory has no daemon.
func (d *daemon) stop(ctx context.Context, removeDirs bool) error {
	if !d.dir.exists() {
		return nil
	}
	if err := d.end(ctx, removeDirs); err != nil {
		return fmt.Errorf("stop MPS daemon %s: %w", d.g.Name, err)
	}
	if !removeDirs {
		klog.FromContext(ctx).Info("Stopped MPS control daemon; its directories stay for the containers that mount them", "mpsDaemon", d.g.Name)
		return nil
	}
	klog.FromContext(ctx).Info("Stopped MPS control daemon", "mpsDaemon", d.g.Name)
	return nil
}

// end is stop, its errors not yet saying which daemon.
func (d *daemon) end(ctx context.Context, removeDirs bool) error {
	rec, err := d.dir.readRecord()
	switch {
	case err != nil:
		return err
	case rec.alive(d.m.opts.BootID):
		if err := d.terminate(ctx, rec, true); err != nil {
			return err
		}
	default:
		// A record of a daemon that ended, or none, does not tell that no
		// daemon runs there.
		if err := d.quitUnrecorded(ctx); err != nil {
			return err
		}
	}
	// The GPUs its daemon was started on.
	uuids := d.g.UUIDs
	if recorded := d.dir.gpus(); len(recorded) > 0 {
		uuids = recorded
	}
	if err := d.setDefault(ctx, uuids); err != nil {
		return err
	}
	if !removeDirs {
		return d.dir.removeRecord()
	}
	if err := d.dir.removeShm(); err != nil {
		return err
	}
	return d.dir.remove()
}

// terminate ends the recorded daemon: quit on its socket (tryQuit, when it
// may still answer), then SIGTERM. An error means it still runs.
func (d *daemon) terminate(ctx context.Context, rec *record, tryQuit bool) error {
	boot, wait := d.m.opts.BootID, d.m.opts.StopTimeout
	if tryQuit {
		if _, err := d.ctl.run(ctx, rec, "quit"); err != nil {
			klog.FromContext(ctx).V(2).Info("MPS control daemon did not take quit; signalling it", "mpsDaemon", d.g.Name, "pid", rec.PID, "reason", err.Error())
		} else if rec.waitGone(wait, boot) {
			return nil
		}
	}
	err := rec.signal(unix.SIGTERM, boot)
	switch {
	case errors.Is(err, errGone):
		return nil
	case err != nil:
		return fmt.Errorf("signal the MPS control daemon (PID %d): %w", rec.PID, err)
	}
	if rec.waitGone(wait, boot) {
		return nil
	}
	return fmt.Errorf("the MPS control daemon (PID %d) still runs %s after SIGTERM: it is left as it is, its GPUs in EXCLUSIVE_PROCESS, and stopped once it ends", rec.PID, wait)
}

// quitUnrecorded makes sure that no daemon runs in the group's pipe
// directory that no record names, before a daemon starts there or the
// group's stop is reported done: one a plugin started and died before it
// recorded, beside no record or the record of a daemon that ended. One
// that answers is asked to quit, and waited for until nothing listens
// there; one that listens and does not answer (stopped, or hung) cannot
// be stopped without its PID, and is an error.
func (d *daemon) quitUnrecorded(ctx context.Context) error {
	sock := filepath.Join(d.dir.path, PipeDir, ControlSocket)
	switch d.ctl.listener(ctx) {
	case absent:
		return nil
	case silent:
		return fmt.Errorf("an MPS control daemon that no record names listens on %s and does not answer: it is left as it is, and the GPUs it may serve with it", sock)
	}
	logger := klog.FromContext(ctx)
	logger.Info("An MPS control daemon that no record names answers: asking it to quit", "mpsDaemon", d.g.Name)
	if _, err := d.ctl.run(ctx, nil, "quit"); err != nil {
		logger.V(2).Info("MPS control daemon did not take quit", "mpsDaemon", d.g.Name, "reason", err.Error())
	}
	deadline := time.Now().Add(d.m.opts.StopTimeout)
	for d.ctl.listener(ctx) != absent {
		if time.Now().After(deadline) {
			return fmt.Errorf("an MPS control daemon that no record names still listens on %s %s after quit", sock, d.m.opts.StopTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
