// Command kyb-scheduler is kube-scheduler with the driver's placement
// score for GPU seats, preemption that frees devices, gang scheduling
// on, and the allocator patches (package app; docs/kyb-scheduler.md).
package main

import (
	"fmt"
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/metrics/legacyregistry"

	// What kube-scheduler's main registers: the JSON log format
	// (--logging-format=json), client-go's metrics (leader election, REST
	// client, workqueue) and the build's version metric.
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-scheduler/app"
	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-scheduler/placement"
)

func main() {
	// kube-scheduler serves the legacy registry on /metrics.
	m := placement.NewMetrics()
	legacyregistry.MustRegister(m.Collectors()...)
	legacyregistry.CustomMustRegister(m.StableCollectors()...)
	cmd, err := app.NewCommand(m)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kyb-scheduler: %v\n", err)
		os.Exit(1)
	}
	os.Exit(cli.Run(cmd))
}
