// Package mpstest runs the simulated nvidia-cuda-mps-control of package
// mpssim for tests: Build makes a binary of it named as the real one,
// Join stands for a CUDA process joining a daemon, Commands reads what a
// daemon was told, Daemons finds the daemons that run. Tests and
// simulated nodes (kyb-dra-plugin mps-control-sim) run the same
// simulator; only the binary differs.
package mpstest

import "github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpssim"

// Misdirected starts the log line of a connection that reached a daemon
// through another pipe directory than its own.
const Misdirected = mpssim.Misdirected

// The daemons' environment variables: LogEnv names a file every daemon
// appends its log lines to; OutliveDirEnv keeps a daemon running once its
// pipe directory is gone, as a real one does.
const (
	LogEnv        = mpssim.LogEnv
	OutliveDirEnv = mpssim.OutliveDirEnv
)
