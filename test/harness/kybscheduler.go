package harness

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
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
	// Name names its files in the cluster's directory (<name>.log,
	// <name>-config.yaml); default "kyb-scheduler". Schedulers started one
	// after the other in a cluster each need their own.
	Name string
}

// KybScheduler is the running kyb-scheduler.
type KybScheduler struct {
	// Log is the file its output goes to.
	Log string

	port int
	stop func()
}

// StartKybScheduler runs kyb-scheduler, or any command that takes
// kube-scheduler's flags, as Options.KybScheduler does, once the cluster
// runs: it returns when the scheduler is ready. It stops on Stop or when
// the cluster's test cleans up.
func (c *Cluster) StartKybScheduler(opts KybSchedulerOptions) *KybScheduler {
	c.tb.Helper()
	return c.startKybScheduler(opts)
}

// KybSchedulerBinary is the kyb-scheduler command the harness runs by
// default: $KYB_SCHEDULER (make e2e sets it), else one built into the
// cluster's directory from cmd/kyb-scheduler with its patches, as make
// build builds it (once per cluster).
func (c *Cluster) KybSchedulerBinary() string {
	if bin := os.Getenv("KYB_SCHEDULER"); bin != "" {
		return bin
	}
	bin := filepath.Join(c.Dir, "kyb-scheduler")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	return buildKybScheduler(c.tb, c.Dir)
}

// Stop stops the scheduler and waits for it to exit. It may be called
// again.
func (k *KybScheduler) Stop() { k.stop() }

// Metrics returns the scheduler's /metrics page (Prometheus text).
func (k *KybScheduler) Metrics(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/metrics", k.port), nil)
	if err != nil {
		return nil, err
	}
	resp, err := loopbackClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("scheduler metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scheduler metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scheduler metrics: %s: %s", resp.Status, body)
	}
	return body, nil
}

// CPUProfile returns a CPU profile of the scheduler over the next
// seconds (its /debug/pprof/profile, protobuf), for benchmarks that look
// for where a scheduler's time goes.
func (k *KybScheduler) CPUProfile(ctx context.Context, seconds int) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/debug/pprof/profile?seconds=%d", k.port, seconds), nil)
	if err != nil {
		return nil, err
	}
	client := loopbackClient()
	client.Timeout = time.Duration(seconds)*time.Second + 10*time.Second
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scheduler CPU profile: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scheduler CPU profile: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scheduler CPU profile: %s: %s", resp.Status, body)
	}
	return body, nil
}

// loopbackClient talks to the scheduler's secure port. Its serving
// certificate is self-signed, made at its start: a loopback request to a
// process this harness started.
func loopbackClient() *http.Client {
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
}

func (c *Cluster) startKybScheduler(opts KybSchedulerOptions) *KybScheduler {
	tb := c.tb
	name := opts.Name
	if name == "" {
		name = "kyb-scheduler"
	}
	bin := opts.Binary
	if bin == "" {
		bin = c.KybSchedulerBinary()
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
		// Metrics and profiles for benchmarks, without a token: a loopback
		// port.
		"--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics,/debug/pprof/*",
		"--v=2",
	}
	if opts.Config != "" {
		file := filepath.Join(c.Dir, name+"-config.yaml")
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
	k := &KybScheduler{Log: filepath.Join(c.Dir, name+".log"), port: port}
	logFile, err := os.Create(k.Log)
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
	var once sync.Once
	k.stop = func() {
		once.Do(func() {
			// Without leader election kube-scheduler exits 1 on SIGTERM
			// ("finished without leader elect"): its status says nothing.
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				tb.Logf("%s did not stop within 10s of SIGTERM; killed", name)
				_ = cmd.Process.Kill()
				<-exited
			}
			_ = logFile.Close()
		})
	}
	tb.Cleanup(k.stop)

	// Ready: its informers synced and its handlers registered.
	client := loopbackClient()
	url := fmt.Sprintf("https://127.0.0.1:%d/readyz", port)
	err = wait.PollUntilContextTimeout(c.Ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("%s exited: %v", name, waitErr)
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
		tb.Fatalf("%s not ready: %v\n%s", name, err, k.Tail(40))
	}
	return k
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
