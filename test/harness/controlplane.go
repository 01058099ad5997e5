package harness

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	kubeapiservertesting "k8s.io/kubernetes/cmd/kube-apiserver/app/testing"
	"k8s.io/kubernetes/pkg/controller/resourceclaim"
	"k8s.io/kubernetes/pkg/scheduler"
	"k8s.io/kubernetes/pkg/scheduler/profile"
	"k8s.io/kubernetes/test/utils/ktesting"
)

// Options describe a cluster.
type Options struct {
	// FeatureGates are set on the API server. The API server's start copies
	// them into the process-wide feature gates for the cluster's lifetime,
	// so the scheduler and the kubelet parts see them too; clusters in one
	// process must therefore run one after the other.
	FeatureGates map[string]bool
	// Nodes are the simulated GPU nodes.
	Nodes []NodeOptions
	// Dir holds the cluster's files; default a new temporary directory,
	// removed on cleanup.
	Dir string
	// EtcdLog is where etcd logs; default stderr.
	EtcdLog string
	// APIServerFlags are extra kube-apiserver flags (such as audit logging).
	APIServerFlags []string
	// APIServerAddress, when set, is an address of this machine, not a
	// loopback one, where pods reach the API server: it serves there too,
	// at the port it serves on 127.0.0.1, advertises it as the endpoint of
	// the "kubernetes" Service and has a certificate for it and for the
	// Service's ClusterIP (KubernetesServiceIP). Pods of a real node reach
	// it through a service proxy that sends the ClusterIP there.
	APIServerAddress string
	// ControllerManager, when set, starts kube-controller-manager once
	// the API server, the scheduler and the resource-claim controller run,
	// and returns the function that stops it (realnode.ControllerManager:
	// the controllers a chart of DaemonSets needs). The API server then
	// runs the ServiceAccount admission plugin, which gives pods their
	// ServiceAccount's token. A function rather than a switch, so that
	// the suites that start no controller manager do not link one.
	ControllerManager func(tb ktesting.TB, c *Cluster) (stop func())
	// KybScheduler, if set, runs kyb-scheduler beside the default
	// scheduler (kybscheduler.go).
	KybScheduler *KybSchedulerOptions
}

// Cluster is a running control plane with its nodes.
type Cluster struct {
	tb     ktesting.TB
	Ctx    context.Context
	cancel context.CancelFunc
	// Client talks to the API server as a cluster admin.
	Client kubernetes.Interface
	// Config is the admin REST config.
	Config *rest.Config
	// Kubeconfig is the path of an admin kubeconfig file.
	Kubeconfig string
	// Dir holds the cluster's files.
	Dir   string
	Nodes []*Node
	// KybScheduler is kyb-scheduler where Options.KybScheduler runs it.
	KybScheduler *KybScheduler
	// RootCA is the file of the CA that pods are to trust for the API
	// server at Options.APIServerAddress; empty without one.
	RootCA string

	// stopControllerManager stops kube-controller-manager; nil when none
	// runs.
	stopControllerManager func()
}

// Start starts etcd, the API server, the scheduler, the resource-claim
// controller, kube-controller-manager with Options.ControllerManager, and
// the nodes. Everything stops, and every file goes, when tb
// cleans up.
func Start(tb ktesting.TB, opts Options) *Cluster {
	tb.Helper()
	started := time.Now()
	ctx, cancel := context.WithCancel(context.Background())
	ctx = klog.NewContext(ctx, klog.Background())
	c := &Cluster{tb: tb, Ctx: ctx, cancel: cancel, Dir: opts.Dir}
	if c.Dir == "" {
		dir, err := os.MkdirTemp("", "kyb-cluster-")
		if err != nil {
			tb.Fatal(err)
		}
		c.Dir = dir
		tb.Cleanup(func() { os.RemoveAll(dir) })
	}
	tb.Cleanup(cancel)

	etcdURL := c.startEtcd(opts.EtcdLog)
	c.RootCA = c.startAPIServer(etcdURL, opts)
	c.startScheduler()
	if opts.KybScheduler != nil {
		c.KybScheduler = c.startKybScheduler(*opts.KybScheduler)
	}
	c.startClaimController()
	if opts.ControllerManager != nil {
		c.stopControllerManager = opts.ControllerManager(tb, c)
		tb.Cleanup(c.StopControllerManager)
	}
	for _, no := range opts.Nodes {
		c.AddNode(no)
	}
	tb.Logf("cluster up in %v: %d node(s), kubeconfig %s", time.Since(started).Round(time.Millisecond), len(c.Nodes), c.Kubeconfig)
	return c
}

