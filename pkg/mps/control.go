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

// checkSocket checks, right before the control client runs, that the pipe
// directory is the daemon's and its control socket the one the daemon
// bound: a directory of the plugin's user, not a link, holding a socket of
// the plugin's user (the daemon runs as the plugin's user), and, once the
// daemon has answered, the very socket it answered on. The client is
// another process that looks the path up again: what makes the check hold
// until then is that containers cannot change the pipe directory (it is
// mounted read-only by default, see Options.ClientPipeWritable) and cannot
// reach the daemon's directory that holds it.
func (m *Manager) checkSocket(name string, rec *record) (*unix.Stat_t, error) {
	dir, err := m.openGroup(name)
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
func (m *Manager) servers(ctx context.Context, name string, rec *record) ([]int, error) {
	out, err := m.control(ctx, name, rec, "get_server_list")
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

// control runs the control client with the commands on its stdin, once
// the socket it will reach is checked.
func (m *Manager) control(ctx context.Context, name string, rec *record, cmds ...string) (string, error) {
	if _, err := m.checkSocket(name, rec); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, m.opts.ControlTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.opts.Control[0], m.opts.Control[1:]...) //nolint:gosec // the command is the operator's flag
	cmd.Env = m.env(name, nil)
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w within %s", errNoAnswer, m.opts.ControlTimeout)
		}
		return "", fmt.Errorf("%s: %w: %s", strings.Join(cmds, "; "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
