package nodesetup

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// SharingFlags say where and how the MPS daemons of mps profiles run.
type SharingFlags struct {
	MPSRoot    string
	MPSControl string
	MPSShmMiB  int
	MPSCgroup  string
}

// AddFlags adds the sharing flags.
func (s *SharingFlags) AddFlags(f *cli.FlagSet) {
	f.StringVar(&s.MPSRoot, "mps-root", "KYB_MPS_ROOT", "", "host directory holding one directory per MPS daemon (pipe, log, shm), bind-mounted into its clients; it must have the same path in the plugin's container and on the host. Default: <plugin directory>/mps")
	f.StringVar(&s.MPSControl, "mps-control", "KYB_MPS_CONTROL", "nvidia-cuda-mps-control", "command that runs nvidia-cuda-mps-control, with any prefix it needs; a bare name found neither on PATH nor by the prefix is looked for among the driver's tools under --driver-root, and then runs with the driver's libraries and tools")
	f.IntVar(&s.MPSShmMiB, "mps-shm-size-mib", "KYB_MPS_SHM_SIZE_MIB", 0, "size of a tmpfs mounted as each MPS daemon's shm directory (its clients' /dev/shm); 0: a plain directory")
	f.StringVar(&s.MPSCgroup, "mps-cgroup", "KYB_MPS_CGROUP", "", "cgroup v2 directory the MPS daemons are moved into, so that they outlive the plugin's container (for example /sys/fs/cgroup/kyb-mps); empty: they stay in the plugin's cgroup")
}

// MPSManager returns the manager of the MPS daemons, or nil where no
// profile of the plan uses MPS. A control command that cannot be found is
// a warning, not a refusal to start: the other profiles serve, and each
// MPS claim fails with the reason.
func (s *SharingFlags) MPSManager(ctx context.Context, node *Node, pluginDir, driverRoot string) (*mps.Manager, error) {
	if !slices.ContainsFunc(node.Plan.Profiles, func(p *planner.Profile) bool { return p.Sharing == v1alpha1.SharingMPS }) {
		return nil, nil
	}
	root := s.MPSRoot
	if root == "" {
		root = filepath.Join(pluginDir, "mps")
	}
	control := strings.Fields(s.MPSControl)
	if len(control) == 0 {
		return nil, fmt.Errorf("--mps-control is empty, but a profile uses MPS")
	}
	var env []string
	if _, err := exec.LookPath(control[0]); err != nil {
		if c, e, ok := driverControl(driverRoot, control[0]); ok {
			control[0], env = c, e
		} else {
			klog.FromContext(ctx).Error(err, "The MPS control command is not found, on PATH or among the driver's tools: claims of MPS profiles will fail to prepare until it is", "mpsControl", s.MPSControl, "driverRoot", driverRoot)
		}
	}
	m, err := mps.NewManager(mps.Options{
		Root: root, Control: control, Env: env, SetExclusive: node.Host.SetExclusive,
		ShmTmpfsMiB: int64(s.MPSShmMiB), Cgroup: s.MPSCgroup,
	})
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).Info("MPS daemons of mps profiles run here", "root", root, "control", control, "env", env)
	return m, nil
}

// driverControl finds a tool of the driver under its root, as a plugin in
// a container sees a host's driver: the tool runs there with the
// container's C library and the driver's libraries (LD_LIBRARY_PATH), and
// finds the driver's other tools, such as nvidia-cuda-mps-server, first
// on its PATH.
func driverControl(driverRoot, name string) (string, []string, bool) {
	if strings.Contains(name, "/") {
		return "", nil, false
	}
	files, err := containeredits.FindDriverFiles(driverRoot, "")
	if err != nil {
		return "", nil, false
	}
	i := slices.IndexFunc(files.Binaries, func(f containeredits.DriverFile) bool { return f.Name == name })
	if i < 0 {
		return "", nil, false
	}
	var libDirs []string
	for _, l := range files.Libraries {
		if d := filepath.Dir(l.Path); !slices.Contains(libDirs, d) {
			libDirs = append(libDirs, d)
		}
	}
	tool := files.Binaries[i].Path
	env := []string{"PATH=" + filepath.Dir(tool) + ":" + os.Getenv("PATH")}
	if len(libDirs) > 0 {
		env = append(env, "LD_LIBRARY_PATH="+strings.Join(libDirs, ":"))
	}
	return tool, env, true
}
