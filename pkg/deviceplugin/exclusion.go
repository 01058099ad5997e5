package deviceplugin

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
)

// A node runs the DRA plugin or the shim, never both: each would hand out
// the same GPUs without knowing of the other's seats, and the scheduler
// would count them twice (once as ResourceSlice devices, once as extended
// resources). Each refuses to start while the other's socket answers. A
// socket file that nobody listens on (left behind by a crash) is not live:
// only a successful dial counts, so a stale file never blocks a start.

// dialTimeout bounds the liveness dial. A listening unix socket accepts at
// once; a stale one refuses at once.
const dialTimeout = time.Second

// socketPattern matches the sockets of the shim in the device-plugin
// directory.
const socketPattern = "kyb-*.sock"

// CheckNoLiveShim returns an error when a socket of the device-plugin shim
// in dir (the kubelet's device-plugin directory) answers. The DRA plugin
// calls it before it starts.
func CheckNoLiveShim(dir string) error {
	live := liveSockets(filepath.Join(dir, socketPattern))
	if len(live) == 0 {
		return nil
	}
	return fmt.Errorf("the kyb device-plugin shim serves this node (%s answers): a node runs the DRA plugin or the shim, never both, or the same GPUs are handed out twice; remove the shim from this node first", strings.Join(live, ", "))
}

// CheckNoLiveDRA returns an error when the kyb DRA plugin's socket in
// pluginsDir (the kubelet's plugin directory) answers. The shim calls it
// before it starts.
func CheckNoLiveDRA(pluginsDir string) error {
	// dra.sock, or dra-<pod UID>.sock with rolling updates.
	live := liveSockets(filepath.Join(pluginsDir, draresources.DriverName, "dra*.sock"))
	if len(live) == 0 {
		return nil
	}
	return fmt.Errorf("the kyb DRA plugin serves this node (%s answers): a node runs the DRA plugin or the shim, never both, or the same GPUs are handed out twice; remove the DRA plugin from this node first", strings.Join(live, ", "))
}

// liveSockets returns the files matching pattern that accept a connection.
func liveSockets(pattern string) []string {
	// Glob fails only on a malformed pattern, and ours are constant.
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
	conn.Close()
	return true
}
