package nvmlconformance

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuhost"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// deviceNumbers checks the numbers the plugin writes into a claim's CDI
// spec against the kernel's list of majors: the NVIDIA driver's for the
// GPUs and nvidiactl, nvidia-uvm's for the UVM nodes, and nvidia-caps's
// for the MIG config and monitor capability nodes (whose minors their
// capability files give, and mig-minors lists too). The last
// two are allocated when their modules load (238 and 241 on one H200,
// the other way round on another host), which is why the plugin reads
// them and never assumes them. The nodes in /dev, where this process sees
// them, must have the same numbers.
func (s *suite) deviceNumbers() Result {
	var p problems
	raw, err := s.t.Kernel.ReadProcFile(gpuhost.ProcDevices)
	if err != nil {
		p.add("read %s: %v", gpuhost.ProcDevices, err)
		return p.result(CheckDeviceNumbers, NodeWide, "")
	}
	majors := gpuhost.ParseMajors(raw)
	nvidia, ok := majors["nvidia-frontend"]
	if !ok {
		nvidia, ok = majors["nvidia"]
	}
	if !ok {
		p.add("/proc/devices lists no nvidia-frontend (or nvidia) character major")
	}
	uvm, uvmOK := majors["nvidia-uvm"]
	if !uvmOK {
		p.add("/proc/devices lists no nvidia-uvm: the nvidia-uvm module is not loaded, and a container gets no /dev/nvidia-uvm (load it: nvidia-modprobe -u -c=0)")
	}
	needCaps := false
	for _, g := range s.gpus {
		needCaps = needCaps || g.migCapable
	}
	caps, capsOK := majors["nvidia-caps"]
	if needCaps && !capsOK {
		p.add("/proc/devices lists no nvidia-caps, and a GPU has MIG: a MIG device's capability nodes have no major")
	}
	if ok && uvmOK && nvidia == uvm || ok && capsOK && nvidia == caps || uvmOK && capsOK && uvm == caps {
		p.add("/proc/devices gives two of nvidia (%d), nvidia-uvm (%d) and nvidia-caps (%d) one major", nvidia, uvm, caps)
	}
	var want []node
	if ok {
		for _, g := range s.gpus {
			if g.minor >= 0 {
				want = append(want, node{fmt.Sprintf("/dev/nvidia%d", g.minor), nvidia, int64(g.minor)})
			}
		}
		want = append(want, node{"/dev/nvidiactl", nvidia, 255})
	}
	if uvmOK {
		want = append(want, node{"/dev/nvidia-uvm", uvm, 0}, node{"/dev/nvidia-uvm-tools", uvm, 1})
	}
	if needCaps && capsOK {
		caps, cp := s.migCapabilities(caps)
		want = append(want, caps...)
		p = append(p, cp...)
	}
	var got []string
	for _, w := range want {
		major, minor, err := s.t.Kernel.DeviceNumbers(w.path)
		switch {
		case err != nil:
			p.add("%s: %v", w.path, err)
		case major != w.major || minor != w.minor:
			p.add("%s: the plugin gives it %d:%d, /proc/devices makes it %d:%d", w.path, major, minor, w.major, w.minor)
		default:
			if problem := s.staleNode(w); problem != "" {
				p.add("%s", problem)
				continue
			}
			got = append(got, fmt.Sprintf("%s %d:%d", w.path, major, minor))
		}
	}
	return p.result(CheckDeviceNumbers, NodeWide, strings.Join(got, ", "))
}

// staleNode says what is wrong with the node at w.path in /dev, if this
// process sees one that is not w's numbers. The plugin takes a node's
// numbers from /proc/devices where it sees no /dev (the chart's pod, a
// simulated node), so its numbers agreeing says nothing of /dev: a
// /dev/nvidia-uvm left from an earlier load of the module, under the
// major it had then, is no UVM device for whoever opens it on the host.
func (s *suite) staleNode(w node) string {
	n, err := s.t.Kernel.StatDevice(w.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return ""
	case err != nil:
		return fmt.Sprintf("%s: %v", w.path, err)
	case !n.CharDevice():
		return fmt.Sprintf("%s is not a character device (%s)", w.path, n.Mode.Type())
	case n.Major != w.major || n.Minor != w.minor:
		return fmt.Sprintf("%s: the node is %d:%d, /proc/devices makes it %d:%d", w.path, n.Major, n.Minor, w.major, w.minor)
	}
	return ""
}

// node is a device node with the numbers it must have.
type node struct {
	path         string
	major, minor int64
}

// migCapabilities finds the nodes of the MIG config and monitor
// capabilities as NVML does, from their files under
// /proc/driver/nvidia/capabilities; mig-minors must list the same minors.
func (s *suite) migCapabilities(capsMajor int64) ([]node, problems) {
	var p problems
	var nodes []node
	minors, err := s.migMinors()
	listed := err == nil
	if err != nil {
		p.add("%v", err)
	}
	for _, c := range []struct {
		name   string
		listed int
	}{{"mig/config", minors.Config}, {"mig/monitor", minors.Monitor}} {
		capability, err := s.t.Kernel.ReadCapability(c.name)
		if err != nil {
			p.add("%v", err)
			continue
		}
		if listed && int64(c.listed) != capability.Minor {
			p.add("%s gives %s minor %d, %s lists %d", capability.File, c.name, capability.Minor, gpuhost.MIGMinorsFile, c.listed)
		}
		nodes = append(nodes, node{capability.Node(), capsMajor, capability.Minor})
	}
	return nodes, p
}

// migMinors reads mig-minors, which must list the administrators'
// capabilities where a GPU has MIG.
func (s *suite) migMinors() (mig.Minors, error) {
	file := gpuhost.MIGMinorsFile
	raw, err := s.t.Kernel.ReadProcFile(file)
	if err != nil {
		return mig.Minors{}, fmt.Errorf("read %s: %w", file, err)
	}
	m, err := mig.ParseMinors(raw, file)
	if err != nil {
		return mig.Minors{}, err
	}
	if m.Config == 0 || m.Monitor == 0 {
		return mig.Minors{}, fmt.Errorf("%s lists no config or monitor capability (config %d, monitor %d)", file, m.Config, m.Monitor)
	}
	return m, nil
}
