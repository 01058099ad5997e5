// Command kyb-sim replays a seeded stream of seat requests over simulated
// nodes and compares placement policies, the scheduler's real DRA
// allocator over the plugin's ResourceSlices and real schedulers among them
// (docs/placement-study.md).
package main

import (
	"context"
	"os"

	"github.com/kyb-ai/kyb-dra-driver/test/placement"
)

func main() {
	if err := placement.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		os.Exit(1)
	}
}
