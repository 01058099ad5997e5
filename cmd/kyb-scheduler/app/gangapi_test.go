package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	featuregatetesting "k8s.io/component-base/featuregate/testing"
	"k8s.io/klog/v2/ktesting"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	"k8s.io/kubernetes/pkg/features"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-scheduler/placement"
)

// --feature-gates=GenericWorkload=true names the gate: the check must
// leave it alone (docs: "unless --feature-gates names GenericWorkload").
func TestAGateNamedOnTheCommandLineIsSeen(t *testing.T) {
	// (One form per process: the flag's value is shared by every command
	// the process builds, and a "kube:" form beside a bare one is refused.)
	for _, flag := range []string{"--feature-gates=GenericWorkload=true"} {
		cmd := schedulerapp.NewSchedulerCommand()
		if err := cmd.ParseFlags([]string{flag}); err != nil {
			t.Fatal(err)
		}
		if !gateSetOnCommandLine(cmd, string(features.GenericWorkload)) {
			t.Errorf("%s: not seen as naming GenericWorkload (the flag's value reads %q)", flag, cmd.Flags().Lookup("feature-gates").Value.String())
		}
	}
}

// The user-visible effect: asked for gangs on the command line, against an
// API server the check cannot see serving PodGroups (a configuration
// file's kubeconfig naming another cluster, as the docs advise), gang
// scheduling is turned off anyway.
func TestAGateAskedForOnTheCommandLineStaysOn(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.GenericWorkload, true)
	_, ctx := ktesting.NewTestContext(t)
	cmd := schedulerapp.NewSchedulerCommand()
	if err := cmd.ParseFlags([]string{"--feature-gates=GenericWorkload=true"}); err != nil {
		t.Fatal(err)
	}
	if err := cmd.PersistentPreRunE(cmd, nil); err != nil {
		t.Fatal(err)
	}
	asked := false
	notServed := func(context.Context) (bool, error) { asked = true; return false, nil }
	if err := gangGateFollowsTheAPI(ctx, cmd, notServed); err != nil {
		t.Fatal(err)
	}
	if !utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload) {
		t.Errorf("--feature-gates=GenericWorkload=true: gang scheduling turned off (API server asked: %t)", asked)
	}
}

// An API server that is starting (503, or no answer yet) does not serve
// PodGroups once it is up: a check at start that takes the error as "on"
// leaves kube-scheduler waiting forever for the PodGroup informer, the
// very hang the check is there to prevent.
func TestAnAPIServerThatIsStartingIsAskedAgain(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.GenericWorkload, true)
	_, ctx := ktesting.NewTestContext(t)
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The first answer: the API server is still starting. Later
		// ones: it does not serve scheduling.k8s.io/v1beta1.
		if requests.Add(1) == 1 {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	cmd := schedulerapp.NewSchedulerCommand()
	if err := cmd.ParseFlags([]string{"--master=" + srv.URL}); err != nil {
		t.Fatal(err)
	}
	if err := gangGateFollowsTheAPI(ctx, cmd, discoverGangAPI(cmd)); err != nil {
		t.Fatal(err)
	}
	if utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload) {
		t.Errorf("the API server does not serve PodGroups (it answered 503 once while starting, then 404; %d requests), yet gang scheduling stays on: kube-scheduler waits for a PodGroup informer that never syncs", requests.Load())
	}
}

// --version, --write-config-to and --help must not need an API server.
// Each runs kyb-scheduler's real command (NewCommand, once per process) in
// a child process of this test binary, against an API server that counts
// its requests.
func TestOfflineCommandsAskNoAPIServer(t *testing.T) {
	if args := os.Getenv("KYB_SCHEDULER_CHILD_ARGS"); args != "" {
		cmd, err := NewCommand(placement.NewMetrics())
		if err != nil {
			t.Fatal(err)
		}
		cmd.SetArgs(strings.Split(args, " "))
		_ = cmd.Execute()
		return
	}
	var requests atomic.Int32
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// kube-scheduler's own --write-config-to asks events.k8s.io;
		// only the PodGroup check's question counts here.
		if strings.HasPrefix(r.URL.Path, "/apis/scheduling.k8s.io") {
			requests.Add(1)
		}
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		http.NotFound(w, r)
	}))
	defer srv.Close()
	for _, args := range []string{
		"--help",
		"--version",
		"--write-config-to=" + filepath.Join(t.TempDir(), "config.yaml"),
	} {
		before := requests.Load()
		child := exec.Command(os.Args[0], "-test.run=^TestOfflineCommandsAskNoAPIServer$", "-test.count=1")
		child.Env = append(os.Environ(), "KYB_SCHEDULER_CHILD_ARGS="+args+" --master="+srv.URL)
		out, _ := child.CombinedOutput()
		if n := requests.Load() - before; n > 0 {
			mu.Lock()
			t.Errorf("kyb-scheduler %s: %d requests for %s (all paths so far: %v); output:\n%s", args, n, podGroupAPI, paths, lastLines(string(out), 3))
			mu.Unlock()
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// The non-deprecated way to name the cluster is the configuration file's
// clientConnection.kubeconfig (--kubeconfig is "ignored if a config file
// is specified"). With no --kubeconfig/--master flag beside it, and not in
// a pod, the check cannot build a client, takes that for "cannot tell",
// and leaves gangs on against an API server without PodGroups: the hang.
func TestTheConfigFilesKubeconfigIsWhatTheCheckAsks(t *testing.T) {
	featuregatetesting.SetFeatureGateDuringTest(t, utilfeature.DefaultFeatureGate, features.GenericWorkload, true)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, ctx := ktesting.NewTestContext(t)
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		http.NotFound(w, r)
	}))
	defer srv.Close()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "scheduler.conf")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "`+srv.URL+`"}}]
users: [{name: u, user: {}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(config, []byte("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection: {kubeconfig: "+kubeconfig+"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := schedulerapp.NewSchedulerCommand()
	if err := cmd.ParseFlags([]string{"--config=" + config}); err != nil {
		t.Fatal(err)
	}
	if err := gangGateFollowsTheAPI(ctx, cmd, discoverGangAPI(cmd)); err != nil {
		t.Fatal(err)
	}
	if utilfeature.DefaultFeatureGate.Enabled(features.GenericWorkload) {
		t.Errorf("--config with clientConnection.kubeconfig naming an API server without PodGroups (%d requests reached it): gang scheduling stays on", requests.Load())
	}
}
