// Command kyb-dra-plugin is the kyb DRA kubelet plugin. Run without a
// subcommand it serves the node; `plan` prints what it would publish.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-dra-plugin/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
