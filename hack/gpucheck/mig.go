//go:build gpucheck

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/pkg/planview"
)

// MIG is checked without changing a GPU's MIG mode: the geometry the
// plugin reads from NVML (which answers with MIG mode off) beside what
// the driver's own nvidia-smi lists, and the plan the plugin makes of a
// MIG profile on each MIG GPU. Making instances needs MIG mode on, which
// on a GPU of a running node is not gpu-check's to change.

const (
	migGeometryTitle = "MIG geometry as the plugin reads it, beside `nvidia-smi mig -lgip` and `-lgipp`"
	migPlanTitle     = "the plan of a MIG profile: each MIG GPU's smallest, through `kyb-dra-plugin plan`"
)

// migGeometry compares the geometry discovery read (inventory.GPU.MIG)
// with nvidia-smi's tables. A simulated node has no nvidia-smi, and none
// is made up for it.
func (c *check) migGeometry(ctx context.Context, id string) {
	if c.node.Host.Simulated != nil {
		c.skip(id, migGeometryTitle, "not run: no nvidia-smi (a simulated node, which no nvidia-smi describes)")
		return
	}
	lgip, err := c.nvidiaSMI(ctx, "mig", "-lgip")
	if errors.Is(err, exec.ErrNotFound) || isExit(err, 127) {
		c.skip(id, migGeometryTitle, fmt.Sprintf("not run: no nvidia-smi under driver root %s (%v)", c.o.node.DriverRoot, err))
		return
	}
	c.step(ctx, id, migGeometryTitle, func(ctx context.Context) (outcome, error) {
		lgipp, errp := c.nvidiaSMI(ctx, "mig", "-lgipp")
		o := outcome{command: "nvidia-smi mig -lgip; nvidia-smi mig -lgipp", output: lgip + "\n" + lgipp, logOnly: true,
			hardware: "the driver's nvidia-smi, beside the geometry the plugin's discovery read from NVML"}
		// Without MIG on any GPU (or, on older drivers, with MIG mode
		// off) nvidia-smi says so and exits non-zero: no profile listed.
		for _, e := range []error{err, errp} {
			var exit *exec.ExitError
			if e != nil && !errors.As(e, &exit) {
				return o, fmt.Errorf("run nvidia-smi: %w", e)
			}
		}
		smi, perr := parseNVIDIASMI(lgip, lgipp)
		if perr != nil {
			return o, perr
		}
		lines, diffs := compareMIG(c.node.Inv.GPUs, smi)
		o.details = append(o.details, lines...)
		o.details = append(o.details, diffs...)
		if len(diffs) > 0 {
			o.summary = fmt.Sprintf("%d disagreements", len(diffs))
			return o, fmt.Errorf("the plugin and nvidia-smi disagree on the MIG geometry of %d GPU(s) or profile(s)", len(diffs))
		}
		o.summary = fmt.Sprintf("the plugin and nvidia-smi agree on the MIG geometry of %d GPUs", len(c.node.Inv.GPUs))
		return o, nil
	})
}

// nvidiaSMI runs the driver's nvidia-smi as the plugin does and returns
// its output.
func (c *check) nvidiaSMI(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := c.node.Host.NVIDIASMI(ctx, args...).CombinedOutput()
	return string(out), err
}

func isExit(err error, code int) bool {
	var exit *exec.ExitError
	return errors.As(err, &exit) && exit.ExitCode() == code
}

