package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
func (m *Manager) start(ctx context.Context, g Group) (*record, error) {
	dir, err := m.groupDir(g.Name)
	if err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	defer func() { _ = dir.Close() }()
	// Whether it changes their compute mode, and its GPUs, for a stop by
	// name alone (a later plugin whose plan lacks the group must still set
	// them back to DEFAULT) and for the groups that share them; then the
	// record, with no PID yet.
	if err := m.markComputeMode(ctx, g, dir); err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	if err := writeAt(dir, gpusFile, []byte(strings.Join(g.UUIDs, "\n")), 0o644); err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	if err := m.writeRecord(g.Name, &record{}); err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	if err := m.clearPipeDir(g.Name, dir); err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	if err := m.makeShm(ctx, dir); err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	for i, uuid := range g.UUIDs {
		if g.KeepComputeMode {
			break
		}
		if err := m.opts.SetExclusive(ctx, uuid, true); err != nil {
			m.giveBack(ctx, g.Name, g.UUIDs[:i])
			return nil, fmt.Errorf("start MPS daemon %s: set GPU %s to EXCLUSIVE_PROCESS: %w", g.Name, uuid, err)
		}
	}
	logFile, err := m.openLog(dir)
	if err != nil {
		m.giveBack(ctx, g.Name, g.UUIDs)
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	defer func() { _ = logFile.Close() }()
	// Not CommandContext: the daemon outlives this call and the plugin.
	cmd := exec.Command(m.opts.Control[0], append(m.opts.Control[1:], "-f")...) //nolint:gosec // the command is the operator's flag
	cmd.Env = m.env(g.Name, g.UUIDs)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		m.giveBack(ctx, g.Name, g.UUIDs)
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	// The process is this one's child until it is waited for: its PID
	// cannot be reused before it is killed here, and its start time can
	// be read even if it has exited already.
	rec, err := newRecord(cmd.Process.Pid, m.opts.BootID)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	abort := func(err error) error {
		_ = cmd.Process.Kill()
		select {
		case werr := <-exited:
			m.ended(ctx, g)
			return fmt.Errorf("start MPS daemon %s: %w (the daemon was stopped: %v)", g.Name, err, werr)
		case <-time.After(m.opts.StopTimeout):
			return fmt.Errorf("start MPS daemon %s: %w; killed, it still runs %s after: it is left as it is, its GPUs in EXCLUSIVE_PROCESS", g.Name, err, m.opts.StopTimeout)
		}
	}
	if err == nil {
		err = m.writeRecord(g.Name, rec)
	}
	if err != nil {
		return nil, abort(err)
	}
	if m.opts.Cgroup != "" {
		if err := moveToCgroup(m.opts.Cgroup, cmd.Process.Pid); err != nil {
			klog.FromContext(ctx).Error(err, "MPS daemon stays in the plugin's cgroup: it will stop with the plugin's container", "mpsDaemon", g.Name)
		}
	}
	deadline := time.Now().Add(m.opts.StartTimeout)
	for {
		if sock, ok := m.answers(ctx, g.Name); ok {
			// From now on only this socket is the daemon's.
			rec.Socket = sock
			if err := m.writeRecord(g.Name, rec); err != nil {
				return nil, abort(err)
			}
			return rec, nil
		}
		select {
		case werr := <-exited:
			m.ended(ctx, g)
			return nil, fmt.Errorf("start MPS daemon %s: %s exited (%v): %s", g.Name, m.opts.Control[0], werr, m.logTail(g.Name))
		case <-ctx.Done():
			return nil, abort(ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, abort(fmt.Errorf("no answer on %s after %s: %s", filepath.Join(dir.Name(), PipeDir), m.opts.StartTimeout, m.logTail(g.Name)))
		}
	}
}

// ended is a start that failed once its daemon has ended: the GPUs go
// back to DEFAULT, and the record, without a PID, says a daemon is still
// wanted.
func (m *Manager) ended(ctx context.Context, g Group) {
	if err := m.writeRecord(g.Name, &record{}); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot record the failed start of an MPS daemon", "mpsDaemon", g.Name)
	}
	m.giveBack(ctx, g.Name, g.UUIDs)
}

// giveBack sets GPUs back to DEFAULT after a start that failed before its
// daemon ran, or once it has ended.
func (m *Manager) giveBack(ctx context.Context, name string, uuids []string) {
	if err := m.setDefault(ctx, name, uuids); err != nil {
		klog.FromContext(ctx).Error(err, "MPS daemon did not start, and its GPUs stay in compute mode EXCLUSIVE_PROCESS", "mpsDaemon", name)
	}
}

// openLog opens the daemon's output file, in its log directory.
func (m *Manager) openLog(dir *os.File) (*os.File, error) {
	logDir, err := openDir(dir, LogDir)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logDir.Close() }()
	return openAt(logDir, "daemon.out", unix.O_CREAT|unix.O_WRONLY|unix.O_APPEND, 0o644)
}

