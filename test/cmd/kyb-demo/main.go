// Command kyb-demo runs the local demo (make demo): a simulated cluster with
// the driver, the demo specs applied, and what every pod got.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/test/demo"
)

func main() { os.Exit(run()) }

func run() int {
	var opts demo.Options
	nodes := flag.String("nodes", "dgx-h100", "simulated nodes, comma-separated presets or NodeTopology files (one node each)")
	flag.StringVar(&opts.Config, "config", "demo/node-config.yaml", "node configuration of every node")
	flag.StringVar(&opts.Classes, "deviceclasses", "deployments/static/deviceclasses.yaml", "DeviceClasses to create")
	flag.StringVar(&opts.Specs, "specs", "demo/specs", "directory of specs to apply")
	flag.BoolVar(&opts.Keep, "keep", false, "keep the cluster running until Ctrl-C")
	flag.StringVar(&opts.Kubectl, "kubectl", "bin/kubectl", "kubectl to suggest with -keep")
	logFile := flag.String("log", "_output/demo.log", "where the components' logs go")
	flag.Parse()
	opts.Presets = strings.Split(*nodes, ",")

	if err := os.MkdirAll("_output", 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	log, err := os.Create(*logFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = log.Close() }()
	// The control plane logs a lot; keep it out of the story.
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := klogFlags.Set(k, v); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	klog.SetOutput(log)
	opts.LogFile = *logFile

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := demo.Run(ctx, opts, os.Stdout, log); err != nil {
		fmt.Fprintf(os.Stderr, "kyb-demo: %v (logs: %s)\n", err, *logFile)
		return 1
	}
	return 0
}
