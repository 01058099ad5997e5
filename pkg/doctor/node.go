package doctor

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodesetup"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planview"
)

// checkNode examines what the plugin opens first: its configuration, NVML,
// the GPUs and their links, and the plan made of them. Each step needs the
// one before; a failed step fails the checks after it too, saying so.
func (e *examination) checkNode(ctx context.Context) {
	flags := e.opts.Node
	cfg, src, err := flags.ReadConfig(ctx)
	if err != nil {
		e.add(Check{Name: "config", Status: Fail, Summary: err.Error(), Fix: "correct the lines named, or point --config (KYB_CONFIG) at the right file"})
	} else {
		c := Check{Name: "config", Status: OK, Summary: "defaults (no --config)"}
		if flags.ConfigPath != "" {
			c.Summary = fmt.Sprintf("%s: %d profiles, %d groups named", flags.ConfigPath, len(cfg.Profiles), len(cfg.Groups))
			c.Details = src.Notes
		}
		e.add(c)
	}

	host, err := e.opts.Host, error(nil)
	if host == nil {
		host, err = flags.OpenHost(ctx)
	}
	if err != nil {
		fix := "install the NVIDIA driver, or set --driver-root (NVIDIA_DRIVER_ROOT) to where it is, such as /run/nvidia/driver with the GPU operator's driver container"
		if flags.Simulate != "" {
			fix = "name a preset or a NodeTopology file in --simulate"
		}
		e.add(Check{Name: "nvml", Status: Fail, Summary: err.Error(), Fix: fix})
		e.skip("gpus", "topology", "plan")
		return
	}
	e.host = host
	inv, err := nodesetup.Discover(ctx, host)
	if err != nil {
		e.add(Check{Name: "nvml", Status: OK, Summary: host.Description})
		e.add(Check{Name: "gpus", Status: Fail, Summary: err.Error(), Fix: "run nvidia-smi on the node: NVML answers it the same way"})
		e.skip("topology", "plan")
		return
	}
	e.inv = inv
	e.add(Check{Name: "nvml", Status: OK, Summary: fmt.Sprintf("%s; driver %s, CUDA %s", host.Description, inv.DriverVersion, inv.CUDADriverVersion)})
	e.add(gpusCheck(inv))
	e.add(topologyCheck(inv))
	if cfg == nil {
		e.skip("plan")
		return
	}
	plan, err := nodesetup.NewPlan(inv, cfg, src)
	if err != nil {
		e.add(Check{Name: "plan", Status: Fail, Summary: err.Error(), Fix: "change the configuration to fit the GPUs found (kyb-dra-plugin plan shows what the defaults make of them)"})
		return
	}
	e.node = &nodesetup.Node{Host: host, Inv: inv, Config: cfg, Source: src, Plan: plan}
	e.add(planCheck(plan))
}

// skip records checks that cannot run because one they build on failed.
func (e *examination) skip(names ...string) {
	for _, n := range names {
		e.add(Check{Name: n, Status: Fail, Summary: "not examined: an earlier check failed", Fix: "fix the failed check above"})
	}
}

func gpusCheck(inv *inventory.Inventory) Check {
	c := Check{Name: "gpus", Status: OK, Summary: inv.Summary()}
	if len(inv.GPUs) == 0 {
		c.Status, c.Fix = Fail, "NVML sees no GPU: check that the GPUs are bound to the nvidia driver (lspci -k) and nvidia-smi lists them"
		return c
	}
	for _, g := range inv.GPUs {
		c.Details = append(c.Details, fmt.Sprintf("GPU %d: %s %s, %d MiB, PCI %s, NUMA %s, minor %d", g.Index, g.ProductName, g.UUID, g.MemoryMiB, g.PCIBusID, numa(g.NUMANode), g.Minor))
	}
	for _, w := range inv.Warnings {
		c.Details = append(c.Details, "warning: "+w)
		c.Status = Warn
		c.Fix = "see the warnings: what the discovery could not learn, it assumed"
	}
	return c
}

func numa(n int) string {
	if n < 0 {
		return "unknown"
	}
	return strconv.Itoa(n)
}

// topologyCheck prints the link matrix, nvidia-smi topo -m style, and
// warns where the PCIe placement is unknown: groups are then made from
// NVLink alone and the NUMA and PCIe attributes are missing.
func topologyCheck(inv *inventory.Inventory) Check {
	c := Check{Name: "topology", Status: OK}
	n := len(inv.GPUs)
	if n < 2 {
		c.Summary = "one GPU: no links"
		return c
	}
	nvlinked, unknown := 0, 0
	for i := range n {
		row := []string{fmt.Sprintf("GPU%-2d", i)}
		for j := range n {
			if i == j {
				row = append(row, fmt.Sprintf("%-5s", "X"))
				continue
			}
			l := inv.Link(i, j)
			if l.NVLinks > 0 && j > i {
				nvlinked++
			}
			row = append(row, fmt.Sprintf("%-5s", planview.LinkLabel(l)))
		}
		c.Details = append(c.Details, strings.TrimRight(strings.Join(row, " "), " "))
		if inv.GPUs[i].PCIeRoot == "" || inv.GPUs[i].NUMANode < 0 {
			unknown++
		}
	}
	c.Summary = fmt.Sprintf("%d GPUs, %d of %d pairs linked by NVLink", n, nvlinked, n*(n-1)/2)
	if unknown > 0 {
		c.Status = Warn
		c.Summary += fmt.Sprintf("; PCIe root or NUMA node unknown for %d GPUs", unknown)
		c.Fix = "mount the host's /sys into the plugin and set --sysfs-root (KYB_SYSFS_ROOT): without it groups follow NVLink alone and the numaNode and pcieRoot attributes are missing"
	}
	return c
}

func planCheck(plan *planner.Plan) Check {
	c := Check{Name: "plan", Status: OK}
	groups, migGPUs := 0, len(plan.MIGModels())
	for _, p := range plan.Profiles {
		if p.MIG != nil {
			// A MIG profile's seats are instances on single GPUs, not
			// groups.
			var gpus []string
			for _, g := range p.MIG.GPUs {
				gpus = append(gpus, fmt.Sprintf("GPU %d: %s", g.Index(), count(g.Seats, "seat")))
			}
			c.Details = append(c.Details, fmt.Sprintf("%s: MIG %s instances on %s: %s", p.Resource, p.MIG.Profile, count(len(p.MIG.GPUs), "GPU"), strings.Join(gpus, ", ")))
			continue
		}
		groups += len(p.Groups)
		var names []string
		for _, g := range p.Groups {
			names = append(names, g.Name+"["+g.GPUList()+"]")
		}
		c.Details = append(c.Details, fmt.Sprintf("%s: %s of %s, %s each: %s", p.Resource, count(len(p.Groups), "group"), count(p.Size, "GPU"), count(p.SeatsPerGroup, "seat"), strings.Join(names, " ")))
	}
	c.Summary = fmt.Sprintf("%d groups in %d profiles", groups, len(plan.Profiles))
	if migGPUs > 0 {
		c.Summary += fmt.Sprintf("; MIG seats on %s", count(migGPUs, "GPU"))
	}
	if groups == 0 && migGPUs == 0 {
		c.Status, c.Fix = Fail, "the configuration leaves no group on this node: add a profile whose group size fits its GPUs"
	}
	for _, w := range plan.Warnings {
		c.Details = append(c.Details, "warning: "+w)
		if c.Status == OK {
			c.Status, c.Fix = Warn, "the planner decided these on your behalf; name them in the configuration to silence this"
		}
	}
	return c
}

// count renders "1 GPU", "2 GPUs".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
