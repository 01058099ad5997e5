package simnode

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestParseProcesses(t *testing.T) {
	good := "# GPU PID MEM SM\n\n0 10 1024 40 0::/kubepods/pod1/abc\n1 11 5 0\n"
	procs, err := ParseProcesses([]byte(good), "p")
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) != 2 || procs[0] != (Process{GPU: 0, PID: 10, MemoryMiB: 1024, SMPercent: 40, Cgroup: "0::/kubepods/pod1/abc"}) || procs[1].Cgroup != "" {
		t.Errorf("parsed %+v", procs)
	}
	if again, _ := ParseProcesses(FormatProcesses(procs), "p"); len(again) != 2 || again[0] != procs[0] || again[1] != procs[1] {
		t.Errorf("FormatProcesses does not round-trip: %+v", again)
	}
	for _, tt := range []struct{ line, want string }{
		{"0 10 1024", "got 3 fields"},
		{"x 10 1024 40", `GPU "x" is not an index`},
		{"0/x 10 1024 40", `GPU instance "x" is not an instance ID`},
		{"0 0 1024 40", `PID "0" is not a positive number`},
		{"0 10 lots 40", `MEMORY_MIB "lots" is not a number`},
		{"0 10 1024 101", `SM_PERCENT "101" is not 0-100`},
	} {
		_, err := ParseProcesses([]byte("0 1 1 1\n"+tt.line+"\n"), "procs")
		if err == nil || !strings.HasPrefix(err.Error(), "procs:2: ") || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want procs:2: …%s", tt.line, err, tt.want)
		}
	}
}

// A processes file that stops parsing keeps the processes read before,
// and says why.
func TestABadProcessesFileKeepsTheLastGoodOne(t *testing.T) {
	n, err := Load("single-gpu", "node-1")
	if err != nil {
		t.Fatal(err)
	}
	file := t.TempDir() + "/procs"
	n.SetProcessesFile(file)
	if err := n.ProcessesError(); err != nil || len(n.processesOn(0)) != 0 {
		t.Fatalf("no file: %v, %d processes", err, len(n.processesOn(0)))
	}
	if err := os.WriteFile(file, []byte("0 10 100 5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := n.processesOn(0); len(got) != 1 || got[0].PID != 10 {
		t.Fatalf("processes %+v", got)
	}
	if err := os.WriteFile(file, []byte("0 10 100 5\n0 11 oops 5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := n.ProcessesError(); err == nil || !strings.Contains(err.Error(), file+":2:") {
		t.Errorf("bad file: error %v, want its line", err)
	}
	if got := n.processesOn(0); len(got) != 1 || got[0].PID != 10 {
		t.Errorf("after a bad write: %+v, want the last good processes", got)
	}
}

// A process the file puts in a MIG GPU instance is listed, with its
// memory, by that instance's MIG device, and by its GPU with the
// instance's ID; the MIG device's memory in use is its processes'.
func TestMIGDeviceListsItsInstanceProcesses(t *testing.T) {
	n, d, m := gpu0(t, "dgx-h100")
	enableMIG(t, d)
	var ids []uint32
	for _, start := range []int{0, 3} {
		gi, ret := createGI(t, d, m, "1g.10gb", start)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		if _, ret := fullCI(t, gi); ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		info, _ := gi.GetInfo()
		ids = append(ids, info.Id)
	}
	file := t.TempDir() + "/procs"
	n.SetProcessesFile(file)
	procs := []Process{
		{GPU: 0, GPUInstance: &ids[1], PID: 10, MemoryMiB: 1024, SMPercent: 0, Cgroup: "0::/kubepods/pod1/abc"},
		{GPU: 0, GPUInstance: &ids[1], PID: 11, MemoryMiB: 512},
		{GPU: 0, GPUInstance: &ids[0], PID: 12, MemoryMiB: 100},
	}
	if err := os.WriteFile(file, FormatProcesses(procs), 0o644); err != nil {
		t.Fatal(err)
	}
	if again, err := ParseProcesses(FormatProcesses(procs), "p"); err != nil || !reflect.DeepEqual(again, procs) {
		t.Fatalf("FormatProcesses does not round-trip: %+v, %v", again, err)
	}
	render := func(ps []nvml.ProcessInfo) string {
		var out []string
		for _, p := range ps {
			out = append(out, fmt.Sprintf("%d:%dMiB:%d/%d", p.Pid, p.UsedGpuMemory>>20, p.GpuInstanceId, p.ComputeInstanceId))
		}
		return strings.Join(out, " ")
	}
	got := map[uint32]string{}
	for i := 0; i < 2; i++ {
		md, ret := d.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		gi, _ := md.GetGpuInstanceId()
		ps, ret := md.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		mem, _ := md.GetMemoryInfo()
		got[uint32(gi)] = fmt.Sprintf("%s used %dMiB of %dMiB", render(ps), mem.Used>>20, mem.Total>>20)
		if _, ret := md.GetUtilizationRates(); ret != nvml.ERROR_NOT_SUPPORTED {
			t.Errorf("MIG device utilization: %v, want ERROR_NOT_SUPPORTED", ret)
		}
	}
	want := map[uint32]string{
		ids[0]: fmt.Sprintf("12:100MiB:%d/0 used 100MiB of 9984MiB", ids[0]),
		ids[1]: fmt.Sprintf("10:1024MiB:%d/0 11:512MiB:%d/0 used 1536MiB of 9984MiB", ids[1], ids[1]),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("MIG devices:\n got %v\nwant %v", got, want)
	}
	all, _ := d.GetComputeRunningProcesses()
	if got, want := render(all), fmt.Sprintf("10:1024MiB:%d/%d 11:512MiB:%d/%d 12:100MiB:%d/%d", ids[1], NoInstanceID, ids[1], NoInstanceID, ids[0], NoInstanceID); got != want {
		t.Errorf("GPU 0 lists %q, want %q", got, want)
	}
}
