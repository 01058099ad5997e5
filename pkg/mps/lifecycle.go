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
// answers. On failure the GPUs go back to compute mode DEFAULT and the
// error carries the end of the daemon's log. The directories of an
// earlier daemon of the group are kept (containers may have them
// mounted); what that daemon left in its pipe directory goes.
func (m *Manager) start(ctx context.Context, g Group) (_ *record, err error) {
	dir, err := m.groupDir(g.Name)
	if err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	defer func() { _ = dir.Close() }()
	if err := clearPipeDir(dir); err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	if err := m.makeShm(ctx, dir); err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	// Its GPUs, for a stop by name alone: a later plugin whose plan lacks
	// the group must still set them back to DEFAULT.
	if err := writeNoFollow(filepath.Join(dir.Name(), gpusFile), []byte(strings.Join(g.UUIDs, "\n"))); err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	for i, uuid := range g.UUIDs {
		if err := m.opts.SetExclusive(ctx, uuid, true); err != nil {
			m.setDefault(ctx, g.UUIDs[:i])
			return nil, fmt.Errorf("start MPS daemon %s: set GPU %s to EXCLUSIVE_PROCESS: %w", g.Name, uuid, err)
		}
	}
	defer func() {
		if err != nil {
			m.setDefault(ctx, g.UUIDs)
		}
	}()
	logFile, err := os.OpenFile(filepath.Join(dir.Name(), LogDir, "daemon.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	defer func() { _ = logFile.Close() }()
	// Not CommandContext: the daemon outlives this call and the plugin.
	cmd := exec.Command(m.opts.Control[0], append(m.opts.Control[1:], "-f")...) //nolint:gosec // the command is the operator's flag
	cmd.Env = m.env(g.Name, g.UUIDs)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The process is this one's child until it is waited for, so its PID
	// cannot be reused before it is killed here.
	kill := func() {
		_ = cmd.Process.Kill()
		_ = m.removeRecord(g.Name)
	}
	rec, err := newRecord(cmd.Process.Pid)
	if err == nil {
		err = m.writeRecord(g.Name, rec)
	}
	if err != nil {
		kill()
		return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
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
				kill()
				return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
			}
			return rec, nil
		}
		select {
		case werr := <-exited:
			_ = m.removeRecord(g.Name)
			return nil, fmt.Errorf("start MPS daemon %s: %s exited (%v): %s", g.Name, m.opts.Control[0], werr, m.logTail(g.Name))
		case <-ctx.Done():
			kill()
			return nil, fmt.Errorf("start MPS daemon %s: %w", g.Name, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			kill()
			return nil, fmt.Errorf("start MPS daemon %s: no answer on %s after %s: %s", g.Name, filepath.Join(dir.Name(), PipeDir), m.opts.StartTimeout, m.logTail(g.Name))
		}
	}
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
// its GPUs back to compute mode DEFAULT and removes its directory
// (removeDirs) or only its record. A group without a directory has no
// daemon.
func (m *Manager) stop(ctx context.Context, g Group, removeDirs bool) error {
	if !m.dirExists(g.Name) {
		return nil
	}
	m.setApplied(g.Name, "")
	if len(g.UUIDs) == 0 {
		if data, err := readNoFollow(filepath.Join(m.Dir(g.Name), gpusFile)); err == nil {
			g.UUIDs = strings.Fields(string(data))
		}
	}
	rec, err := m.readRecord(g.Name)
	switch {
	case err != nil:
		return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
	case rec.alive():
		if err := m.terminate(ctx, g.Name, rec, true); err != nil {
			return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
		}
	case rec == nil:
		if err := m.quitUnrecorded(ctx, g.Name); err != nil {
			return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
		}
	}
	m.setDefault(ctx, g.UUIDs)
	logger := klog.FromContext(ctx)
	if !removeDirs {
		if err := m.removeRecord(g.Name); err != nil {
			return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
		}
		logger.Info("Stopped MPS control daemon; its directories stay for the containers that mount them", "mpsDaemon", g.Name)
		return nil
	}
	m.removeShm(ctx, filepath.Join(m.Dir(g.Name), ShmDir))
	if err := os.RemoveAll(m.Dir(g.Name)); err != nil {
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
		} else if rec.waitGone(m.opts.StopTimeout) {
			return nil
		}
	}
	err := rec.signal(unix.SIGTERM)
	switch {
	case errors.Is(err, errGone):
		return nil
	case err != nil:
		return fmt.Errorf("signal the MPS control daemon (PID %d): %w", rec.PID, err)
	}
	if rec.waitGone(m.opts.StopTimeout) {
		return nil
	}
	return fmt.Errorf("the MPS control daemon (PID %d) still runs %s after SIGTERM: it is left as it is, its GPUs in EXCLUSIVE_PROCESS, and stopped once it ends", rec.PID, m.opts.StopTimeout)
}

// quitUnrecorded asks a daemon that answers in a group's pipe directory
// without a record (started by a plugin that kept none) to quit, and
// waits until nothing answers there: its PID is not known, so nothing
// else can be done to it.
func (m *Manager) quitUnrecorded(ctx context.Context, name string) error {
	if _, err := m.servers(ctx, name, nil); err != nil {
		return nil // nothing answers
	}
	klog.FromContext(ctx).Info("An MPS control daemon without a record answers: asking it to quit", "mpsDaemon", name)
	if _, err := m.control(ctx, name, nil, "quit"); err != nil {
		klog.FromContext(ctx).V(2).Info("MPS control daemon did not take quit", "mpsDaemon", name, "reason", err.Error())
	}
	deadline := time.Now().Add(m.opts.StopTimeout)
	for {
		if _, err := m.servers(ctx, name, nil); err != nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("an MPS control daemon without a record still answers on %s %s after quit", filepath.Join(m.Dir(name), PipeDir), m.opts.StopTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// writeNoFollow writes a regular file, refusing a link in its place.
func writeNoFollow(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
