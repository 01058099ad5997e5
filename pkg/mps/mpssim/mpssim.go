// Package mpssim is a simulated nvidia-cuda-mps-control, the MPS daemon of
// simulated nodes: a daemon that keeps the limits it is told, starts one
// server per user ID its clients run as, and gives each client the lower
// of the server's limits and those of its own environment, as MPS does;
// and the client that sends it commands on stdin. It logs every command
// it gets to control.log in its log directory, as the real daemon does.
//
// A simulated node (kyb-dra-plugin --simulate) runs it from the plugin's
// own binary, `kyb-dra-plugin mps-control-sim` (Command), so that MPS
// profiles prepare there as on a real node, with nothing more in the
// image; tests run the same simulator through package mpstest.
//
// Commands are those of the real daemon the plugin uses, plus one of its
// own: "client <uid> <env>", which stands in for a CUDA process joining
// with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in its environment (run with --client
// to send it from the environment).
//
// The control client starts each connection with "#pipe <dir>", the pipe
// directory it was told to use, which the real one does not: a daemon
// reached through another directory than its own (a link planted in a
// pipe directory) logs the connection as misdirected. With LogEnv set,
// every daemon also appends its log lines, prefixed with its pipe
// directory, to that one file, which outlives the daemons' directories.
// A daemon ends when its pipe directory goes, so that the daemons of a
// simulated node or a test go with their directory; with OutliveDirEnv
// set it runs on, as a real daemon does.
package mpssim

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
)

// Command is the plugin's subcommand that runs the simulator:
// `kyb-dra-plugin mps-control-sim [-f | --client]`.
const Command = "mps-control-sim"

// The environment variables a daemon reads besides those of MPS.
const (
	// LogEnv names a file every daemon appends its log lines to.
	LogEnv = "KYB_MPS_SIM_LOG"
	// OutliveDirEnv, when set, keeps a daemon running once its pipe
	// directory is gone.
	OutliveDirEnv = "KYB_MPS_SIM_OUTLIVE_DIR"
)

const socketName = mps.ControlSocket

// Misdirected starts the log line of a connection that reached a daemon
// through another pipe directory than its own.
const Misdirected = "misdirected: a control client aimed at "

// Main runs the simulator with the arguments that follow Command: "-f"
// the daemon, "--client" one client joining, none the control client.
// It returns the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	pipe := os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
	if pipe == "" {
		pipe = "/tmp/nvidia-mps"
	}
	switch {
	case len(args) == 1 && args[0] == "-f":
		return runDaemon(pipe, stderr)
	case len(args) == 1 && args[0] == "--client":
		line := fmt.Sprintf("client %d %s;%s", os.Getuid(), os.Getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), os.Getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"))
		return runClient(pipe, strings.NewReader(line+"\n"), stdout, stderr)
	case len(args) == 0:
		return runClient(pipe, io.MultiReader(strings.NewReader("#pipe "+pipe+"\n"), stdin), stdout, stderr)
	}
	fmt.Fprintf(stderr, "usage: %s [-f | --client]\n", Command)
	return 2
}

func runClient(pipe string, stdin io.Reader, stdout, stderr io.Writer) int {
	conn, err := net.Dial("unix", filepath.Join(pipe, socketName))
	if err != nil {
		fmt.Fprintf(stderr, "Cannot find MPS control daemon process: %v\n", err)
		return 1
	}
	defer func() { _ = conn.Close() }()
	r := bufio.NewReader(conn)
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		cmd := strings.TrimSpace(sc.Text())
		if cmd == "" {
			continue
		}
		if _, err := fmt.Fprintln(conn, cmd); err != nil {
			fmt.Fprintf(stderr, "send %q: %v\n", cmd, err)
			return 1
		}
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				if cmd == "quit" {
					return 0
				}
				fmt.Fprintf(stderr, "read answer to %q: %v\n", cmd, err)
				return 1
			}
			line = strings.TrimSuffix(line, "\n")
			if line == "." {
				break
			}
			if rest, ok := strings.CutPrefix(line, "ERROR "); ok {
				fmt.Fprintln(stderr, rest)
				return 1
			}
			fmt.Fprintln(stdout, line)
		}
	}
	return 0
}

