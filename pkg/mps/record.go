package mps

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// recordFile, in a daemon's directory, is its record. The directory is the
// plugin's alone: containers get its pipe and shm subdirectories, never
// the directory itself, so nothing a tenant writes can change a record.
const recordFile = "daemon.json"

// record is what the plugin knows of a daemon it started: enough to find
// the very process again (a PID alone may have been reused by the time a
// restarted plugin reads it) and its control socket (a path alone may
// have been replaced, by anyone who can write in the pipe directory).
//
// A record is written before the daemon is started, with no PID, and
// kept when a start fails: a group with a record wants a daemon, and the
// watcher (Revive) starts one where none runs. Only a stop removes it.
// A plugin that dies between the start and the PID's write leaves a
// daemon no record names; it answers on the group's control socket, and
// is asked to quit there before any other starts (quitUnrecorded).
type record struct {
	// PID is 0 while a start is under way, or after one failed.
	PID int `json:"pid"`
	// StartTime is field 22 of /proc/<pid>/stat: when the process
	// started, in clock ticks after boot. With BootID it names one
	// process for as long as the machine runs: a record of an earlier
	// boot names no live process, whatever runs under its PID now.
	StartTime uint64 `json:"startTime"`
	BootID    string `json:"bootID,omitempty"`
	// Socket is the control socket the daemon answered on first.
	Socket *socketID `json:"socket,omitempty"`
	// Limits are the limits last set on the daemon, by whichever plugin
	// process set them: the two processes of a rolling update set limits
	// on the one daemon, and each must know what the other set.
	Limits *Limits `json:"limits,omitempty"`
}

// limited tells whether the daemon holds limits already.
func (r *record) limited(l Limits) bool {
	return r.Limits != nil && r.Limits.Equal(l)
}

// socketID names one control socket: a socket bound again at the same
// path, even on a reused inode number, has another change time.
type socketID struct {
	Dev   uint64 `json:"dev"`
	Ino   uint64 `json:"ino"`
	Ctime int64  `json:"ctimeNs"`
}

func socketIDOf(st *unix.Stat_t) *socketID {
	return &socketID{Dev: st.Dev, Ino: st.Ino, Ctime: st.Ctim.Nano()}
}

// procStat reads a process's state and start time from /proc/<pid>/stat.
func procStat(pid int) (state byte, start uint64, err error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, err
	}
	state, start, err = parseStat(data)
	if err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return state, start, nil
}

// parseStat reads the state (field 3) and the start time (field 22) of a
// stat line. The command name (field 2) is in parentheses and may hold
// spaces and parentheses itself: the fields that follow start after the
// last ')'.
func parseStat(data []byte) (state byte, start uint64, err error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, errors.New("no command name")
	}
	f := strings.Fields(string(data[i+1:]))
	// f[0] is field 3, so field 22 is f[19].
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("%d fields after the command name", len(f))
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("start time %q", f[19])
	}
	return f[0][0], start, nil
}

// newRecord records a process just started in boot.
func newRecord(pid int, boot string) (*record, error) {
	_, start, err := procStat(pid)
	if err != nil {
		return nil, fmt.Errorf("read the start time of PID %d: %w", pid, err)
	}
	return &record{PID: pid, StartTime: start, BootID: boot}, nil
}

// alive reports whether the recorded process still runs in boot (the
// node's, Options.BootID): same boot, same PID, same start time, and not
// ended (a zombie has closed its sockets and freed its GPU contexts; only
// its parent's wait is missing).
func (r *record) alive(boot string) bool {
	if r == nil || r.PID <= 0 {
		return false
	}
	if r.BootID != "" && boot != "" && r.BootID != boot {
		return false
	}
	state, start, err := procStat(r.PID)
	return err == nil && start == r.StartTime && state != 'Z' && state != 'X'
}

// errGone is a signal not sent: the recorded process ended.
var errGone = errors.New("the process has ended")

// signal sends sig to the recorded process of boot, and to no other. A pidfd pins
// the process while its start time is checked, so a PID reused between
// the check and the signal cannot receive it; kernels without pidfds
// (before 5.3) get the check and kill(2), with the race that remains.
func (r *record) signal(sig unix.Signal, boot string) error {
	fd, err := unix.PidfdOpen(r.PID, 0)
	switch {
	case err == nil:
		defer func() { _ = unix.Close(fd) }()
	case errors.Is(err, unix.ESRCH):
		return errGone
	case errors.Is(err, unix.ENOSYS):
		fd = -1
	default:
		return fmt.Errorf("open PID %d: %w", r.PID, err)
	}
	if !r.alive(boot) {
		return errGone
	}
	if fd >= 0 {
		err = unix.PidfdSendSignal(fd, sig, nil, 0)
	} else {
		err = unix.Kill(r.PID, sig)
	}
	if errors.Is(err, unix.ESRCH) {
		return errGone
	}
	return err
}

// waitGone waits until the recorded process of boot has ended, at most d.
func (r *record) waitGone(d time.Duration, boot string) bool {
	deadline := time.Now().Add(d)
	for r.alive(boot) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// readRecord reads the daemon's record: nil where there is none.
func (g groupDir) readRecord() (*record, error) {
	dir, err := g.open()
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the record of MPS daemon %s: %w", g.name, err)
	}
	defer func() { _ = dir.Close() }()
	data, err := readAt(dir, recordFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the record of MPS daemon %s: %w", g.name, err)
	}
	var r record
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("read the record of MPS daemon %s: %w", g.name, err)
	}
	return &r, nil
}

// writeRecord replaces the record atomically (replaceAt).
func (g groupDir) writeRecord(r *record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	dir, err := g.open()
	if err != nil {
		return fmt.Errorf("write the record of MPS daemon %s: %w", g.name, err)
	}
	defer func() { _ = dir.Close() }()
	if err := replaceAt(dir, recordFile, data, 0o600); err != nil {
		return fmt.Errorf("write the record of MPS daemon %s: %w", g.name, err)
	}
	return nil
}

func (g groupDir) removeRecord() error {
	err := g.root.Remove(filepath.Join(g.name, recordFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove the record of MPS daemon %s: %w", g.name, err)
	}
	return nil
}