// migPlan plans the node with one MIG profile per smallest profile of its
// MIG GPUs (1g.18gb on an H200), each given those GPUs, through the
// plugin's plan command, and reports the seats each GPU offers. A GPU
// without MIG geometry says why.
func (c *check) migPlan(ctx context.Context, id string) {
	var order []string
	gpusOf := map[string][]int{}
	var without []gpuText
	for _, g := range c.node.Inv.GPUs {
		if g.MIG == nil || len(g.MIG.Profiles) == 0 {
			without = append(without, gpuText{g.Index, fmt.Sprintf("(%s): no MIG: %s", g.ProductName, g.NoMIG)})
			continue
		}
		name := g.MIG.Profiles[0].Name
		if _, ok := gpusOf[name]; !ok {
			order = append(order, name)
		}
		gpusOf[name] = append(gpusOf[name], g.Index)
	}
	noMIG := byGPUs(without)
	if len(order) == 0 {
		c.skip(id, migPlanTitle, "not run: no GPU has MIG geometry ("+strings.Join(noMIG, "; ")+")")
		return
	}
	c.step(ctx, id, migPlanTitle, func(ctx context.Context) (outcome, error) {
		var config strings.Builder
		config.WriteString("profiles:\n")
		for _, name := range order {
			var gpus []string
			for _, g := range gpusOf[name] {
				gpus = append(gpus, strconv.Itoa(g))
			}
			fmt.Fprintf(&config, "- {resource: kyb.ai/mig-%s, mig: {profile: %s}, gpus: [%s]}\n", name, name, strings.Join(gpus, ", "))
		}
		path := filepath.Join(c.work, "mig-config.yaml")
		if err := os.WriteFile(path, []byte(config.String()), 0o644); err != nil {
			return outcome{}, err
		}
		line, out, err := c.runPlugin(ctx, append([]string{"plan", "--config", path, "-o", "json"}, c.nodeArgs()...)...)
		o := outcome{command: line, output: out, logOnly: true,
			hardware:  "the plugin's discovery and planner, on the driver's NVML (MIG mode left as it is)",
			unchecked: []string{"MIG instances made and a MIG seat's container probed: that needs MIG mode on, which gpu-check does not change"}}
		o.details = append(o.details, "config: "+strings.ReplaceAll(strings.TrimSpace(config.String()), "\n", " "))
		if err != nil {
			return o, err
		}
		seats, warnings, err := migSeats(out, order, gpusOf)
		for _, s := range seats {
			o.details = append(o.details, s.String())
		}
		o.details = append(append(o.details, noMIG...), warnings...)
		if err != nil {
			return o, err
		}
		o.summary = seatsSummary(seats)
		return o, nil
	})
}

// gpuSeats are the seats a GPU offers of a MIG profile.
type gpuSeats struct {
	gpu     int
	model   string
	seats   int
	profile string
}

func (s gpuSeats) String() string {
	return fmt.Sprintf("GPU %d (%s): %d seats of %s", s.gpu, s.model, s.seats, s.profile)
}

// seatsSummary says it in one line, GPUs alike together: "GPU 0, 1
// (NVIDIA H200): 7 seats of 1g.18gb each".
func seatsSummary(seats []gpuSeats) string {
	var lines []gpuText
	for _, s := range seats {
		lines = append(lines, gpuText{s.gpu, fmt.Sprintf("(%s): %d seats of %s each", s.model, s.seats, s.profile)})
	}
	return strings.Join(byGPUs(lines), "; ")
}

// gpuText is something said of one GPU.
type gpuText struct {
	gpu  int
	text string
}

// byGPUs says what is said of several GPUs once, in the order first
// said: "GPU 0, 1 <text>".
func byGPUs(lines []gpuText) []string {
	var order []string
	gpus := map[string][]string{}
	for _, l := range lines {
		if _, ok := gpus[l.text]; !ok {
			order = append(order, l.text)
		}
		gpus[l.text] = append(gpus[l.text], strconv.Itoa(l.gpu))
	}
	out := make([]string, 0, len(order))
	for _, text := range order {
		out = append(out, fmt.Sprintf("GPU %s %s", strings.Join(gpus[text], ", "), text))
	}
	return out
}

// migSeats reads the plan's JSON: the seats each GPU offers of its MIG
// profile, and the plan's warnings. Every GPU given a profile (gpusOf, by
// the profiles in order) must offer seats of it.
func migSeats(planJSON string, order []string, gpusOf map[string][]int) ([]gpuSeats, []string, error) {
	var view planview.View
	if err := json.Unmarshal([]byte(planJSON), &view); err != nil {
		return nil, nil, fmt.Errorf("read the plan: %w", err)
	}
	var seats []gpuSeats
	var missing []string
	for _, name := range order {
		i := slices.IndexFunc(view.Profiles, func(p planview.ProfileView) bool { return p.MIG == name })
		if i < 0 {
			missing = append(missing, "the plan has no profile of MIG "+name)
			continue
		}
		got := map[int]bool{}
		for _, g := range view.Profiles[i].MIGGPUs {
			seats = append(seats, gpuSeats{gpu: g.GPU, model: g.Model, seats: g.Seats, profile: name})
			got[g.GPU] = g.Seats > 0
		}
		for _, g := range gpusOf[name] {
			if !got[g] {
				missing = append(missing, fmt.Sprintf("GPU %d offers no seat of %s", g, name))
			}
		}
	}
	var warnings []string
	for _, w := range view.Warnings {
		warnings = append(warnings, "plan warning: "+w)
	}
	if len(missing) > 0 {
		return seats, warnings, errors.New(strings.Join(missing, "; "))
	}
	return seats, warnings, nil
}
