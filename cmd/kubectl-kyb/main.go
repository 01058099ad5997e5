// Command kubectl-kyb is a kubectl plugin (kubectl kyb …): the seats of
// the cluster's kyb GPU groups, read from the API.
package main

import (
	"github.com/kyb-ai/kyb-dra-driver/cmd/kubectl-kyb/app"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cli"
)

func main() { cli.Main(app.Run) }
