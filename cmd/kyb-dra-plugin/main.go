// Command kyb-dra-plugin is the kyb DRA kubelet plugin. Run without a
// subcommand it serves the node; `plan` prints what it would publish.
// `mps-control-sim` is the MPS daemon of a simulated node (package
// mpssim), which the plugin runs from its own binary; the help does not
// list it, since only the plugin runs it.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-dra-plugin/app"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpssim"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == mpssim.Command {
		os.Exit(mpssim.Main(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
