package realnode

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/kubernetes/test/utils/ktesting"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// A pod network on one machine, as kind and minikube make one: the CNI
// bridge plugin attaches each pod to a bridge and gives it an address of
// the pod range (host-local), and kube-proxy (nftables mode) sends the
// "kubernetes" Service's ClusterIP to the API server. The API server is
// reached at an address of its own, on an interface of its own: pods
// cannot reach the machine's loopback, and the machine's own addresses
// differ from one machine to the next. The interface is one end of a veth
// pair, which every kernel that runs pods has (the dummy driver, the
// usual choice, is not built into every VM's kernel). Both ranges are
// documentation ranges (RFC 5737), which nothing routes.
const (
	// APIServerAddress is the API server's address for pods
	// (harness.Options.APIServerAddress).
	APIServerAddress = "203.0.113.1"
	// PodCIDR is the pods' range; its first address is the bridge's, the
	// pods' gateway.
	PodCIDR = "198.51.100.0/24"
	// The network's interfaces; every interface a node makes is named
	// kyb-* (Leftovers).
	apiLink, apiPeer = "kyb-api0", "kyb-api1"
	bridgeLink       = "kyb-br0"
	// cniNetwork names the pod network in CNI's configuration and cache.
	cniNetwork = "kyb-pods"
	// CNIPluginDir is where Debian's containernetworking-plugins are.
	CNIPluginDir = "/usr/lib/cni"
	// cniCacheDir is where the CNI library keeps what it set up for each
	// pod; containerd does not move it.
	cniCacheDir = "/var/lib/cni"
	ipForward   = "/proc/sys/net/ipv4/ip_forward"
)

// Network is the machine's pod network for a real node
// (Options.Network): its interface with APIServerAddress, made by
// NewNetwork; the bridge the CNI plugin makes for the first pod; and what
// the network changed on the machine, put back when tb cleans up, after
// the cluster and the node have gone.
type Network struct {
	// APIServerAddress and PodCIDR are the constants above.
	APIServerAddress, PodCIDR string

	// ipForward is net.ipv4.ip_forward before the network: the bridge
	// plugin turns it on for the pods' gateway.
	ipForward string
	// cniCache tells whether cniCacheDir was there before.
	cniCache bool
	// links are the machine's interfaces before the network.
	links []string
}

// NewNetwork makes the machine's pod network: an interface with
// APIServerAddress, for a cluster to be started with
// harness.Options{APIServerAddress: APIServerAddress} and a node with
// Options.Network. One network at a time runs on a machine.
func NewNetwork(tb ktesting.TB) *Network {
	tb.Helper()
	for _, tool := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(CNIPluginDir, tool)); err != nil {
			tb.Fatalf("the CNI plugins (Debian's containernetworking-plugins; make e2e-node installs them): %v", err)
		}
	}
	if err := inUse(APIServerAddress, PodCIDR); err != nil {
		tb.Fatal(err)
	}
	nw := &Network{APIServerAddress: APIServerAddress, PodCIDR: PodCIDR}
	if b, err := os.ReadFile(ipForward); err == nil {
		nw.ipForward = strings.TrimSpace(string(b))
	}
	_, err := os.Stat(cniCacheDir)
	nw.cniCache = err == nil
	nw.links = links()
	tb.Cleanup(func() {
		nw.clean()
		// A pod's interface outlives the node when its sandbox was
		// not torn down: its network namespace lives on while the
		// pod's connections time out.
		if left := added(links(), nw.links); len(left) > 0 {
			tb.Errorf("the pod network left interfaces behind: %v", left)
		}
	})
	for _, args := range [][]string{
		{"link", "add", apiLink, "type", "veth", "peer", "name", apiPeer},
		{"addr", "add", APIServerAddress + "/32", "dev", apiLink},
		{"link", "set", apiPeer, "up"},
		{"link", "set", apiLink, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			tb.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return nw
}

// inUse fails if an interface of the machine already has an address in
// the network's ranges, or a kyb-* interface is there: another network
// runs, or the machine uses the ranges itself.
func inUse(address, cidr string) error {
	_, pods, err := net.ParseCIDR(cidr)
	if err != nil {
		return err
	}
	api := net.ParseIP(address)
	ifaces, err := net.Interfaces()
	if err != nil {
		return fmt.Errorf("the machine's interfaces: %w", err)
	}
	for _, i := range ifaces {
		if strings.HasPrefix(i.Name, "kyb-") {
			return fmt.Errorf("interface %s is there: another real node's network runs, or one was left behind", i.Name)
		}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && (ipn.IP.Equal(api) || pods.Contains(ipn.IP) || ipn.Contains(api)) {
				return fmt.Errorf("interface %s has %s, which the pod network (API server %s, pods %s) needs", i.Name, a, address, cidr)
			}
		}
	}
	return nil
}

