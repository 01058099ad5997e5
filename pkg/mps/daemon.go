// Package mps runs one NVIDIA MPS control daemon per group in use, so that
// the seats of a group hold their shares of its SMs and memory.
//
// The daemon is a host process the plugin starts (nvidia-cuda-mps-control
// -f, in its own session) and finds again after a restart by its control
// pipe, which lives in a host directory per group: a daemon that answers
// there is adopted, not started twice. NVIDIA's DRA driver runs each
// daemon as a Deployment instead; a pod per daemon needs the API server on
// the prepare path and a container image with the driver's tools, while a
// host process starts in milliseconds and needs neither. What a pod gives
// for free, surviving the plugin's own pod, the plugin gets by moving the
// daemon into a cgroup of its own (Options.Cgroup): the runtime kills what
// is left in a container's cgroup when it removes the container.
//
// Each daemon serves its group's GPUs (CUDA_VISIBLE_DEVICES, UUIDs), which
// are put in compute mode EXCLUSIVE_PROCESS while it runs, so that no
// process bypasses it, and set back to DEFAULT when it stops.
package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// The directories of one group's daemon, under Options.Root/<name>.
const (
	PipeDir = "pipe"
	LogDir  = "log"
	ShmDir  = "shm"
)

// gpusFile, in a daemon's directory, names its GPUs.
const gpusFile = "gpus"

// ContainerPipeDir is where containers find the daemon's pipe directory
// (CUDA_MPS_PIPE_DIRECTORY).
const ContainerPipeDir = "/tmp/nvidia-mps"

// Group is one group's daemon: its name (a directory name; the group's
// device name) and its GPUs' UUIDs in index order, which is the order the
// daemon and its clients enumerate them.
type Group struct {
	Name  string
	UUIDs []string
}

// Options configure a Manager.
type Options struct {
	// Root holds a directory per daemon; a host path, so that the
	// daemons' pipe and shm directories can be bind-mounted into
	// containers and found again after a restart.
	Root string
	// Control is the nvidia-cuda-mps-control command, with any prefix
	// that runs it (e.g. chroot into the driver root).
	Control []string
	// Env is added to the environment of the daemon and its control
	// client, after PATH and the MPS directories (so it may set PATH).
	Env []string
	// SetExclusive puts a GPU in compute mode EXCLUSIVE_PROCESS (true) or
	// DEFAULT (false).
	SetExclusive func(ctx context.Context, uuid string, exclusive bool) error
	// ShmTmpfs mounts a tmpfs of this many MiB as each daemon's shm
	// directory; 0 uses a plain directory.
	ShmTmpfsMiB int64
	// Cgroup, when set, is a cgroup v2 directory each daemon is moved
	// into, so that it outlives the plugin's container.
	Cgroup string
	// StartTimeout bounds the wait for a new daemon to answer (default 10s).
	StartTimeout time.Duration
}

// Manager starts, adopts, limits and stops the daemons.
type Manager struct {
	opts Options

	mu    sync.Mutex
	locks map[string]*sync.Mutex
	// applied are the limits last set on each daemon by this process.
	applied map[string]string
}

// NewManager checks the options.
func NewManager(opts Options) (*Manager, error) {
	if opts.Root == "" || len(opts.Control) == 0 || opts.SetExclusive == nil {
		return nil, errors.New("mps: Root, Control and SetExclusive are required")
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 10 * time.Second
	}
	if err := os.MkdirAll(opts.Root, 0o755); err != nil {
		return nil, fmt.Errorf("create the MPS directory: %w", err)
	}
	return &Manager{opts: opts, locks: map[string]*sync.Mutex{}, applied: map[string]string{}}, nil
}

// Dir is the host directory of a group's daemon; its pipe, log and shm
// directories are below it.
func (m *Manager) Dir(name string) string { return filepath.Join(m.opts.Root, name) }

