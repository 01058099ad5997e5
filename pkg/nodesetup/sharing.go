package nodesetup

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
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
	f.StringVar(&s.MPSControl, "mps-control", "KYB_MPS_CONTROL", "nvidia-cuda-mps-control", "command that runs nvidia-cuda-mps-control, with any prefix it needs (such as chroot /driver-root nvidia-cuda-mps-control)")
	f.IntVar(&s.MPSShmMiB, "mps-shm-size-mib", "KYB_MPS_SHM_SIZE_MIB", 0, "size of a tmpfs mounted as each MPS daemon's shm directory (its clients' /dev/shm); 0: a plain directory")
	f.StringVar(&s.MPSCgroup, "mps-cgroup", "KYB_MPS_CGROUP", "", "cgroup v2 directory the MPS daemons are moved into, so that they outlive the plugin's container (for example /sys/fs/cgroup/kyb-mps); empty: they stay in the plugin's cgroup")
}

// MPSManager returns the manager of the MPS daemons, or nil where no
// profile of the plan uses MPS. A control command that cannot be found is
// a warning, not a refusal to start: the other profiles serve, and each
// MPS claim fails with the reason.
func (s *SharingFlags) MPSManager(ctx context.Context, node *Node, pluginDir string) (*mps.Manager, error) {
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
	if _, err := exec.LookPath(control[0]); err != nil {
		klog.FromContext(ctx).Error(err, "The MPS control command is not found: claims of MPS profiles will fail to prepare until it is", "mpsControl", s.MPSControl)
	}
	m, err := mps.NewManager(mps.Options{
		Root: root, Control: control, SetExclusive: node.Host.SetExclusive,
		ShmTmpfsMiB: int64(s.MPSShmMiB), Cgroup: s.MPSCgroup,
	})
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).Info("MPS daemons of mps profiles run here", "root", root, "control", control)
	return m, nil
}