// FreePort returns a TCP port on the loopback interface that nothing
// listens on now.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) startEtcd(logFile string) string {
	tb := c.tb
	cfg := embed.NewConfig()
	if logFile != "" {
		cfg.LogOutputs = []string{logFile}
	}
	cfg.Name = "kyb"
	cfg.Dir = filepath.Join(c.Dir, "etcd")
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true
	var urls []url.URL
	for i := 0; i < 2; i++ {
		port, err := FreePort()
		if err != nil {
			tb.Fatal(err)
		}
		u, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", port))
		urls = append(urls, *u)
	}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = urls[:1], urls[:1]
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = urls[1:], urls[1:]
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		tb.Fatalf("start etcd: %v", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		tb.Fatal("etcd did not become ready in 30s")
	}
	tb.Cleanup(e.Close)
	return urls[0].String()
}

// startAPIServer starts the API server and returns the CA that pods are to
// trust for it: the file of the CA of its certificate for
// Options.APIServerAddress, empty without one.
func (c *Cluster) startAPIServer(etcdURL string, o Options) string {
	tb := c.tb
	storage := storagebackend.NewDefaultConfig(path.Join(uuid.New().String(), "registry"), nil)
	storage.Transport.ServerList = []string{etcdURL}
	opts := kubeapiservertesting.NewDefaultTestServerOptions()
	opts.DisableInvariantChecks = true
	flags := []string{"--service-cluster-ip-range=" + ServiceCIDR}
	if o.ControllerManager == nil {
		// No controller creates default ServiceAccounts here.
		flags = append(flags, "--disable-admission-plugins=ServiceAccount")
	}
	var rootCA string
	gates := maps.Clone(o.FeatureGates)
	if o.APIServerAddress != "" {
		certFlags, ca, err := apiServerCerts(filepath.Join(c.Dir, "pki"), o.APIServerAddress)
		if err != nil {
			tb.Fatal(err)
		}
		rootCA = ca
		// The advertised address also turns on the reconciler that
		// keeps the "kubernetes" Service's endpoints.
		flags = append(append(flags, certFlags...), "--advertise-address="+o.APIServerAddress)
		// The upstream test server gives the proxy to peer API servers
		// its own certificate's file as their CA, which is not written
		// when the certificate is ours; one API server has no peers.
		if gates == nil {
			gates = map[string]bool{}
		}
		gates["UnknownVersionInteroperabilityProxy"] = false
	}
	if len(gates) > 0 {
		var kv []string
		for k, v := range gates {
			kv = append(kv, fmt.Sprintf("%s=%t", k, v))
		}
		slices.Sort(kv)
		flags = append(flags, "--feature-gates="+strings.Join(kv, ","))
	}
	flags = append(flags, o.APIServerFlags...)
	server, err := kubeapiservertesting.StartTestServer(tb, opts, flags, storage)
	if err != nil {
		tb.Fatalf("start kube-apiserver: %v", err)
	}
	tb.Cleanup(server.TearDownFn)
	if o.APIServerAddress != "" {
		host, err := url.Parse(server.ClientConfig.Host)
		if err != nil {
			tb.Fatal(err)
		}
		f, err := forward(o.APIServerAddress, host.Host)
		if err != nil {
			tb.Fatal(err)
		}
		// Before the API server's teardown: it waits for its
		// connections to end.
		tb.Cleanup(f.close)
	}
	cfg := rest.CopyConfig(server.ClientConfig)
	cfg.QPS, cfg.Burst = 200, 400
	c.Config = cfg
	var client *kubernetes.Clientset
	client, err = kubernetes.NewForConfig(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	c.Client = client
	c.Kubeconfig = filepath.Join(c.Dir, "kubeconfig")
	if err := writeKubeconfig(cfg, c.Kubeconfig); err != nil {
		tb.Fatal(err)
	}
	return rootCA
}

// WriteKubeconfig writes a kubeconfig for the cluster that authenticates
// with a bearer token, such as a ServiceAccount's.
func (c *Cluster) WriteKubeconfig(file, token string) error {
	cfg := rest.AnonymousClientConfig(c.Config)
	cfg.BearerToken = token
	return writeKubeconfig(cfg, file)
}

// writeKubeconfig writes an admin kubeconfig for kubectl and the plugins.
func writeKubeconfig(cfg *rest.Config, file string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kyb"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, TLSServerName: cfg.ServerName}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken, ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["kyb"] = &clientcmdapi.Context{Cluster: "kyb", AuthInfo: "admin", Namespace: "default"}
	kc.CurrentContext = "kyb"
	return clientcmd.WriteToFile(*kc, file)
}

func (c *Cluster) startScheduler() {
	tb := c.tb
	evt := events.NewBroadcaster(&events.EventSinkImpl{Interface: c.Client.EventsV1()})
	evt.StartRecordingToSink(c.Ctx.Done())
	tb.Cleanup(evt.Shutdown)
	// The scheduler gets a client of its own, at the limits upstream's
	// scheduler_perf gives it: on the client the tests share, its claim
	// status writes and bindings would queue behind the tests' requests
	// and the limiter, not the scheduler, would set the pace.
	cfg := rest.CopyConfig(c.Config)
	cfg.QPS, cfg.Burst = 5000, 5000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		tb.Fatalf("scheduler client: %v", err)
	}
	inf := scheduler.NewInformerFactory(client, 0, nil)
	sched, err := scheduler.New(c.Ctx, client, inf, nil, profile.NewRecorderFactory(evt), scheduler.WithKubeConfig(cfg))
	if err != nil {
		tb.Fatalf("create scheduler: %v", err)
	}
	inf.Start(c.Ctx.Done())
	inf.WaitForCacheSync(c.Ctx.Done())
	if err := sched.WaitForHandlersSync(c.Ctx); err != nil {
		tb.Fatalf("scheduler handlers: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sched.Run(c.Ctx)
	}()
	tb.Cleanup(func() {
		c.cancel()
		<-done
		inf.Shutdown()
	})
}

// startClaimController runs the controller that creates claims from
// ResourceClaimTemplates and releases reservations of finished pods.
func (c *Cluster) startClaimController() {
	tb := c.tb
	inf := informers.NewSharedInformerFactory(c.Client, 0)
	ctrl, err := resourceclaim.NewController(klog.FromContext(c.Ctx), c.Client,
		inf.Core().V1().Pods(), inf.Scheduling().V1beta1().PodGroups(),
		inf.Resource().V1().ResourceClaims(), inf.Resource().V1().ResourceClaimTemplates())
	if err != nil {
		tb.Fatalf("create resource-claim controller: %v", err)
	}
	inf.Start(c.Ctx.Done())
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctrl.Run(c.Ctx, 5)
	}()
	tb.Cleanup(func() {
		c.cancel()
		<-done
		inf.Shutdown()
	})
}

// Node returns the node with the given name.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	c.tb.Fatalf("no node %s", name)
	return nil
}

// StopControllerManager stops kube-controller-manager, if the cluster runs
// one: no controller recreates what is deleted from then on (a node that
// is taken down deletes its DaemonSets' pods). It may be called again.
func (c *Cluster) StopControllerManager() {
	if stop := c.stopControllerManager; stop != nil {
		c.stopControllerManager = nil
		stop()
	}
}
