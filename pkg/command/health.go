package command

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// faultsPollInterval is how often a simulated node reads its
// fault-injection file: quick enough that a test's timeline is the
// plugin's, not the poll's.
const faultsPollInterval = 100 * time.Millisecond

// healthFlags are the health flags both plugins have.
type healthFlags struct {
	faultsFile string
}

func (h *healthFlags) register(f *flags) {
	f.StringVar(&h.faultsFile, "simulate-faults-file", "", "with --simulate: a file whose appended lines inject GPU faults through the simulated NVML, "+
		simnode.FaultsFileFormat)
	f.bind("simulate-faults-file", "KYB_SIMULATE_FAULTS_FILE")
}

func (h *healthFlags) check(src *nodeSource) error {
	if h.faultsFile != "" && src.simulate == "" {
		return errors.New("--simulate-faults-file needs --simulate: faults are injected into a simulated node only")
	}
	return nil
}

// startHealth starts the GPU health monitor on the node's NVML, and on a
// simulated node the watch of the fault-injection file. The returned
// function stops both; it must run before NVML is shut down.
func startHealth(ctx context.Context, node *loaded, faultsFile string) (*health.Monitor, func(), error) {
	mon, err := health.New(health.Options{NVML: node.host.NVML, Inventory: node.inv, Config: node.config.Health})
	if err != nil {
		return nil, nil, err
	}
	// The monitor registers for events before the faults file is read, so
	// that no injected fault is missed.
	mon.Start(ctx)
	if faultsFile == "" {
		return mon, mon.Stop, nil
	}
	if node.host.Simulated == nil {
		mon.Stop()
		return nil, nil, fmt.Errorf("--simulate-faults-file %s: the node is not simulated", faultsFile)
	}
	wctx, cancel := context.WithCancel(klog.NewContext(ctx, klog.FromContext(ctx).WithName("simulated-faults")))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		node.host.Simulated.WatchFaults(wctx, faultsFile, faultsPollInterval)
	}()
	return mon, func() {
		cancel()
		wg.Wait()
		mon.Stop()
	}, nil
}
