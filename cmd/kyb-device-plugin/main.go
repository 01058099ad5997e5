// Command kyb-device-plugin is the kyb device-plugin shim, for clusters
// without DRA: it serves the node's GPU seats as extended resources
// through the kubelet's device-plugin API.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kyb-ai/kyb-dra-driver/cmd/kyb-device-plugin/app"
)

func main() {
	// SIGTERM cancels the context; the shim then removes its sockets, so
	// the kubelet sees its resources go at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
