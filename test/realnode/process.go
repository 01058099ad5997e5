package realnode

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/kubernetes/test/utils/ktesting"
)

// process is one program of a node, its output in a log file.
type process struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startProcess starts a program with its output appended to log. The
// program gets its own process group, so that stopping it stops what it
// started in the foreground too.
func startProcess(name, log string, env []string, bin string, args ...string) (*process, error) {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, log: log, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the program ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM, and SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// kill ends the program at once, as a crash or an OOM kill would.
func (p *process) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// tail returns the end of a log file for failure messages.
func tail(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// waitFor polls cond until it holds, the process dies, or timeout passes.
func waitFor(tb ktesting.TB, what string, p *process, timeout time.Duration, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if p != nil {
			if done, err := p.exited(); done {
				tb.Fatalf("%s: %s exited (%v) while waiting; its log:\n%s", what, p.name, err, tail(p.log, 4000))
			}
		}
		if time.Now().After(deadline) {
			msg := fmt.Sprintf("%s: not after %v", what, timeout)
			if p != nil {
				msg += fmt.Sprintf("; %s's log:\n%s", p.name, tail(p.log, 4000))
			}
			tb.Fatal(msg)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lookTools finds the node's programs in dir.
func lookTools(dir string, names ...string) error {
	var errs []error
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
