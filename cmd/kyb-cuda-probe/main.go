// Command kyb-cuda-probe prints, as JSON, what the CUDA driver shows this
// process: the devices it can use, their UUIDs and memory, and the GPU
// environment. `kyb-dra-plugin doctor --probe` runs it in a sandbox built
// from a seat's CDI spec.
//
// With --hold <duration> it then keeps a context and its allocation on
// each device for that long: a process that holds its GPUs, as a workload
// does, for what reads NVML's process lists (make gpu-check). In the
// doctor's sandbox, where it gets no arguments, KYB_CUDA_PROBE_HOLD says
// the same.
//
// With --try-alloc <bytes>[,<bytes>...] it allocates each size on each
// device in turn, freeing each before the next, and reports which the
// driver granted: what a seat's memory limit allows (make gpu-check
// tries one size above an MPS seat's share and one below).
// KYB_CUDA_PROBE_TRY_ALLOC says the same.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cudaprobe/driverapi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sandbox"
)

// holdEnv is --hold in the environment, tryEnv --try-alloc.
const (
	holdEnv = "KYB_CUDA_PROBE_HOLD"
	tryEnv  = "KYB_CUDA_PROBE_TRY_ALLOC"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == sandbox.EnterArg {
		err := sandbox.Enter(os.Args[2])
		fmt.Fprintln(os.Stderr, "kyb-cuda-probe:", err)
		os.Exit(sandbox.ExitCode(err))
	}
	fs := flag.NewFlagSet("kyb-cuda-probe", flag.ContinueOnError)
	hold := fs.Duration("hold", 0, "after printing, keep a context and 1 MiB on each device for this long (env "+holdEnv+")")
	try := fs.String("try-alloc", os.Getenv(tryEnv), "comma-separated sizes in bytes to allocate on each device in turn, each freed before the next (env "+tryEnv+")")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	sizes, err := parseSizes(*try)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kyb-cuda-probe: --try-alloc %q: %v\n", *try, err)
		os.Exit(2)
	}
	if v := os.Getenv(holdEnv); v != "" && *hold == 0 {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "kyb-cuda-probe: %s=%q: %v\n", holdEnv, v, err)
			os.Exit(2)
		}
		*hold = d
	}
	if *hold < 0 || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: kyb-cuda-probe [--hold <duration>]")
		os.Exit(2)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(driverapi.Probe(driverapi.Options{Hold: *hold > 0, TryAlloc: sizes})); err != nil {
		fmt.Fprintln(os.Stderr, "kyb-cuda-probe:", err)
		os.Exit(1)
	}
	// What it saw is printed before the wait: a caller reads it as soon as
	// the contexts are held.
	time.Sleep(*hold)
}

// parseSizes reads "1073741824,2147483648"; "" is none.
func parseSizes(s string) ([]uint64, error) {
	if s == "" {
		return nil, nil
	}
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q is not a size in bytes", f)
		}
		out = append(out, n)
	}
	return out, nil
}
