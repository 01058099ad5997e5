package nodesetup

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// faultsPollInterval is how often a simulated node reads its
// fault-injection file: quick enough that a test's timeline is the
// plugin's, not the poll's.
const faultsPollInterval = 100 * time.Millisecond

// HealthFlags are the health flags both daemons have.
type HealthFlags struct {
	FaultsFile string
}

// AddFlags defines the flags.
func (h *HealthFlags) AddFlags(f *cli.FlagSet) {
	f.StringVar(&h.FaultsFile, "simulate-faults-file", "KYB_SIMULATE_FAULTS_FILE", "", "with --simulate: a file whose appended lines inject GPU faults through the simulated NVML, "+
		simnode.FaultsFileFormat)
}

// Check refuses a faults file without a simulated node.
func (h *HealthFlags) Check(src *Flags) error {
	if h.FaultsFile != "" && src.Simulate == "" {
		return errors.New("--simulate-faults-file needs --simulate: faults are injected into a simulated node only")
	}
	return nil
}

// StartHealth starts the GPU health monitor on the node's NVML, and on a
// simulated node the watch of the fault-injection file. The returned
// function stops both; it must run before NVML is shut down.
func StartHealth(ctx context.Context, node *Node, flags HealthFlags) (*health.Monitor, func(), error) {
	mon, err := health.New(health.Options{NVML: node.Host.NVML, Inventory: node.Inv, Config: node.Config.Health})
	if err != nil {
		return nil, nil, err
	}
	// The monitor registers for events before the faults file is read, so
	// that no injected fault is missed.
	mon.Start(ctx)
	if flags.FaultsFile == "" {
		return mon, mon.Stop, nil
	}
	if node.Host.Simulated == nil {
		mon.Stop()
		return nil, nil, fmt.Errorf("--simulate-faults-file %s: the node is not simulated", flags.FaultsFile)
	}
	wctx, cancel := context.WithCancel(klog.NewContext(ctx, klog.LoggerWithName(klog.FromContext(ctx), "simulated-faults")))
	var wg sync.WaitGroup
	wg.Go(func() { node.Host.Simulated.WatchFaults(wctx, flags.FaultsFile, faultsPollInterval) })
	return mon, func() {
		cancel()
		wg.Wait()
		mon.Stop()
	}, nil
}
