package mps

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/klog/v2"
)

// A GPU takes one MPS daemon. The ledger never lets two groups that share
// a GPU be held at once, but a group's release succeeds even when its
// daemon's stop cannot be confirmed (the daemon ignores quit and SIGTERM:
// stopped, or stuck in the driver), and the ledger then frees its GPUs
// while the daemon still runs on them. So before a daemon starts, and
// before a stopped daemon's GPUs go back to compute mode DEFAULT, the
// Manager asks which other groups' daemons still serve those GPUs, under
// the locks of the GPUs (lock.go): a start is refused while one does (the
// claim's prepare fails with the reason and the kubelet retries it), and a
// stop leaves EXCLUSIVE_PROCESS the GPUs one serves. A daemon serves its
// group's GPUs (the directory's gpus file) while its record names a
// process that runs, or, without such a record, while something listens
// on its group's control socket (a daemon whose plugin died before it
// recorded it). The GPUs a stop leaves EXCLUSIVE_PROCESS so are owed by
// the daemon that serves them (owedFile, computemode.go): its own stop
// sets them back, even where its start kept the compute mode.

// presence is what listens on a group's control socket.
type presence int

const (
	absent    presence = iota // nothing: no socket, or no one listening on it
	answering                 // a daemon that answers
	silent                    // something that takes the connection and does not answer: a daemon stopped or hung
)

// server is another group's daemon that serves a GPU.
type server struct {
	group string
	what  string // the daemon, in words
}

// othersOn are the daemons of groups other than self that serve any of
// gpus, by GPU.
func (m *Manager) othersOn(ctx context.Context, self string, gpus []string) (map[string]server, error) {
	names, err := m.Known()
	if err != nil {
		return nil, err
	}
	out := map[string]server{}
	for _, name := range names {
		if name == self {
			continue
		}
		other := m.daemon(Group{Name: name})
		shared := slices.DeleteFunc(other.dir.gpus(), func(uuid string) bool { return !slices.Contains(gpus, uuid) })
		if len(shared) == 0 {
			continue
		}
		rec, err := other.dir.readRecord()
		if err != nil {
			return nil, err
		}
		var what string
		switch {
		case rec.alive(m.opts.BootID):
			what = fmt.Sprintf("the MPS daemon of group %s (PID %d), which still runs", name, rec.PID)
		case other.ctl.listener(ctx) != absent:
			what = fmt.Sprintf("an MPS daemon no record names, which listens on %s", filepath.Join(other.dir.path, PipeDir, ControlSocket))
		default:
			continue
		}
		for _, uuid := range shared {
			out[uuid] = server{group: name, what: what}
		}
	}
	return out, nil
}

// checkFree refuses to start the group's daemon while another group's
// daemon serves one of its GPUs.
func (d *daemon) checkFree(ctx context.Context) error {
	g := d.g
	others, err := d.m.othersOn(ctx, g.Name, g.UUIDs)
	if err != nil {
		return fmt.Errorf("start MPS daemon %s: %w", g.Name, err)
	}
	if len(others) == 0 {
		return nil
	}
	var served []string
	for _, uuid := range slices.Sorted(maps.Keys(others)) {
		served = append(served, fmt.Sprintf("GPU %s is served by %s", uuid, others[uuid].what))
	}
	return fmt.Errorf("start MPS daemon %s: %s: a GPU takes one MPS daemon, so this one starts only once that one has ended (a stop of it that could not be confirmed is finished by the watcher of the daemons when it ends)", g.Name, strings.Join(served, "; "))
}

// setDefault sets the GPUs of the group's daemon, which has ended, back
// to compute mode DEFAULT: uuids, unless its start kept their mode or
// they were set back since its start (restoredFile), and those another
// group's stop left to it (owedFile). A GPU another group's daemon serves
// stays EXCLUSIVE_PROCESS, owed by that daemon from then on. An error
// means none of this is known, and all stay as they are.
func (d *daemon) setDefault(ctx context.Context, uuids []string) error {
	self := d.g.Name
	owed := d.dir.owed()
	own := !d.dir.keptComputeMode() && !d.dir.restoredComputeMode()
	if !own {
		uuids = nil
	}
	all := slices.Compact(slices.Sorted(slices.Values(slices.Concat(uuids, owed))))
	if len(all) == 0 {
		return nil
	}
	others, err := d.m.othersOn(ctx, self, all)
	if err != nil {
		return fmt.Errorf("tell which of GPUs %v other MPS daemons serve: %w", all, err)
	}
	logger := klog.FromContext(ctx)
	passed := map[string][]string{}
	restored := own
	for _, uuid := range all {
		if other, ok := others[uuid]; ok {
			logger.Info("GPU stays in compute mode EXCLUSIVE_PROCESS: another group's MPS daemon serves it, and its stop sets it back", "mpsDaemon", self, "gpu", uuid, "servedBy", other.what)
			passed[other.group] = append(passed[other.group], uuid)
			continue
		}
		if err := d.m.opts.SetExclusive(ctx, uuid, false); err != nil {
			logger.Error(err, "Cannot set GPU back to compute mode DEFAULT", "gpu", uuid)
			// The next stop, or a start that keeps the mode, tries again.
			restored = restored && !slices.Contains(uuids, uuid)
		}
	}
	for _, group := range slices.Sorted(maps.Keys(passed)) {
		if err := d.m.dirOf(group).owe(passed[group]); err != nil {
			return fmt.Errorf("leave GPUs %v in compute mode EXCLUSIVE_PROCESS to the MPS daemon of group %s: %w", passed[group], group, err)
		}
	}
	if len(owed) > 0 {
		if err := d.dir.forgetOwed(); err != nil {
			return err
		}
	}
	if restored && len(uuids) > 0 {
		return d.dir.markRestored()
	}
	return nil
}
