// Command kyb-cuda-probe prints, as JSON, what the CUDA driver shows this
// process: the devices it can use, their UUIDs and memory, and the GPU
// environment. `kyb-dra-plugin doctor --probe` runs it in a sandbox built
// from a seat's CDI spec.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cudaprobe/driverapi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sandbox"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == sandbox.EnterArg {
		err := sandbox.Enter(os.Args[2])
		fmt.Fprintln(os.Stderr, "kyb-cuda-probe:", err)
		os.Exit(sandbox.ExitCode(err))
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(driverapi.Run()); err != nil {
		fmt.Fprintln(os.Stderr, "kyb-cuda-probe:", err)
		os.Exit(1)
	}
}