type daemon struct {
	mu            sync.Mutex
	pipe          string
	log           *os.File
	shared        *os.File
	devices       int
	defaultThread int
	defaultMem    map[int]int64
	// servers by user ID, each with its own limits.
	servers map[int]*server
	nextPID int
	quit    chan struct{}
}

type server struct {
	pid    int
	thread int
	mem    map[int]int64
}

func runDaemon(pipe string, stderr io.Writer) int {
	logDir := os.Getenv("CUDA_MPS_LOG_DIRECTORY")
	if logDir == "" {
		logDir = "/var/log/nvidia-mps"
	}
	logFile, err := os.OpenFile(filepath.Join(logDir, "control.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(stderr, "open log: %v\n", err)
		return 1
	}
	visible := os.Getenv("CUDA_VISIBLE_DEVICES")
	d := &daemon{pipe: pipe, log: logFile, defaultThread: 100, defaultMem: map[int]int64{}, servers: map[int]*server{}, nextPID: 4000, quit: make(chan struct{})}
	if visible != "" {
		d.devices = len(strings.Split(visible, ","))
	}
	if path := os.Getenv(LogEnv); path != "" {
		if d.shared, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			fmt.Fprintf(stderr, "open %s: %v\n", path, err)
			return 1
		}
	}
	l, err := net.Listen("unix", filepath.Join(pipe, socketName))
	if err != nil {
		d.logf("cannot start: %v", err)
		fmt.Fprintf(stderr, "cannot start: %v\n", err)
		return 1
	}
	d.logf("Control daemon started, CUDA_VISIBLE_DEVICES=%s", visible)
	// SIGTERM ends the daemon as quit does, its socket removed.
	terms := make(chan os.Signal, 1)
	signal.Notify(terms, syscall.SIGTERM)
	go func() {
		select {
		case <-terms:
			d.mu.Lock()
			d.logf("SIGTERM")
			d.mu.Unlock()
			d.stop()
		case <-d.quit:
		}
	}()
	go func() {
		// Its directory going away ends the daemon, unless it is to
		// outlive its directory, as real ones do.
		if os.Getenv(OutliveDirEnv) != "" {
			return
		}
		for {
			select {
			case <-d.quit:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if _, err := os.Stat(pipe); err != nil {
				d.stop()
				return
			}
		}
	}()
	go func() {
		<-d.quit
		_ = l.Close()
	}()
	for {
		conn, err := l.Accept()
		if err != nil {
			d.logf("Control daemon exited")
			return 0
		}
		go d.serve(conn)
	}
}

func (d *daemon) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.quit:
	default:
		close(d.quit)
	}
}

func (d *daemon) logf(format string, args ...any) {
	line := fmt.Sprintf("[%s] %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
	_, _ = io.WriteString(d.log, line)
	if d.shared != nil {
		_, _ = io.WriteString(d.shared, d.pipe+" "+line)
	}
}

func (d *daemon) serve(conn net.Conn) {
	defer func() { _ = conn.Close() }()
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		cmd := sc.Text()
		if target, ok := strings.CutPrefix(cmd, "#pipe "); ok {
			if target != d.pipe {
				d.mu.Lock()
				d.logf("%s%s", Misdirected, target)
				d.mu.Unlock()
			}
			fmt.Fprintln(conn, ".")
			continue
		}
		d.mu.Lock()
		d.logf("cmd: %s", cmd)
		out, err := d.do(cmd)
		d.mu.Unlock()
		if err != nil {
			d.logf("error: %v", err)
			fmt.Fprintf(conn, "ERROR %v\n", err)
			return
		}
		for _, line := range out {
			fmt.Fprintln(conn, line)
		}
		if cmd == "quit" {
			d.stop()
			return
		}
		fmt.Fprintln(conn, ".")
	}
}

