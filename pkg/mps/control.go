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

	"golang.org/x/sys/unix"
)

// ControlSocket is the daemon's control socket in its pipe directory,
// where nvidia-cuda-mps-control, as a client, finds the daemon.
const ControlSocket = "control"

// controlClient runs nvidia-cuda-mps-control, as a client, against one
// group's daemon: on the control socket of the group's pipe directory,
// checked before each run.
type controlClient struct {
	dir  groupDir
	opts *Options
}

// checkSocket checks, right before the control client runs, that the pipe
// directory is the daemon's and its control socket the one the daemon
// bound: a directory of the plugin's user, not a link, holding a socket of
// the plugin's user (the daemon runs as the plugin's user), and, once the
// daemon has answered, the very socket it answered on. The client is
// another process that looks the path up again: what makes the check hold
// until then is that containers cannot change the pipe directory (it is
// mounted read-only by default, see Options.ClientPipeWritable) and cannot
// reach the daemon's directory that holds it.
func (c controlClient) checkSocket(rec *record) (*unix.Stat_t, error) {
	dir, err := c.dir.open()
	if err != nil {
		return nil, err
	}
	defer func() { _ = dir.Close() }()
	// openDir refuses a link and a directory of another user.
	pipe, err := openDir(dir, PipeDir)
	if err != nil {
		return nil, fmt.Errorf("no pipe directory: %w", err)
	}
	defer func() { _ = pipe.Close() }()
	sock := filepath.Join(pipe.Name(), ControlSocket)
	var st unix.Stat_t
	if err := unix.Fstatat(int(pipe.Fd()), ControlSocket, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, fmt.Errorf("no control socket: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("%s is not a socket (mode %o): refusing to talk to it", sock, st.Mode)
	}
	if int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("%s belongs to user %d, not to the daemon's %d: refusing to talk to it", sock, st.Uid, os.Geteuid())
	}
	if rec != nil && rec.Socket != nil && *socketIDOf(&st) != *rec.Socket {
		return nil, fmt.Errorf("%s is not the socket the daemon bound (it was replaced): refusing to talk to it", sock)
	}
	return &st, nil
}

// errNoAnswer is a control client that connected (something listens on
// the socket) and got no answer in time: a daemon stopped or hung.
var errNoAnswer = errors.New("no answer")

// servers asks the daemon for its servers' PIDs; an error means the
// daemon does not answer on its own socket.
func (c controlClient) servers(ctx context.Context, rec *record) ([]int, error) {
	out, err := c.run(ctx, rec, "get_server_list")
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

// run runs the control client with the commands on its stdin, once the
// socket it will reach is checked.
func (c controlClient) run(ctx context.Context, rec *record, cmds ...string) (string, error) {
	if _, err := c.checkSocket(rec); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.ControlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.opts.Control[0], c.opts.Control[1:]...) //nolint:gosec // the command is the operator's flag
	cmd.Env = c.env(nil)
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w within %s", errNoAnswer, c.opts.ControlTimeout)
		}
		return "", fmt.Errorf("%s: %w: %s", strings.Join(cmds, "; "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// answers asks a daemon just started whether it answers, and returns the
// socket it answered on: the same socket before and after the answer.
func (c controlClient) answers(ctx context.Context) (*socketID, bool) {
	before, err := c.checkSocket(nil)
	if err != nil {
		return nil, false
	}
	if _, err := c.servers(ctx, nil); err != nil {
		return nil, false
	}
	after, err := c.checkSocket(nil)
	if err != nil || *socketIDOf(after) != *socketIDOf(before) {
		return nil, false
	}
	return socketIDOf(after), true
}

// listener tells what listens on the group's control socket, checked as
// for any command but whoever bound it.
func (c controlClient) listener(ctx context.Context) presence {
	_, err := c.servers(ctx, nil)
	switch {
	case err == nil:
		return answering
	case errors.Is(err, errNoAnswer):
		return silent
	}
	return absent
}

// setLimits makes the daemon's defaults, and the limits of every server
// it runs, the given limits. A client's environment can only lower them.
func (c controlClient) setLimits(ctx context.Context, rec *record, l Limits, servers []int) error {
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
	if _, err := c.run(ctx, rec, cmds...); err != nil {
		return fmt.Errorf("set the limits of MPS daemon %s: %w", c.dir.name, err)
	}
	return nil
}

// env is the environment of the daemon (with its GPUs, uuids) and of its
// control client (uuids nil).
func (c controlClient) env(uuids []string) []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"CUDA_MPS_PIPE_DIRECTORY=" + filepath.Join(c.dir.path, PipeDir),
		"CUDA_MPS_LOG_DIRECTORY=" + filepath.Join(c.dir.path, LogDir),
	}
	if uuids != nil {
		env = append(env, "CUDA_VISIBLE_DEVICES="+strings.Join(uuids, ","))
	}
	// exec keeps the last value of a key given twice.
	return append(env, c.opts.Env...)
}
