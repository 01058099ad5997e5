package cli

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Command is a command's life from its arguments, environment and
// output to its exit code: what each command's app package exports as
// Run, so that tests call it like any other function.
type Command func(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int

// Hidden is a subcommand the help does not list, run before anything else
// when it is the first argument: a part of another process that runs from
// the command's own binary (the simulated MPS daemon of a node plugin).
type Hidden struct {
	Name string
	Main func(args []string, stdin io.Reader, stdout, stderr io.Writer) int
}

// Main runs run as the process: with its arguments, environment and
// output, under a context that SIGINT and SIGTERM cancel (a daemon then
// removes its sockets, so that the kubelet sees it go at once), and exits
// with its code. A hidden subcommand named by the first argument runs
// instead.
func Main(run Command, hidden ...Hidden) {
	if len(os.Args) > 1 {
		for _, h := range hidden {
			if os.Args[1] == h.Name {
				os.Exit(h.Main(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
			}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