func (d *daemon) do(cmd string) ([]string, error) {
	f := strings.Fields(cmd)
	if len(f) == 0 {
		return nil, nil
	}
	arg := func(i int) (int, error) {
		if i >= len(f) {
			return 0, fmt.Errorf("%s: missing argument %d", f[0], i)
		}
		return strconv.Atoi(f[i])
	}
	switch f[0] {
	case "get_server_list":
		var out []string
		for _, s := range d.sortedServers() {
			out = append(out, strconv.Itoa(s.pid))
		}
		return out, nil
	case "quit":
		return nil, nil
	case "set_default_active_thread_percentage":
		pct, err := arg(1)
		if err != nil || pct < 1 || pct > 100 {
			return nil, fmt.Errorf("invalid percentage in %q", cmd)
		}
		d.defaultThread = pct
		return nil, nil
	case "get_default_active_thread_percentage":
		return []string{strconv.Itoa(d.defaultThread)}, nil
	case "set_default_device_pinned_mem_limit":
		dev, mib, err := d.devMem(f, 1)
		if err != nil {
			return nil, err
		}
		d.defaultMem[dev] = mib
		return nil, nil
	case "get_default_device_pinned_mem_limit":
		dev, err := arg(1)
		if err != nil {
			return nil, err
		}
		return []string{fmt.Sprintf("%dM", d.defaultMem[dev])}, nil
	case "set_active_thread_percentage":
		pid, err := arg(1)
		if err != nil {
			return nil, err
		}
		pct, err := arg(2)
		s := d.server(pid)
		if err != nil || s == nil || pct < 1 || pct > 100 {
			return nil, fmt.Errorf("invalid server or percentage in %q", cmd)
		}
		s.thread = pct
		return nil, nil
	case "set_device_pinned_mem_limit":
		pid, err := arg(1)
		s := d.server(pid)
		if err != nil || s == nil {
			return nil, fmt.Errorf("no server in %q", cmd)
		}
		dev, mib, err := d.devMem(f, 2)
		if err != nil {
			return nil, err
		}
		s.mem[dev] = mib
		return nil, nil
	case "client":
		return d.client(f)
	}
	return nil, fmt.Errorf("unknown command %q", f[0])
}

func (d *daemon) devMem(f []string, i int) (int, int64, error) {
	if len(f) != i+2 {
		return 0, 0, fmt.Errorf("%s: want <device> <value>", f[0])
	}
	dev, err := strconv.Atoi(f[i])
	if err != nil || dev < 0 || (d.devices > 0 && dev >= d.devices) {
		return 0, 0, fmt.Errorf("%s: no device %q among %d", f[0], f[i], d.devices)
	}
	mib, err := mps.ParseMiB(f[i+1])
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %w", f[0], err)
	}
	return dev, mib, nil
}

func (d *daemon) server(pid int) *server {
	for _, s := range d.servers {
		if s.pid == pid {
			return s
		}
	}
	return nil
}

func (d *daemon) sortedServers() []*server {
	var out []*server
	for _, s := range d.servers {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *server) int { return a.pid - b.pid })
	return out
}

// client joins a client of a user ID: its server starts with the
// daemon's defaults; the client gets the lower of the server's limits and
// its environment's. The answer is "thread=<pct> mem=<limits>".
func (d *daemon) client(f []string) ([]string, error) {
	if len(f) < 2 {
		return nil, fmt.Errorf("client: want <uid> <thread>;<mem>")
	}
	uid, err := strconv.Atoi(f[1])
	if err != nil {
		return nil, fmt.Errorf("client: uid %q", f[1])
	}
	envThread, envMem, _ := strings.Cut(strings.Join(f[2:], ""), ";")
	s, ok := d.servers[uid]
	if !ok {
		d.nextPID++
		s = &server{pid: d.nextPID, thread: d.defaultThread, mem: map[int]int64{}}
		for k, v := range d.defaultMem {
			s.mem[k] = v
		}
		d.servers[uid] = s
		d.logf("Server %d started for uid %d", s.pid, uid)
	}
	thread := s.thread
	if envThread != "" {
		pct, err := strconv.Atoi(envThread)
		if err != nil {
			return nil, fmt.Errorf("client: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE %q", envThread)
		}
		thread = min(thread, pct)
	}
	asked, err := mps.ParseMemLimit(envMem)
	if err != nil {
		return nil, fmt.Errorf("client: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT: %w", err)
	}
	var mem []string
	for dev := range max(d.devices, len(s.mem)) {
		limit, has := s.mem[dev]
		if v, ok := asked[dev]; ok && (!has || v < limit) {
			limit, has = v, true
		}
		if has {
			mem = append(mem, fmt.Sprintf("%d=%dM", dev, limit))
		}
	}
	d.logf("Client of server %d: thread %d%%, mem %s", s.pid, thread, strings.Join(mem, ","))
	return []string{fmt.Sprintf("thread=%d mem=%s", thread, strings.Join(mem, ","))}, nil
}
