// Command nvidia-cuda-mps-control is a simulated MPS control daemon and
// client, for tests only (package mpstest).
package main

import (
	"os"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

func main() { os.Exit(mpstest.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
