//go:build gpucheck

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/simnode"
)

// holdEnv makes kyb-cuda-probe hold its contexts; in the sandbox it gets
// no arguments.
const holdEnv = "KYB_CUDA_PROBE_HOLD"

// noPod says why a process is given to no pod here.
const noPod = "Which pod a process belongs to is not known here: the plugin learns it from the kubelet's PodResources API " +
	"and the container runtime's CRI (the container ID in the process's cgroup), and gpu-check runs neither; " +
	"in a cluster the same process counts for the pod that holds the claim."

// usage is step 5: kyb-cuda-probe holds a CUDA context in the claim's
// container while the plugin's per-pod usage sampler reads NVML's process
// list of the claim's GPU, until the holder is in it.
func (c *check) usage(ctx context.Context) (outcome, error) {
	r := c.claim
	gpu := c.node.Inv.GPUs[r.group.GPUs[0]]
	flags := nodesetup.UsageFlags{Interval: time.Second, HostProc: "/proc"}
	var o outcome
	if c.node.Host.Simulated != nil {
		// A simulated GPU lists what its processes file says: gpu-check
		// writes the holder there, as a driver would list it.
		flags.ProcessesFile = filepath.Join(c.work, "processes")
		o.details = append(o.details, "simulated node: NVML's process list is the simulated node's processes file, in which gpu-check puts the holder once it runs; this shows the sampler's side only")
	}
	sampler := flags.Sampler(c.node)
	o.hardware = "the driver's libcuda.so.1 holding a context in the claim's container; NVML's process list of its GPU, read by the plugin's sampler"
	hctx, cancel := context.WithTimeout(ctx, c.o.hold+time.Minute)
	defer cancel()
	type held struct {
		out []byte
		err error
	}
	holder := make(chan held, 1)
	go func() {
		out, _, err := c.sandbox(hctx, r, []string{holdEnv + "=" + c.o.hold.String()})
		holder <- held{out, err}
	}()
	var (
		pid   int
		found *gpuusage.Usage
		ended *held
	)
	for deadline := time.Now().Add(c.o.hold); found == nil && ended == nil && time.Now().Before(deadline); {
		if pid == 0 {
			if pid = sandboxedChild(); pid != 0 && flags.ProcessesFile != "" {
				line := simnode.FormatProcesses([]simnode.Process{{GPU: gpu.Index, PID: uint32(pid), MemoryMiB: 1}})
				if err := os.WriteFile(flags.ProcessesFile, line, 0o644); err != nil {
					return o, err
				}
			}
		}
		if pid != 0 {
			found = sampledWith(sampler.Sample(), gpu.Index, pid)
		}
		select {
		case h := <-holder:
			ended = &h
		case <-time.After(250 * time.Millisecond):
		}
	}
	cancel()
	if ended == nil {
		h := <-holder
		ended = &h
	}
	if res, err := parseProbe(ended.out); err == nil {
		for _, d := range res.Devices {
			o.details = append(o.details, fmt.Sprintf("the holder's CUDA device %d: %s, context and 1 MiB held: %s", d.Ordinal, d.UUID, d.MemAlloc))
		}
		if res.Error != "" {
			o.details = append(o.details, "the holder saw no GPU: "+res.Error)
		}
	}
	switch {
	case pid == 0:
		return o, fmt.Errorf("the holder did not start in the claim's container within %s: %v", c.o.hold, ended.err)
	case found == nil:
		return o, fmt.Errorf("NVML did not list the holder (PID %d) on GPU %d within %s", pid, gpu.Index, c.o.hold)
	}
	o.details = append(o.details, usageDetails(found, pid)...)
	o.details = append(o.details, noPod)
	for _, p := range found.Processes {
		if p.PID == uint32(pid) {
			o.summary = fmt.Sprintf("NVML lists the holder, PID %d, on GPU %d (%s) with %d MiB; given to no pod (no kubelet here)", pid, gpu.Index, gpu.UUID, p.MemoryBytes>>20)
		}
	}
	return o, nil
}

// sampledWith is the sample of GPU index if it lists pid.
func sampledWith(usages []gpuusage.Usage, index, pid int) *gpuusage.Usage {
	for i, u := range usages {
		if u.GPU.Index != index || u.Err != nil {
			continue
		}
		for _, p := range u.Processes {
			if p.PID == uint32(pid) {
				return &usages[i]
			}
		}
	}
	return nil
}

func usageDetails(u *gpuusage.Usage, holder int) []string {
	out := []string{fmt.Sprintf("GPU %d (%s): %d of %d MiB used, SM %d%%; NVML's processes:", u.GPU.Index, u.GPU.UUID, u.MemoryUsedBytes>>20, u.MemoryTotalBytes>>20, u.SMPercent)}
	for _, p := range u.Processes {
		who := "another process"
		if p.PID == uint32(holder) {
			who = "the holder"
		}
		where := "not in a pod's container"
		switch {
		case p.CgroupErr != nil:
			where = "cgroup unreadable: " + p.CgroupErr.Error()
		case p.InPod:
			where = fmt.Sprintf("pod %s, container %s", p.Container.PodUID, p.Container.ID)
		}
		out = append(out, fmt.Sprintf("  PID %d (%s): %d MiB, SM %.0f%%, %s", p.PID, who, p.MemoryBytes>>20, p.SMPercent, where))
	}
	return out
}

// sandboxedChild is the PID of this process's child that runs in a PID
// namespace of its own (its NSpid has two levels): the sandbox's program.
// NVML lists processes by their PIDs in the host's namespace, this one.
func sandboxedChild() int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		ppid, levels := -1, 0
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "PPid:"); ok {
				ppid, _ = strconv.Atoi(strings.TrimSpace(v))
			}
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				levels = len(strings.Fields(v))
			}
		}
		if ppid == self && levels > 1 {
			return pid
		}
	}
	return 0
}
