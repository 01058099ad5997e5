package nodesetup

import (
	"errors"
	"fmt"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// UsageFlags configure the sampling of the GPUs' processes for the
// per-pod GPU metrics.
type UsageFlags struct {
	Interval      time.Duration
	HostProc      string
	ProcessesFile string
}

// AddFlags defines the flags.
func (u *UsageFlags) AddFlags(f *cli.FlagSet) {
	f.DurationVar(&u.Interval, "gpu-usage-interval", "KYB_GPU_USAGE_INTERVAL", 10*time.Second,
		"how often the GPUs' processes are sampled for the per-pod GPU metrics (memory, SM utilization per container and seat); 0: off. Needs --metrics-address")
	f.StringVar(&u.HostProc, "host-proc", "KYB_HOST_PROC", "/proc",
		"the host's procfs as the plugin sees it: NVML names processes by their host PIDs, whose cgroups name their pods and containers (the chart mounts the host's at /host/proc)")
	f.StringVar(&u.ProcessesFile, "simulate-processes-file", "KYB_SIMULATE_PROCESSES_FILE", "",
		"with --simulate: a file describing the processes running on the simulated GPUs, read again whenever it changes; "+simnode.ProcessesFileFormat)
}

// Check refuses a processes file without a simulated node.
func (u *UsageFlags) Check(src *Flags) error {
	switch {
	case u.ProcessesFile != "" && src.Simulate == "":
		return errors.New("--simulate-processes-file needs --simulate: processes are simulated on a simulated node only")
	case u.Interval < 0:
		return fmt.Errorf("--gpu-usage-interval %s is negative", u.Interval)
	}
	return nil
}

// Sampler returns the node's GPU usage sampler, or nil when sampling is
// off.
func (u *UsageFlags) Sampler(node *Node) *gpuusage.Sampler {
	if u.Interval == 0 {
		return nil
	}
	var cgroups gpuusage.CgroupReader = gpuusage.ProcCgroups{Root: u.HostProc}
	sim := node.Host.Simulated
	if sim != nil {
		sim.SetProcessesFile(u.ProcessesFile)
		cgroups = sim.Cgroups(cgroups)
	}
	var gpus []gpuusage.GPU
	for _, g := range node.Inv.GPUs {
		gpus = append(gpus, gpuusage.GPU{Index: g.Index, UUID: g.UUID})
	}
	s := gpuusage.NewSampler(node.Host.NVML, gpus, cgroups)
	if sim != nil {
		s.SetSourceCheck(sim.ProcessesError)
	}
	return s
}