// cniConfig is the CNI configuration of a node on the network: pods on
// the bridge, their addresses from the pod range, kept under dir; the
// bridge is their gateway and the way to the machine, and so to the API
// server.
func (nw *Network) cniConfig(dir string) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [{
    "type": "bridge",
    "bridge": %q,
    "isGateway": true,
    "ipMasq": false,
    "ipam": {
      "type": "host-local",
      "ranges": [[{"subnet": %q}]],
      "routes": [{"dst": "0.0.0.0/0"}],
      "dataDir": %q
    }
  }]
}`, cniNetwork, bridgeLink, nw.PodCIDR, filepath.Join(dir, "ipam"))
}

// clean removes the interfaces (the veth pair goes with either end), and
// what the CNI library and plugins left:
// its cache of the network's pods, the bridge, the forwarding setting.
func (nw *Network) clean() {
	// The pods' ends of their veth pairs: a pod that was not torn down
	// (its node stopped under it) leaves its pair, which a network
	// namespace kept alive by its connections keeps.
	if out, err := exec.Command("ip", "-o", "link", "show", "master", bridgeLink).Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 1 {
				name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
				_ = exec.Command("ip", "link", "del", name).Run()
			}
		}
	}
	for _, l := range []string{bridgeLink, apiLink} {
		if _, err := net.InterfaceByName(l); err == nil {
			_ = exec.Command("ip", "link", "del", l).Run()
		}
	}
	results, _ := filepath.Glob(filepath.Join(cniCacheDir, "results", cniNetwork+"-*"))
	for _, r := range results {
		_ = os.Remove(r)
	}
	if !nw.cniCache {
		_ = os.RemoveAll(cniCacheDir)
	}
	if nw.ipForward != "" {
		_ = os.WriteFile(ipForward, []byte(nw.ipForward+"\n"), 0o644)
	}
}

// startKubeProxy runs kube-proxy for the node, in nftables mode, and waits
// until it has written the rules of the "kubernetes" Service. It leaves
// the machine's conntrack settings as they are (a test's connections
// are few). It runs as a process, as on a node: kube-proxy's Run never
// returns (its loops run until the process ends), so in this process it
// would outlive its cluster.
func (n *Node) startKubeProxy(tb ktesting.TB) {
	tb.Helper()
	var ports [2]int
	for i := range ports {
		port, err := harness.FreePort()
		if err != nil {
			tb.Fatal(err)
		}
		ports[i] = port
	}
	p, err := startProcess("kube-proxy", filepath.Join(n.Dir, "kube-proxy.log"), nil, filepath.Join(n.tools.Dir, "kube-proxy"),
		"--kubeconfig", n.c.Kubeconfig,
		"--hostname-override", n.Name,
		"--proxy-mode", "nftables",
		"--cluster-cidr", n.Options.Network.PodCIDR,
		"--conntrack-max-per-core", "0",
		"--conntrack-tcp-timeout-established", "0",
		"--conntrack-tcp-timeout-close-wait", "0",
		"--healthz-bind-address", fmt.Sprintf("127.0.0.1:%d", ports[0]),
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--v", "2",
	)
	if err != nil {
		tb.Fatal(err)
	}
	n.kubeProxy = p
	waitFor(tb, "kube-proxy's rules for the kubernetes Service", p, 60*time.Second, func() bool {
		out, err := exec.Command("nft", "list", "table", "ip", "kube-proxy").Output()
		return err == nil && strings.Contains(string(out), harness.KubernetesServiceIP)
	})
}

// stopKubeProxy stops kube-proxy and removes its rules, as
// `kube-proxy --cleanup` does in nftables mode: its table of each family.
func (n *Node) stopKubeProxy() {
	if n.kubeProxy == nil {
		return
	}
	n.kubeProxy.stop(10 * time.Second)
	n.kubeProxy = nil
	for _, family := range []string{"ip", "ip6"} {
		_ = exec.Command("nft", "delete", "table", family, "kube-proxy").Run()
	}
}

// links returns the names of the machine's interfaces.
func links() []string {
	ifaces, _ := net.Interfaces()
	var out []string
	for _, i := range ifaces {
		out = append(out, i.Name)
	}
	return out
}

// added returns the names in now that are not in before.
func added(now, before []string) []string {
	var out []string
	for _, x := range now {
		if !slices.Contains(before, x) {
			out = append(out, x)
		}
	}
	return out
}

// networkLeftovers lists what a network, its kube-proxy or a kubelet left
// on the machine: interfaces named kyb-*, kube-proxy's nftables tables,
// iptables chains of Kubernetes (KUBE-*), the CNI cache of the network's
// pods.
func networkLeftovers() []string {
	var out []string
	ifaces, _ := net.Interfaces()
	for _, i := range ifaces {
		if strings.HasPrefix(i.Name, "kyb-") {
			out = append(out, "interface "+i.Name)
		}
	}
	if tables, err := exec.Command("nft", "list", "tables").Output(); err == nil {
		for _, l := range strings.Split(string(tables), "\n") {
			if strings.HasSuffix(strings.TrimSpace(l), " kube-proxy") {
				out = append(out, "nftables "+strings.TrimSpace(l))
			}
		}
	}
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		rules, err := exec.Command(save).Output()
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(rules), "\n") {
			if strings.HasPrefix(l, ":KUBE-") {
				chain, _, _ := strings.Cut(l[1:], " ")
				out = append(out, save+" chain "+chain)
			}
		}
	}
	results, _ := filepath.Glob(filepath.Join(cniCacheDir, "results", cniNetwork+"-*"))
	return append(out, results...)
}
