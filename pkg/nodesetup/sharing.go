package nodesetup

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/groupshare"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpssim"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// SharingFlags say where and how the MPS daemons of mps profiles run.
type SharingFlags struct {
	MPSRoot    string
	MPSControl string
	MPSShm     ShmSize
	MPSCgroup  string
	// MPSPipeReadOnly mounts the daemons' pipe directories read-only
	// into containers.
	MPSPipeReadOnly bool
}

// AddFlags adds the sharing flags.
func (s *SharingFlags) AddFlags(f *cli.FlagSet) {
	f.StringVar(&s.MPSRoot, "mps-root", "KYB_MPS_ROOT", "", "host directory holding one directory per MPS daemon (pipe, log, shm), bind-mounted into its clients; it must have the same path in the plugin's container and on the host, belong to the plugin's user, be writable by no one else, and be reached through directories only root or that user can change (docs/security.md). Default: <plugin directory>/mps")
	f.StringVar(&s.MPSControl, "mps-control", "KYB_MPS_CONTROL", "", "command that runs nvidia-cuda-mps-control, with any prefix it needs; a bare name found neither on PATH nor by the prefix is looked for among the driver's tools under --driver-root, and then runs with the driver's libraries and tools. Default: nvidia-cuda-mps-control; on a simulated node (--simulate), this binary's own simulated daemon ('<this binary> "+mpssim.Command+"')")
	s.MPSShm = ShmSize{MiB: mps.DefaultShmTmpfsMiB}
	f.Var(&s.MPSShm, "mps-shm-size-mib", "KYB_MPS_SHM_SIZE_MIB", "MiB of the tmpfs mounted as each MPS daemon's shm directory, which all the containers of its group share as their /dev/shm; mounting needs CAP_SYS_ADMIN. \""+mps.ShmSizeUnbounded+"\": a plain directory on the host's disk instead, which any tenant of the group may fill (0 is refused)")
	f.StringVar(&s.MPSCgroup, "mps-cgroup", "KYB_MPS_CGROUP", "", "cgroup v2 directory the MPS daemons are moved into, so that they outlive the plugin's container (for example /sys/fs/cgroup/kyb-mps); empty: they stay in the plugin's cgroup")
	f.BoolVar(&s.MPSPipeReadOnly, "mps-pipe-read-only", "KYB_MPS_PIPE_READ_ONLY", true, "mount each MPS daemon's pipe directory read-only into its clients, which then cannot remove or replace the daemon's sockets; false mounts it read-write")
}

// Hardware is how this node applies the profiles' sharing strategies:
// the MPS daemons (MPSManager) and the GPUs' time slices. Both surfaces
// are handed the one it returns.
func (s *SharingFlags) Hardware(ctx context.Context, node *Node, pluginDir, driverRoot, bootID string) (*groupshare.Hardware, error) {
	m, err := s.MPSManager(ctx, node, pluginDir, driverRoot, bootID)
	if err != nil {
		return nil, err
	}
	return &groupshare.Hardware{Inv: node.Inv, MPS: m, SetTimeSlice: node.Host.SetTimeSlice}, nil
}

// MPSManager returns the manager of the MPS daemons, or nil where no
// profile of the plan uses MPS. A control command that cannot be found is
// a warning, not a refusal to start: the other profiles serve, and each
// MPS claim fails with the reason. bootID is the node's (BootIDFlag).
func (s *SharingFlags) MPSManager(ctx context.Context, node *Node, pluginDir, driverRoot, bootID string) (*mps.Manager, error) {
	if !slices.ContainsFunc(node.Plan.Profiles, func(p *planner.Profile) bool { return p.Sharing == v1alpha1.SharingMPS }) {
		return nil, nil
	}
	root := s.MPSRoot
	if root == "" {
		root = filepath.Join(pluginDir, "mps")
	}
	control, err := s.control(node)
	if err != nil {
		return nil, err
	}
	var env []string
	if _, err := exec.LookPath(control[0]); err != nil {
		if strings.Contains(control[0], "/") {
			klog.FromContext(ctx).Error(err, "The MPS control command is not found: claims of MPS profiles will fail to prepare until it is", "mpsControl", s.MPSControl)
		} else if c, e, derr := driverControl(driverRoot, control[0], filepath.Join(pluginDir, "mps-driver")); derr != nil {
			klog.FromContext(ctx).Error(derr, "The MPS control command is neither on PATH nor among the driver's tools: claims of MPS profiles will fail to prepare until it is", "mpsControl", s.MPSControl, "path", err.Error())
		} else {
			control[0], env = c, e
		}
	}
	m, err := mps.NewManager(mps.Options{
		Root: root, Control: control, Env: env, SetExclusive: node.Host.SetExclusive,
		ShmTmpfsMiB: s.MPSShm.MiB, ShmUnbounded: s.MPSShm.Unbounded, Cgroup: s.MPSCgroup, ClientPipeWritable: !s.MPSPipeReadOnly,
		BootID: bootID,
	})
	if err != nil {
		return nil, err
	}
	if err := m.CheckShm(); err != nil {
		klog.FromContext(ctx).Error(err, "Claims of MPS profiles will fail to prepare until the plugin may mount (or --mps-shm-size-mib is "+mps.ShmSizeUnbounded+")")
	}
	klog.FromContext(ctx).Info("MPS daemons of mps profiles run here", "root", root, "control", control, "env", env, "pipeReadOnly", s.MPSPipeReadOnly, "shmSizeMiB", s.MPSShm.String())
	return m, nil
}

