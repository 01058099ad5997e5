// Package mps runs one NVIDIA MPS control daemon per group in use, so that
// the seats of a group hold their shares of its SMs and memory.
//
// The daemon is a host process the plugin starts (nvidia-cuda-mps-control
// -f, in its own session) and finds again after a restart by its record:
// its PID and start time, in the group's directory, which no container
// can write. A recorded daemon that still runs is adopted, not started
// twice; one that runs but does not answer on its own control socket is
// stopped by its PID before another starts; one that ended is started
// again. NVIDIA's DRA driver runs each daemon as a Deployment instead; a
// pod per daemon needs the API server on the prepare path and a container
// image with the driver's tools, while a host process starts in
// milliseconds and needs neither. What a pod gives for free, surviving
// the plugin's own pod, the plugin gets by moving the daemon into a cgroup
// of its own (Options.Cgroup): the runtime kills what is left in a
// container's cgroup when it removes the container.
//
// Each daemon serves its group's GPUs (CUDA_VISIBLE_DEVICES, UUIDs), which
// are put in compute mode EXCLUSIVE_PROCESS while it runs, so that no
// process bypasses it, and set back to DEFAULT only once it is known to
// have ended; a group that keeps the compute mode (Group.KeepComputeMode)
// has its daemon started and stopped with the mode left as it is, which
// MPS works in too, and lets processes that do not join the daemon share
// the GPUs beside it. A GPU takes one daemon: groups that share a GPU
// never run daemons at once, even while one's stop is pending (overlap.go).
//
// Containers get the daemon's pipe directory (read-only by default) and
// its shm directory (a tmpfs of the group's own, shm.go). Nothing the plugin reads or runs depends on what a
// container can write: the daemon is found by its record, stopped by its
// PID, and its control socket is checked (type, owner, identity) before
// the control client is run against it.
package mps

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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
	// KeepComputeMode starts the daemon without putting its GPUs in
	// compute mode EXCLUSIVE_PROCESS. What a daemon's start did is
	// recorded in its directory, and its stop undoes that, whatever the
	// caller of the stop says.
	KeepComputeMode bool
}

// Options configure a Manager.
type Options struct {
	// Root holds a directory per daemon; a host path, so that the
	// daemons' pipe and shm directories can be bind-mounted into
	// containers and found again after a restart. Only the plugin's user
	// may write in it.
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
	// ShmTmpfsMiB is the size of the tmpfs mounted as each daemon's shm
	// directory, which the group's clients share as their /dev/shm
	// (DefaultShmTmpfsMiB is the commands' default; see shm.go). 0 is
	// refused unless ShmUnbounded says so.
	ShmTmpfsMiB int64
	// ShmUnbounded makes each daemon's shm directory a plain directory on
	// the MPS root's filesystem instead, which the group's tenants may
	// fill. Only with ShmTmpfsMiB 0.
	ShmUnbounded bool
	// Cgroup, when set, is a cgroup v2 directory each daemon is moved
	// into, so that it outlives the plugin's container.
	Cgroup string
	// ClientPipeWritable mounts the pipe directory read-write into
	// containers instead of read-only. Clients connect to the daemon's
	// sockets, which a read-only mount allows; a writable one lets a
	// container's root remove or replace them.
	ClientPipeWritable bool
	// StartTimeout bounds the wait for a new daemon to answer (default 10s).
	StartTimeout time.Duration
	// ControlTimeout bounds one run of the control client (default 5s).
	ControlTimeout time.Duration
	// StopTimeout bounds each wait for a daemon to end: after quit, and
	// after SIGTERM (default 5s each).
	StopTimeout time.Duration
	// BootID is the node's boot (package bootid), recorded with each
	// daemon's PID: a record of another boot names no live process. Empty:
	// a record is judged by its PID and start time alone.
	BootID string
}

// Manager starts, adopts, limits and stops the daemons.
type Manager struct {
	opts Options
	// root is Options.Root as it was opened and checked; dir is the same
	// directory, for the *at system calls.
	root *os.Root
	dir  *os.File

	// mu guards locks: the mutexes of the groups' and GPUs' locks
	// (lock.go), so that what is done to one daemon is serialised while
	// other groups' go on at once.
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// NewManager checks the options.
func NewManager(opts Options) (*Manager, error) {
	if opts.Root == "" || len(opts.Control) == 0 || opts.SetExclusive == nil {
		return nil, errors.New("mps: Root, Control and SetExclusive are required")
	}
	if err := checkShmOptions(opts); err != nil {
		return nil, err
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&opts.StartTimeout, 10 * time.Second}, {&opts.ControlTimeout, 5 * time.Second}, {&opts.StopTimeout, 5 * time.Second}} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	st, err := checkRoot(opts.Root)
	if err != nil {
		return nil, err
	}
	root, dir, err := openRoot(opts.Root, st)
	if err != nil {
		return nil, err
	}
	return &Manager{opts: opts, root: root, dir: dir, locks: map[string]*sync.Mutex{}}, nil
}

