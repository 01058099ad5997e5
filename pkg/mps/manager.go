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
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"
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
func (m *Manager) Has(name string) bool { return m.dirOf(name).exists() }

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
	return m.use(ctx, g, want, func(d *daemon, limits Limits) error { return d.ensure(ctx, limits) })
}

// Settle is for a release: it stops the daemon of a group no claim uses
// any more and sets new limits on one whose largest share changed,
// without asking a daemon whose limits stand. A recorded daemon that
// ended is started again.
func (m *Manager) Settle(ctx context.Context, g Group, want Want) error {
	return m.use(ctx, g, want, func(d *daemon, limits Limits) error {
		if d.runsWith(limits) {
			return nil
		}
		return d.ensure(ctx, limits)
	})
}

// Revive is for a watcher of the daemons: it starts again the daemon of a
// group in use whose recorded daemon ended, or whose last start failed
// (restarted: true once one answers), and stops the daemon of a group no
// claim uses (finishing a stop that could not be confirmed before). A
// daemon that runs is asked nothing unless its limits changed, and a
// group without a record (never started here, or halted) is left alone.
func (m *Manager) Revive(ctx context.Context, g Group, want Want) (restarted bool, err error) {
	err = m.use(ctx, g, want, func(d *daemon, limits Limits) (err error) {
		restarted, err = d.revive(ctx, limits)
		return err
	})
	return restarted, err
}

// Retire is for a group that no longer uses MPS (its profile changed, or
// the plan lacks it): its daemon stays as it is while held says a claim
// holds the group, whose containers still use it, and is stopped after.
// Such a daemon that ends is not started again (the group's share under
// today's plan is not the one its claims were given); its GPUs go back to
// DEFAULT, and its directories stay until the group is free.
func (m *Manager) Retire(ctx context.Context, g Group, held func() (bool, error)) error {
	heldWant := func() (Limits, bool, error) {
		h, err := held()
		return Limits{}, h, err
	}
	return m.use(ctx, g, heldWant, func(d *daemon, _ Limits) error { return d.retire(ctx) })
}

// Halt stops the group's daemon (its GPU was lost) but keeps its
// directories: the containers of the claims that hold the group have its
// pipe and shm directories mounted, and a daemon started again there
// when the GPU comes back is where they look.
func (m *Manager) Halt(ctx context.Context, g Group) error {
	return m.locked(g, func(d *daemon) error { return d.stop(ctx, false) })
}

// use is the prologue of the verbs a claim's use drives: under the
// group's locks it asks want, and stops the daemon of a group no claim
// uses; inUse is what the verb does to the daemon of a group in use.
func (m *Manager) use(ctx context.Context, g Group, want Want, inUse func(d *daemon, limits Limits) error) error {
	return m.locked(g, func(d *daemon) error {
		limits, used, err := want()
		switch {
		case err != nil:
			return fmt.Errorf("MPS daemon %s: %w", g.Name, err)
		case !used:
			return d.stop(ctx, true)
		}
		return inUse(d, limits)
	})
}

// locked runs fn on the group's daemon under the group's locks (lock.go).
func (m *Manager) locked(g Group, fn func(d *daemon) error) error {
	unlock, err := m.lock(g)
	if err != nil {
		return err
	}
	defer unlock()
	return fn(m.daemon(g))
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