// answers asks a daemon just started whether it answers, and returns the
// socket it answered on: the same socket before and after the answer.
func (m *Manager) answers(ctx context.Context, name string) (*socketID, bool) {
	before, err := m.checkSocket(name, nil)
	if err != nil {
		return nil, false
	}
	if _, err := m.servers(ctx, name, nil); err != nil {
		return nil, false
	}
	after, err := m.checkSocket(name, nil)
	if err != nil || *socketIDOf(after) != *socketIDOf(before) {
		return nil, false
	}
	return socketIDOf(after), true
}

// stop ends the group's daemon and, once it is known to have ended, sets
// its GPUs back to compute mode DEFAULT (but those another group's daemon
// serves) and removes its directory (removeDirs) or only its record. A
// group without a directory has no daemon.
func (m *Manager) stop(ctx context.Context, g Group, removeDirs bool) error {
	if !m.dirExists(g.Name) {
		return nil
	}
	// The GPUs its daemon was started on.
	if uuids := m.recordedGPUs(g.Name); len(uuids) > 0 {
		g.UUIDs = uuids
	}
	rec, err := m.readRecord(g.Name)
	switch {
	case err != nil:
		return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
	case rec.alive(m.opts.BootID):
		if err := m.terminate(ctx, g.Name, rec, true); err != nil {
			return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
		}
	default:
		// A record of a daemon that ended, or none, does not tell that no
		// daemon runs there.
		if err := m.quitUnrecorded(ctx, g.Name); err != nil {
			return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
		}
	}
	if err := m.setDefault(ctx, g.Name, g.UUIDs); err != nil {
		return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
	}
	logger := klog.FromContext(ctx)
	if !removeDirs {
		if err := m.removeRecord(g.Name); err != nil {
			return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
		}
		logger.Info("Stopped MPS control daemon; its directories stay for the containers that mount them", "mpsDaemon", g.Name)
		return nil
	}
	if err := m.removeShm(g.Name); err != nil {
		return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
	}
	if err := m.root.RemoveAll(g.Name); err != nil {
		return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
	}
	logger.Info("Stopped MPS control daemon", "mpsDaemon", g.Name)
	return nil
}

// terminate ends the recorded daemon: quit on its socket (tryQuit, when it
// may still answer), then SIGTERM. An error means it still runs.
func (m *Manager) terminate(ctx context.Context, name string, rec *record, tryQuit bool) error {
	logger := klog.FromContext(ctx)
	if tryQuit {
		if _, err := m.control(ctx, name, rec, "quit"); err != nil {
			logger.V(2).Info("MPS control daemon did not take quit; signalling it", "mpsDaemon", name, "pid", rec.PID, "reason", err.Error())
		} else if rec.waitGone(m.opts.StopTimeout, m.opts.BootID) {
			return nil
		}
	}
	err := rec.signal(unix.SIGTERM, m.opts.BootID)
	switch {
	case errors.Is(err, errGone):
		return nil
	case err != nil:
		return fmt.Errorf("signal the MPS control daemon (PID %d): %w", rec.PID, err)
	}
	if rec.waitGone(m.opts.StopTimeout, m.opts.BootID) {
		return nil
	}
	return fmt.Errorf("the MPS control daemon (PID %d) still runs %s after SIGTERM: it is left as it is, its GPUs in EXCLUSIVE_PROCESS, and stopped once it ends", rec.PID, m.opts.StopTimeout)
}

// quitUnrecorded makes sure that no daemon runs in the group's pipe
// directory that no record names, before a daemon starts there or the
// group's stop is reported done: one a plugin started and died before it
// recorded, beside no record or the record of a daemon that ended. One
// that answers is asked to quit, and waited for until nothing listens
// there; one that listens and does not answer (stopped, or hung) cannot
// be stopped without its PID, and is an error.
func (m *Manager) quitUnrecorded(ctx context.Context, name string) error {
	sock := filepath.Join(m.Dir(name), PipeDir, ControlSocket)
	switch m.listener(ctx, name) {
	case absent:
		return nil
	case silent:
		return fmt.Errorf("an MPS control daemon that no record names listens on %s and does not answer: it is left as it is, and the GPUs it may serve with it", sock)
	}
	logger := klog.FromContext(ctx)
	logger.Info("An MPS control daemon that no record names answers: asking it to quit", "mpsDaemon", name)
	if _, err := m.control(ctx, name, nil, "quit"); err != nil {
		logger.V(2).Info("MPS control daemon did not take quit", "mpsDaemon", name, "reason", err.Error())
	}
	deadline := time.Now().Add(m.opts.StopTimeout)
	for m.listener(ctx, name) != absent {
		if time.Now().After(deadline) {
			return fmt.Errorf("an MPS control daemon that no record names still listens on %s %s after quit", sock, m.opts.StopTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}