// Dir is the host directory of a group's daemon; its pipe, log and shm
// directories are below it.
func (m *Manager) Dir(name string) string { return filepath.Join(m.opts.Root, name) }

// Has tells whether the group has a daemon directory: a daemon running,
// or one whose stop is not finished, or kept for the containers of a
// group whose GPU was lost.
func (m *Manager) Has(name string) bool { return m.dirExists(name) }

// ClientPipeWritable says whether containers get the pipe directory
// read-write (Options.ClientPipeWritable).
func (m *Manager) ClientPipeWritable() bool { return m.opts.ClientPipeWritable }

// Want says what a group's daemon must do now: the largest share a claim
// holds on the group, and whether any does; an error leaves the daemon as
// it is. The Manager asks it under the group's lock, so that a release
// that stops a daemon and a prepare that needs it never interleave.
type Want func() (limits Limits, inUse bool, err error)

// Fixed wants the daemon running with limits.
func Fixed(limits Limits) Want { return func() (Limits, bool, error) { return limits, true, nil } }

// Unused wants no daemon.
func Unused() Want { return func() (Limits, bool, error) { return Limits{}, false, nil } }

// Ensure is for a prepare: it returns once the group's daemon answers with
// the limits wanted, adopting a daemon that answers and starting one that
// does not. A group no claim uses has its daemon stopped.
func (m *Manager) Ensure(ctx context.Context, g Group, want Want) error {
	unlock, err := m.lock(g)
	if err != nil {
		return err
	}
	defer unlock()
	limits, inUse, err := want()
	switch {
	case err != nil:
		return fmt.Errorf("MPS daemon %s: %w", g.Name, err)
	case !inUse:
		return m.stop(ctx, g, true)
	}
	return m.ensure(ctx, g, limits)
}

// Settle is for a release: it stops the daemon of a group no claim uses
// any more and sets new limits on one whose largest share changed,
// without asking a daemon whose limits stand. A recorded daemon that
// ended is started again.
func (m *Manager) Settle(ctx context.Context, g Group, want Want) error {
	unlock, err := m.lock(g)
	if err != nil {
		return err
	}
	defer unlock()
	limits, inUse, err := want()
	switch {
	case err != nil:
		return fmt.Errorf("MPS daemon %s: %w", g.Name, err)
	case !inUse:
		return m.stop(ctx, g, true)
	}
	if rec, err := m.readRecord(g.Name); err == nil && rec.alive(m.opts.BootID) && rec.limited(limits) {
		return nil
	}
	return m.ensure(ctx, g, limits)
}

// Revive is for a watcher of the daemons: it starts again the daemon of a
// group in use whose recorded daemon ended, or whose last start failed
// (restarted: true once one answers), and stops the daemon of a group no
// claim uses (finishing a stop that could not be confirmed before). A
// daemon that runs is asked nothing unless its limits changed, and a
// group without a record (never started here, or halted) is left alone.
func (m *Manager) Revive(ctx context.Context, g Group, want Want) (restarted bool, err error) {
	unlock, err := m.lock(g)
	if err != nil {
		return false, err
	}
	defer unlock()
	limits, inUse, err := want()
	switch {
	case err != nil:
		return false, fmt.Errorf("MPS daemon %s: %w", g.Name, err)
	case !inUse:
		return false, m.stop(ctx, g, true)
	}
	rec, err := m.readRecord(g.Name)
	switch {
	case err != nil || rec == nil:
		return false, err
	case rec.alive(m.opts.BootID) && rec.limited(limits):
		return false, nil
	case rec.alive(m.opts.BootID):
		// A change of share the watcher saw first.
		return false, m.ensure(ctx, g, limits)
	case rec.PID == 0:
		klog.FromContext(ctx).V(2).Info("No MPS control daemon runs for a group in use (its last start failed): starting it", "mpsDaemon", g.Name)
	default:
		klog.FromContext(ctx).Info("MPS control daemon ended while its group is in use: starting it again", "mpsDaemon", g.Name, "pid", rec.PID)
	}
	if err := m.ensure(ctx, g, limits); err != nil {
		return false, err
	}
	return true, nil
}

