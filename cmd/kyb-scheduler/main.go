// Command kyb-scheduler is kube-scheduler with the driver's placement
// score for GPU seats, gang scheduling on, and the allocator patches
// (package app; docs/kyb-scheduler.md).
package main

import (
	"fmt"
	"os"

	"k8s.io/component-base/cli"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-scheduler/app"
)

func main() {
	cmd, err := app.NewCommand()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kyb-scheduler: %v\n", err)
		os.Exit(1)
	}
	os.Exit(cli.Run(cmd))
}
