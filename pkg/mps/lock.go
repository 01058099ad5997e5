package mps

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// What is done to a group's daemon is serialised per group and per GPU:
// the group's own lock keeps two starts or a start and a stop of one
// daemon apart; the locks of its GPUs keep apart the daemons of groups
// that share a GPU (profiles of different sizes over the same GPUs, which
// the configuration allows and the ledger only keeps from being held at
// once). A group's stop can fail while its daemon still runs, and its
// release still frees its GPUs in the ledger: whether another group's
// daemon serves a GPU is then known only here (overlap.go), and must not
// change while it is asked. Each lock is a mutex within this process and
// a file lock in the root, which the other process of a rolling update
// takes too and no stop removes: <name>.lock for a group, .gpu-<uuid>.lock
// for a GPU. Locks are taken in one order, the group's then its GPUs' by
// UUID, so that two groups never wait for each other.

// lock takes the locks of the group and of every GPU its daemon serves or
// will serve: those named, and those its directory records.
func (m *Manager) lock(g Group) (func(), error) {
	if err := checkName("daemon name", g.Name); err != nil {
		return nil, err
	}
	unlockGroup, err := m.lockFile(g.Name+".lock", "MPS daemon "+g.Name)
	if err != nil {
		return nil, err
	}
	gpus := slices.Concat(g.UUIDs, m.dirOf(g.Name).gpus())
	slices.Sort(gpus)
	unlocks := []func(){unlockGroup}
	unlock := func() {
		for _, u := range slices.Backward(unlocks) {
			u()
		}
	}
	for _, uuid := range slices.Compact(gpus) {
		if err := checkName("GPU UUID", uuid); err != nil {
			unlock()
			return nil, fmt.Errorf("MPS daemon %s: %w", g.Name, err)
		}
		u, err := m.lockFile(".gpu-"+uuid+".lock", "GPU "+uuid+" for MPS daemon "+g.Name)
		if err != nil {
			unlock()
			return nil, err
		}
		unlocks = append(unlocks, u)
	}
	return unlock, nil
}

// checkName refuses what cannot name a file in the root, and names that
// start with a dot, which are the GPUs' locks.
func checkName(what, name string) error {
	if name == "" || strings.HasPrefix(name, ".") || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("mps: %q is not a %s", name, what)
	}
	return nil
}

// lockFile takes the mutex of file and an exclusive flock on the file in
// the root, which closing the file releases.
func (m *Manager) lockFile(file, what string) (func(), error) {
	m.mu.Lock()
	l, ok := m.locks[file]
	if !ok {
		l = &sync.Mutex{}
		m.locks[file] = l
	}
	m.mu.Unlock()
	l.Lock()
	f, err := openAt(m.dir, file, unix.O_RDWR|unix.O_CREAT, 0o600)
	if err == nil {
		err = flock(f)
	}
	if err != nil {
		l.Unlock()
		return nil, fmt.Errorf("lock %s: %w", what, err)
	}
	return func() { _ = f.Close(); l.Unlock() }, nil
}

func flock(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			if err != nil {
				_ = f.Close()
			}
			return err
		}
	}
}
