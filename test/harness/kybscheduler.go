package harness

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// KybSchedulerOptions run kyb-scheduler beside the default scheduler: the
// real binary, as a process of its own talking to the cluster's API
// server, as a cluster runs it (a second scheduler; pods choose it with
// spec.schedulerName: kyb-scheduler).
type KybSchedulerOptions struct {
	// Binary is the kyb-scheduler command; default $KYB_SCHEDULER (make
	// e2e sets it), else one built here from cmd/kyb-scheduler with its
	// patches, as make build builds it.
	Binary string
	// Config, if set, is written to a file and given as --config;
	// otherwise kyb-scheduler runs its built-in profile.
	Config string
	// Args are further flags.
	Args []string
}

// KybScheduler is the running kyb-scheduler.
type KybScheduler struct {
	// Log is the file its output goes to.
	Log string
}

func (c *Cluster) startKybScheduler(opts KybSchedulerOptions) {
	tb := c.tb
	bin := opts.Binary
	if bin == "" {
		bin = os.Getenv("KYB_SCHEDULER")
	}
	if bin == "" {
		bin = buildKybScheduler(tb, c.Dir)
	}
	port, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	args := []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		// One replica: nothing to elect.
		"--leader-elect=false",
		"--v=2",
	}
	if opts.Config != "" {
		file := filepath.Join(c.Dir, "kyb-scheduler-config.yaml")
		cfg := opts.Config
		if !strings.Contains(cfg, "clientConnection") {
			// --kubeconfig is ignored where --config is given.
			cfg += "\nclientConnection:\n  kubeconfig: " + c.Kubeconfig + "\n"
		}
		if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
			tb.Fatal(err)
		}
		args = append(args, "--config="+file)
	}
	args = append(args, opts.Args...)
	c.KybScheduler = &KybScheduler{Log: filepath.Join(c.Dir, "kyb-scheduler.log")}
	logFile, err := os.Create(c.KybScheduler.Log)
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", bin, err)
	}
	// exited closes once the process is gone; waitErr is then its status.
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	tb.Cleanup(func() {
		// Without leader election kube-scheduler exits 1 on SIGTERM
		// ("finished without leader elect"): its status says nothing.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			tb.Logf("kyb-scheduler did not stop within 10s of SIGTERM; killed")
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logFile.Close()
	})

	// Ready: its informers synced and its handlers registered.
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		// Its serving certificate is self-signed, made at its start: a
		// loopback health check of a process this test started.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
	url := fmt.Sprintf("https://127.0.0.1:%d/readyz", port)
	err = wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("kyb-scheduler exited: %v", waitErr)
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		tb.Fatalf("kyb-scheduler not ready: %v\n%s", err, c.KybScheduler.Tail(40))
	}
}

// Tail is the last n lines kyb-scheduler logged, for failure messages.
func (k *KybScheduler) Tail(n int) string {
	data, err := os.ReadFile(k.Log)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// buildKybScheduler builds bin/kyb-scheduler's equivalent into dir, as
// make build does: the patched copies first, then the module's build.
func buildKybScheduler(tb interface {
	Helper()
	Fatalf(string, ...any)
}, dir string) string {
	tb.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	if out, err := exec.Command(filepath.Join(root, "hack", "kyb-scheduler-patch.sh")).CombinedOutput(); err != nil {
		tb.Fatalf("hack/kyb-scheduler-patch.sh: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "kyb-scheduler")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = filepath.Join(root, "cmd", "kyb-scheduler")
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("build kyb-scheduler: %v\n%s", err, out)
	}
	return bin
}
