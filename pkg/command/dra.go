package command

import (
	"context"
	"fmt"
	"io"
)

// DRAPlugin is the kyb-dra-plugin command: subcommand plan, or the node plugin.
func DRAPlugin(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "plan" {
		return Plan(ctx, args[1:], getenv, stdout, stderr)
	}
	fmt.Fprintln(stderr, "kyb-dra-plugin: the node plugin is not wired yet; use 'kyb-dra-plugin plan'")
	return 2
}