// Retire is for a group that no longer uses MPS (its profile changed, or
// the plan lacks it): its daemon stays as it is while held says a claim
// holds the group, whose containers still use it, and is stopped after.
// Such a daemon that ends is not started again (the group's share under
// today's plan is not the one its claims were given); its GPUs go back to
// DEFAULT, and its directories stay until the group is free.
func (m *Manager) Retire(ctx context.Context, g Group, held func() (bool, error)) error {
	unlock, err := m.lock(g)
	if err != nil {
		return err
	}
	defer unlock()
	h, err := held()
	switch {
	case err != nil:
		return fmt.Errorf("MPS daemon %s: %w", g.Name, err)
	case !h:
		return m.stop(ctx, g, true)
	}
	if rec, err := m.readRecord(g.Name); err != nil || rec == nil || rec.alive(m.opts.BootID) {
		return err
	}
	return m.stop(ctx, g, false)
}

// Halt stops the group's daemon (its GPU was lost) but keeps its
// directories: the containers of the claims that hold the group have its
// pipe and shm directories mounted, and a daemon started again there
// when the GPU comes back is where they look.
func (m *Manager) Halt(ctx context.Context, g Group) error {
	unlock, err := m.lock(g)
	if err != nil {
		return err
	}
	defer unlock()
	return m.stop(ctx, g, false)
}

// ensure makes the group's recorded daemon answer with limits: adopted
// when it answers on its own socket; stopped by its PID and started anew
// when it runs but does not; started when it ended or never ran, once
// no daemon without a record runs in its pipe directory and no other
// group's daemon serves its GPUs.
func (m *Manager) ensure(ctx context.Context, g Group, limits Limits) error {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "mpsDaemon", g.Name)
	rec, err := m.readRecord(g.Name)
	if err != nil {
		return err
	}
	if rec.alive(m.opts.BootID) {
		servers, err := m.servers(ctx, g.Name, rec)
		if err == nil {
			return m.limit(ctx, g, rec, limits, servers)
		}
		// Its socket gone or replaced, or the daemon hung: its clients
		// cannot join, and a second daemon beside it would serve the
		// same GPUs. It is stopped, and only then started anew.
		logger.Info("MPS control daemon runs but does not answer on its control socket: stopping it to start it anew", "pid", rec.PID, "reason", err.Error())
		if terr := m.terminate(ctx, g.Name, rec, false); terr != nil {
			return fmt.Errorf("MPS daemon %s does not answer on its control socket (%v), and %w", g.Name, err, terr)
		}
	} else if err := m.quitUnrecorded(ctx, g.Name); err != nil {
		return fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	if err := m.checkFree(ctx, g); err != nil {
		return err
	}
	if rec, err = m.start(ctx, g); err != nil {
		return err
	}
	logger.Info("Started MPS control daemon", "gpus", g.UUIDs, "dir", m.Dir(g.Name), "pid", rec.PID)
	return m.limit(ctx, g, rec, limits, nil)
}

// limit sets the limits wanted where the record says they are not set
// yet, and records them. Servers that start later get the daemon's
// defaults, which are the same limits.
func (m *Manager) limit(ctx context.Context, g Group, rec *record, limits Limits, servers []int) error {
	if rec.limited(limits) {
		return nil
	}
	if err := m.setLimits(ctx, g.Name, rec, limits, servers); err != nil {
		return err
	}
	rec.Limits = &limits
	if err := m.writeRecord(g.Name, rec); err != nil {
		return fmt.Errorf("MPS daemon %s: %w", g.Name, err)
	}
	klog.FromContext(ctx).V(2).Info("Set MPS limits", "mpsDaemon", g.Name, "activeThreadPercentage", limits.ActiveThreadPercentage, "pinnedMemLimit", limits.MemLimitEnv(), "servers", servers)
	return nil
}

// setLimits makes the daemon's defaults, and the limits of every server
// it runs, the given limits. A client's environment can only lower them.
func (m *Manager) setLimits(ctx context.Context, name string, rec *record, l Limits, servers []int) error {
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
	if _, err := m.control(ctx, name, rec, cmds...); err != nil {
		return fmt.Errorf("set the limits of MPS daemon %s: %w", name, err)
	}
	return nil
}

// Known lists the daemons that have a directory: running, or left by a
// plugin that stopped before it could clean up, or kept for the
// containers of a group whose GPU was lost.
func (m *Manager) Known() ([]string, error) {
	entries, err := fs.ReadDir(m.root.FS(), ".")
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
		data, err := m.readGroupFile(name, LogDir, f)
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
