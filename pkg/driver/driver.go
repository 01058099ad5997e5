// Package driver identifies the kyb driver on a node for both of its
// binaries: its name, where each of its two surfaces (the DRA kubelet
// plugin and the device-plugin shim) keeps its sockets, and the check that
// keeps a node from running both.
//
// A node runs the DRA plugin or the shim, never both: each would hand out
// the same GPUs without knowing of the other's seats, and the scheduler
// would count them twice (once as ResourceSlice devices, once as extended
// resources). Each refuses to start while the other's socket answers. A
// socket file that nobody listens on (left behind by a crash) is not live:
// only a successful dial counts, so a stale file never blocks a start.
//
// A surface that stopped leaves its pods running on the GPUs it handed
// out, and the kubelet keeps them: each refuses to start, too, while the
// kubelet's PodResources API lists a container holding the other's devices
// (CheckNoShimPods, CheckNoDRAPods). A node changes surface drained.
//
// It imports no Kubernetes client code, so that the shim, which never
// talks to the API server, links none.
package driver

import (
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Name is the DRA driver name, and the domain of the attributes and taints
// the driver publishes.
const Name = "gpu.kyb.ai"

// ProfileSelector is the CEL selector of a profile's DeviceClass: the
// driver's devices whose attribute profile names it. kyb-scheduler, which
// links none of the node's code, builds the same selector from here.
func ProfileSelector(profile string) string {
	return fmt.Sprintf(`device.driver == %q && device.attributes[%q].profile == %q`, Name, Name, profile)
}

// ShimSocketGlob matches the shim's sockets in the kubelet's device-plugin
// directory: one per resource, kyb-<resource name after the domain>.sock.
const ShimSocketGlob = "kyb-*.sock"

// draSocketGlob matches the DRA plugin's sockets in its plugin directory:
// dra.sock, or dra-<pod UID>.sock with rolling updates.
const draSocketGlob = "dra*.sock"

// dialTimeout bounds the liveness dial. A listening unix socket accepts at
// once; a stale one refuses at once.
const dialTimeout = time.Second

// PluginDir is the DRA plugin's directory under the kubelet's plugin
// directory: its socket and its checkpoint live there.
func PluginDir(kubeletPluginsDir string) string {
	return filepath.Join(kubeletPluginsDir, Name)
}

// CheckNoLiveShim returns an error when a socket of the device-plugin shim
// in devicePluginDir (the kubelet's device-plugin directory) answers. The
// DRA plugin calls it before it starts.
func CheckNoLiveShim(devicePluginDir string) error {
	live := LiveSockets(filepath.Join(devicePluginDir, ShimSocketGlob))
	if len(live) == 0 {
		return nil
	}
	return fmt.Errorf("the kyb device-plugin shim serves this node (%s answers): a node runs the DRA plugin or the shim, never both, or the same GPUs are handed out twice; remove the shim from this node first", strings.Join(live, ", "))
}

// CheckNoLiveDRA returns an error when the DRA plugin's socket under
// kubeletPluginsDir (the kubelet's plugin directory) answers. The shim
// calls it before it starts.
func CheckNoLiveDRA(kubeletPluginsDir string) error {
	live := LiveSockets(filepath.Join(PluginDir(kubeletPluginsDir), draSocketGlob))
	if len(live) == 0 {
		return nil
	}
	return fmt.Errorf("the kyb DRA plugin serves this node (%s answers): a node runs the DRA plugin or the shim, never both, or the same GPUs are handed out twice; remove the DRA plugin from this node first", strings.Join(live, ", "))
}

// ResourceDomain is the domain of the extended resources the shim serves
// by default (kyb.ai/gpu-1x-seat).
const ResourceDomain = "kyb.ai"

// ShimResource says whether an extended resource is one the shim serves,
// or served under an earlier configuration: in ResourceDomain, or one of
// configured (the node configuration's profiles' resources).
func ShimResource(configured []string) func(resource string) bool {
	return func(resource string) bool {
		return strings.HasPrefix(resource, ResourceDomain+"/") || slices.Contains(configured, resource)
	}
}

// ShimMIGClaimPrefix begins the MIG journal's claim of an instance the
// shim made or adopted for a seat: device-plugin/<seat ID>.
const ShimMIGClaimPrefix = "device-plugin/"

// ShimDevices says whether a container's device-plugin devices (their
// resource and IDs, as the kubelet lists them) are seats the shim handed
// out: of a resource ShimResource(configured) accepts, or, whatever the
// resource, with an ID among seatIDs (planner.Plan.ShimDeviceIDs) or
// named by one of migClaims (the MIG journal's records' claims, those of
// the shim's seats ShimMIGClaimPrefix and the seat's ID). The shim serves
// any resource name its configuration gives (nvidia.com/mig-1g.10gb keeps
// NVIDIA's device plugin's workloads unchanged), and the configuration may
// change between the shim and the DRA plugin; a seat's ID is the shim's
// own, and names the DRA plugin's device over the same GPU or instance.
func ShimDevices(configured, seatIDs, migClaims []string) func(resource string, ids []string) bool {
	shim := ShimResource(configured)
	seats := map[string]bool{}
	for _, id := range seatIDs {
		seats[id] = true
	}
	for _, c := range migClaims {
		if id, ok := strings.CutPrefix(c, ShimMIGClaimPrefix); ok {
			seats[id] = true
		}
	}
	return func(resource string, ids []string) bool {
		return shim(resource) || slices.ContainsFunc(ids, func(id string) bool { return seats[id] })
	}
}

// maxHolders bounds the containers an error names.
const maxHolders = 10

// CheckNoShimPods returns an error when holders (containers, as
// podresources.Listing.ResourceHolders names them) hold devices of the
// shim's resources. The DRA plugin calls it before it starts: it would
// hand their GPUs out again, and destroy the MIG instances of their seats.
func CheckNoShimPods(holders []string) error {
	if len(holders) == 0 {
		return nil
	}
	return fmt.Errorf("pods still hold GPUs the kyb device-plugin shim handed out (%s): the DRA plugin would hand the same GPUs out again and destroy the MIG instances of their seats; drain the node of them (kubectl drain, or delete those pods), then start the DRA plugin", listHolders(holders))
}

// CheckNoDRAPods returns an error when holders (containers, as
// podresources.Listing.DriverHolders names them) hold devices the DRA
// plugin prepared. The shim calls it before it starts: it would hand
// their GPUs out again.
func CheckNoDRAPods(holders []string) error {
	if len(holders) == 0 {
		return nil
	}
	return fmt.Errorf("pods still hold GPUs the kyb DRA plugin prepared (%s): the shim would hand the same GPUs out again; drain the node of them (kubectl drain, or delete those pods), then start the shim", listHolders(holders))
}

func listHolders(holders []string) string {
	if len(holders) <= maxHolders {
		return strings.Join(holders, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(holders[:maxHolders], "; "), len(holders)-maxHolders)
}

// LiveSockets returns the files matching pattern that accept a connection.
func LiveSockets(pattern string) []string {
	// Glob fails only on a malformed pattern, and callers pass constant
	// ones.
	matches, _ := filepath.Glob(pattern)
	var live []string
	for _, m := range matches {
		if isLive(m) {
			live = append(live, m)
		}
	}
	return live
}

func isLive(path string) bool {
	conn, err := net.DialTimeout("unix", path, dialTimeout)
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}
