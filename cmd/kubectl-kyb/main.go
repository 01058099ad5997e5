// Command kubectl-kyb is a kubectl plugin (kubectl kyb …): the seats of
// the cluster's kyb GPU groups, read from the API.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kubectl-kyb/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
