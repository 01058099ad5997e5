// Command nvidia-cuda-mps-control is the simulated MPS control daemon and
// client (package mpssim) under the real one's name, for tests
// (mpstest.Build).
package main

import (
	"os"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpssim"
)

func main() { os.Exit(mpssim.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