// ShmSize is --mps-shm-size-mib: the MiB of each MPS daemon's shm tmpfs,
// or Unbounded: a plain directory. A bare 0 is refused, so that nobody
// gets unbounded directories by mistaking 0 for a default.
type ShmSize struct {
	MiB       int64
	Unbounded bool
}

// String is the flag's value.
func (s *ShmSize) String() string {
	switch {
	case s == nil:
		return ""
	case s.Unbounded:
		return mps.ShmSizeUnbounded
	}
	return strconv.FormatInt(s.MiB, 10)
}

// Set parses a size in MiB, or "unbounded".
func (s *ShmSize) Set(v string) error {
	if v == mps.ShmSizeUnbounded {
		*s = ShmSize{Unbounded: true}
		return nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil:
		return fmt.Errorf("want a size in MiB or %q", mps.ShmSizeUnbounded)
	case n == 0:
		return fmt.Errorf("0 would leave each MPS daemon's shm directory unbounded on the host's disk: give a size in MiB, or %q to mean that", mps.ShmSizeUnbounded)
	case n < 0:
		return fmt.Errorf("want a positive size in MiB or %q", mps.ShmSizeUnbounded)
	}
	*s = ShmSize{MiB: n}
	return nil
}

// control is the MPS control command: the operator's, else the driver's
// nvidia-cuda-mps-control, else on a simulated node, which has no driver,
// the simulated daemon this very binary runs (mpssim). It is named by its
// absolute path, found now: the daemon outlives the plugin, and a plugin
// started again must run the same binary to reach it.
func (s *SharingFlags) control(node *Node) ([]string, error) {
	if s.MPSControl != "" {
		control := strings.Fields(s.MPSControl)
		if len(control) == 0 {
			return nil, fmt.Errorf("--mps-control %q names no command, but a profile uses MPS", s.MPSControl)
		}
		return control, nil
	}
	if node.Host.Simulated == nil {
		return []string{"nvidia-cuda-mps-control"}, nil
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this binary, whose simulated MPS daemon a simulated node runs (or set --mps-control): %w", err)
	}
	return []string{self, mpssim.Command}, nil
}

// driverControl finds a tool of the driver under its root, as a plugin in
// a container sees a host's driver, and makes it runnable there: with the
// container's C library and loader, and the driver's own libraries and
// tools, and nothing else of the host's (its libc beside them would not
// match the container's loader). It links those into dir, which it makes
// anew, and returns the tool's link and the environment that finds them:
// the daemon loads libcuda.so.1 from LD_LIBRARY_PATH and starts
// nvidia-cuda-mps-server from PATH.
func driverControl(driverRoot, name, dir string) (string, []string, error) {
	files, err := containeredits.FindDriverFiles(driverRoot, "")
	if err != nil {
		return "", nil, err
	}
	if !slices.ContainsFunc(files.Binaries, func(f containeredits.DriverFile) bool { return f.Name == name }) {
		return "", nil, fmt.Errorf("no %s among the driver's tools under %s", name, driverRoot)
	}
	lib, bin := filepath.Join(dir, "lib"), filepath.Join(dir, "bin")
	if err := os.RemoveAll(dir); err != nil {
		return "", nil, fmt.Errorf("link the driver's files: %w", err)
	}
	for _, f := range append(slices.Clone(files.Libraries), files.Binaries...) {
		to := bin
		if f.Library {
			to = lib
		}
		if err := os.MkdirAll(to, 0o755); err != nil {
			return "", nil, fmt.Errorf("link the driver's files: %w", err)
		}
		if err := os.Symlink(f.Path, filepath.Join(to, f.Name)); err != nil {
			return "", nil, fmt.Errorf("link the driver's files: %w", err)
		}
	}
	return filepath.Join(bin, name), []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "LD_LIBRARY_PATH=" + lib}, nil
}