func (m *Manager) lock(name string) func() {
	m.mu.Lock()
	l, ok := m.locks[name]
	if !ok {
		l = &sync.Mutex{}
		m.locks[name] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Want says what a group's daemon must do now: the largest share a claim
// holds on the group, and whether any does. The Manager asks it under the
// group's lock, so that a release that stops a daemon and a prepare that
// needs it never interleave.
type Want func() (limits Limits, inUse bool)

// Fixed wants the daemon running with limits.
func Fixed(limits Limits) Want { return func() (Limits, bool) { return limits, true } }

// Unused wants no daemon.
func Unused() Want { return func() (Limits, bool) { return Limits{}, false } }

// Ensure is for a prepare: it returns once the group's daemon answers with
// the limits wanted, adopting a daemon that answers and starting one that
// does not. A group no claim uses has its daemon stopped.
func (m *Manager) Ensure(ctx context.Context, g Group, want Want) error {
	defer m.lock(g.Name)()
	limits, inUse := want()
	if !inUse {
		return m.stop(ctx, g)
	}
	return m.ensure(ctx, g, limits)
}

// Settle is for a release: it stops the daemon of a group no claim uses
// any more and sets new limits on one whose largest share changed,
// without asking a daemon whose limits stand.
func (m *Manager) Settle(ctx context.Context, g Group, want Want) error {
	defer m.lock(g.Name)()
	limits, inUse := want()
	if !inUse {
		return m.stop(ctx, g)
	}
	if m.applied[g.Name] == limitsKey(limits) {
		return nil
	}
	return m.ensure(ctx, g, limits)
}

func limitsKey(l Limits) string {
	return fmt.Sprintf("%d %v", l.ActiveThreadPercentage, l.PinnedMemMiB)
}

func (m *Manager) ensure(ctx context.Context, g Group, limits Limits) error {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "mpsDaemon", g.Name)
	servers, err := m.servers(ctx, g.Name)
	if err != nil {
		if err := m.start(ctx, g); err != nil {
			return err
		}
		logger.Info("Started MPS control daemon", "gpus", g.UUIDs, "dir", m.Dir(g.Name))
		delete(m.applied, g.Name)
		servers = nil
	}
	// Servers that start later get the daemon's defaults, which are the
	// same limits.
	want := limitsKey(limits)
	if m.applied[g.Name] == want {
		return nil
	}
	if err := m.setLimits(ctx, g.Name, limits, servers); err != nil {
		return err
	}
	m.applied[g.Name] = want
	logger.V(2).Info("Set MPS limits", "activeThreadPercentage", limits.ActiveThreadPercentage, "pinnedMemLimit", limits.MemLimitEnv(), "servers", servers)
	return nil
}

// setLimits makes the daemon's defaults, and the limits of every server
// it runs, the given limits. A client's environment can only lower them.
func (m *Manager) setLimits(ctx context.Context, name string, l Limits, servers []int) error {
	cmds := []string{fmt.Sprintf("set_default_active_thread_percentage %d", l.ActiveThreadPercentage)}
	for i, mib := range l.PinnedMemMiB {
		cmds = append(cmds, fmt.Sprintf("set_default_device_pinned_mem_limit %d %dM", i, mib))
	}
	for _, pid := range servers {
		cmds = append(cmds, fmt.Sprintf("set_active_thread_percentage %d %d", pid, l.ActiveThreadPercentage))
		for i, mib := range l.PinnedMemMiB {
			cmds = append(cmds, fmt.Sprintf("set_device_pinned_mem_limit %d %d %dM", pid, i, mib))
		}
	}
	if _, err := m.control(ctx, name, cmds...); err != nil {
		return fmt.Errorf("set the limits of MPS daemon %s: %w", name, err)
	}
	return nil
}

// start starts a daemon for the group and waits until it answers. On
// failure the GPUs go back to compute mode DEFAULT and the error carries
// the end of the daemon's log.
func (m *Manager) start(ctx context.Context, g Group) (err error) {
	dir := m.Dir(g.Name)
	for _, d := range []string{PipeDir, LogDir} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
		}
	}
	if err := m.makeShm(ctx, filepath.Join(dir, ShmDir)); err != nil {
		return fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	// Its GPUs, for a stop by name alone: a later plugin whose plan lacks
	// the group must still set them back to DEFAULT.
	if err := os.WriteFile(filepath.Join(dir, gpusFile), []byte(strings.Join(g.UUIDs, "\n")), 0o644); err != nil {
		return fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	for i, uuid := range g.UUIDs {
		if err := m.opts.SetExclusive(ctx, uuid, true); err != nil {
			m.setDefault(ctx, g.UUIDs[:i])
			return fmt.Errorf("start MPS daemon %s: set GPU %s to EXCLUSIVE_PROCESS: %w", g.Name, uuid, err)
		}
	}
	defer func() {
		if err != nil {
			m.setDefault(ctx, g.UUIDs)
		}
	}()
	logFile, err := os.OpenFile(filepath.Join(dir, LogDir, "daemon.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	defer func() { _ = logFile.Close() }()
	// Not CommandContext: the daemon outlives this call and the plugin.
	cmd := exec.Command(m.opts.Control[0], append(m.opts.Control[1:], "-f")...) //nolint:gosec // the command is the operator's flag
	cmd.Env = m.env(g.Name, g.UUIDs)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if m.opts.Cgroup != "" {
		if err := moveToCgroup(m.opts.Cgroup, cmd.Process.Pid); err != nil {
			klog.FromContext(ctx).Error(err, "MPS daemon stays in the plugin's cgroup: it will stop with the plugin's container", "mpsDaemon", g.Name)
		}
	}
	deadline := time.Now().Add(m.opts.StartTimeout)
	for {
		if _, err := m.servers(ctx, g.Name); err == nil {
			return nil
		}
		select {
		case werr := <-exited:
			return fmt.Errorf("start MPS daemon %s: %s exited (%v): %s", g.Name, m.opts.Control[0], werr, m.logTail(g.Name))
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			return fmt.Errorf("start MPS daemon %s: %w", g.Name, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return fmt.Errorf("start MPS daemon %s: no answer on %s after %s: %s", g.Name, filepath.Join(dir, PipeDir), m.opts.StartTimeout, m.logTail(g.Name))
		}
	}
}

// stop quits the group's daemon, if one answers, and sets its GPUs back to
// compute mode DEFAULT. A group without a directory has no daemon.
func (m *Manager) stop(ctx context.Context, g Group) error {
	if _, err := os.Stat(m.Dir(g.Name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	delete(m.applied, g.Name)
	if len(g.UUIDs) == 0 {
		if data, err := os.ReadFile(filepath.Join(m.Dir(g.Name), gpusFile)); err == nil {
			g.UUIDs = strings.Fields(string(data))
		}
	}
	if _, err := m.servers(ctx, g.Name); err == nil {
		if _, err := m.control(ctx, g.Name, "quit"); err != nil {
			return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
		}
		deadline := time.Now().Add(m.opts.StartTimeout)
		for {
			if _, err := m.servers(ctx, g.Name); err != nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("stop MPS daemon %s: still answering %s after quit", g.Name, m.opts.StartTimeout)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	m.setDefault(ctx, g.UUIDs)
	m.removeShm(ctx, filepath.Join(m.Dir(g.Name), ShmDir))
	if err := os.RemoveAll(m.Dir(g.Name)); err != nil {
		return fmt.Errorf("stop MPS daemon %s: %w", g.Name, err)
	}
	klog.FromContext(ctx).Info("Stopped MPS control daemon", "mpsDaemon", g.Name)
	return nil
}

// Known lists the daemons that have a directory: running, or left by a
// plugin that stopped before it could clean up.
func (m *Manager) Known() ([]string, error) {
	entries, err := os.ReadDir(m.opts.Root)
	if err != nil {
		return nil, fmt.Errorf("list MPS daemons: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

func (m *Manager) setDefault(ctx context.Context, uuids []string) {
	for _, uuid := range uuids {
		if err := m.opts.SetExclusive(ctx, uuid, false); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot set GPU back to compute mode DEFAULT", "gpu", uuid)
		}
	}
}

// servers asks the daemon for its servers' PIDs; an error means no daemon
// answers.
func (m *Manager) servers(ctx context.Context, name string) ([]int, error) {
	out, err := m.control(ctx, name, "get_server_list")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("get_server_list answered %q", out)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// control runs the control client with the commands on its stdin.
func (m *Manager) control(ctx context.Context, name string, cmds ...string) (string, error) {
	if _, err := os.Stat(filepath.Join(m.Dir(name), PipeDir)); err != nil {
		return "", fmt.Errorf("no pipe directory: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.opts.Control[0], m.opts.Control[1:]...) //nolint:gosec // the command is the operator's flag
	cmd.Env = m.env(name, nil)
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w: %s", strings.Join(cmds, "; "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

func (m *Manager) env(name string, uuids []string) []string {
	dir := m.Dir(name)
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(dir, PipeDir),
		"CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(dir, LogDir),
	}
	if uuids != nil {
		env = append(env, "CUDA_VISIBLE_DEVICES="+strings.Join(uuids, ","))
	}
	// exec keeps the last value of a key given twice.
	return append(env, m.opts.Env...)
}

// logTail is the end of the daemon's output and control log, for errors.
func (m *Manager) logTail(name string) string {
	var tail []string
	for _, f := range []string{"daemon.out", "control.log"} {
		data, err := os.ReadFile(filepath.Join(m.Dir(name), LogDir, f))
		if err != nil || len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		tail = append(tail, f+": "+strings.Join(lines[max(0, len(lines)-3):], " | "))
	}
	if len(tail) == 0 {
		return "the daemon logged nothing"
	}
	return strings.Join(tail, "; ")
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
