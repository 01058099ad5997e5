package cdisandbox

import (
	"errors"
	"os"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/sandbox"
)

// runc refuses to start a container whose spec mounts anything inside
// /proc (libcontainer's checkProcMount: "cannot be mounted because it is
// inside /proc", lxcfs's few files aside), so that a bind cannot cover a
// sysctl or a process's files. The doctor's sandbox is a container as runc
// builds one: a spec runc refuses must be refused here too, or the
// doctor's probe passes where the seat's container never starts.
func TestPlanRefusesAMountInsideProcAsRuncDoes(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{"/proc/sys/kernel/core_pattern", "/proc/driver/nvidia/params"} {
		spec := writeSpec(t, `{"cdiVersion":"0.6.0","kind":"kyb.ai/gpu","devices":[{"name":"c1-seat","containerEdits":{
			"mounts":[{"hostPath":"/etc/hostname","containerPath":"`+target+`","options":["ro","bind"]}]}}]}`)
		_, err := Plan(Options{Specs: []string{spec}, Devices: []string{"kyb.ai/gpu=c1-seat"}, Program: self})
		if !errors.Is(err, sandbox.ErrRefused) {
			t.Errorf("a spec that mounts a file at %s: %v; want it refused, as runc refuses the container", target, err)
		}
	}
}
