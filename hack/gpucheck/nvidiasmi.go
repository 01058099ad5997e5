//go:build gpucheck

package main

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
	"github.com/kyb-ai/kyb-dra-driver/pkg/mig"
)

// smiProfile is one GPU-instance profile as `nvidia-smi mig -lgip` prints
// it (two lines of its table) and `-lgipp` its placements.
type smiProfile struct {
	name                     string
	id                       int
	total                    int
	memoryGiB                float64
	sms, decoders, encoders  int
	copyEngines, jpegs, ofas int
	placements               []mig.Placement
	// secondSeen and placementsSeen: the table's second line and the
	// placements were read.
	secondSeen, placementsSeen bool
}

var (
	// |   0  MIG 1g.18gb         19     7/7        16.00      No     16     1     0   |
	lgipRow = regexp.MustCompile(`^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)\s*\|$`)
	// |                                                               1     1     0   |
	lgipRow2 = regexp.MustCompile(`^\|\s+(\d+)\s+(\d+)\s+(\d+)\s*\|$`)
	// GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
	lgippRow = regexp.MustCompile(`^GPU\s+(\d+)\s+Profile ID\s+(\d+)\s+Placements?\s*:\s*\{([\d,]+)\}:(\d+)$`)
)

// parseNVIDIASMI reads the profiles of every GPU from -lgip's table and
// -lgipp's lines. A line naming a profile that does not parse is an
// error, so that a format nvidia-smi changed is never read as no
// profile.
func parseNVIDIASMI(lgip, lgipp string) (map[int][]*smiProfile, error) {
	out := map[int][]*smiProfile{}
	var last *smiProfile
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	for i, line := range strings.Split(lgip, "\n") {
		line = strings.TrimSpace(line)
		if m := lgipRow.FindStringSubmatch(line); m != nil {
			mem, err := strconv.ParseFloat(m[6], 64)
			if err != nil {
				return nil, fmt.Errorf("nvidia-smi mig -lgip, line %d: memory %q: %w", i+1, m[6], err)
			}
			last = &smiProfile{name: m[2], id: atoi(m[3]), total: atoi(m[5]), memoryGiB: mem,
				sms: atoi(m[7]), decoders: atoi(m[8]), encoders: atoi(m[9])}
			gpu := atoi(m[1])
			out[gpu] = append(out[gpu], last)
			continue
		}
		if m := lgipRow2.FindStringSubmatch(line); m != nil && last != nil && !last.secondSeen {
			last.copyEngines, last.jpegs, last.ofas, last.secondSeen = atoi(m[1]), atoi(m[2]), atoi(m[3]), true
			continue
		}
		if strings.Contains(line, "MIG ") && strings.HasPrefix(line, "|") {
			return nil, fmt.Errorf("nvidia-smi mig -lgip, line %d: cannot read %q", i+1, line)
		}
	}
	for gpu, ps := range out {
		for _, p := range ps {
			if !p.secondSeen {
				return nil, fmt.Errorf("nvidia-smi mig -lgip: GPU %d profile %s has no line of copy engines, JPEG decoders and OFAs", gpu, p.name)
			}
		}
	}
	for i, line := range strings.Split(lgipp, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		m := lgippRow.FindStringSubmatch(line)
		if m == nil {
			if strings.Contains(line, "Profile ID") {
				return nil, fmt.Errorf("nvidia-smi mig -lgipp, line %d: cannot read %q", i+1, line)
			}
			continue
		}
		gpu, id, size := atoi(m[1]), atoi(m[2]), atoi(m[4])
		idx := slices.IndexFunc(out[gpu], func(p *smiProfile) bool { return p.id == id })
		if idx < 0 {
			return nil, fmt.Errorf("nvidia-smi mig -lgipp, line %d: GPU %d profile ID %d, which -lgip does not list", i+1, gpu, id)
		}
		p := out[gpu][idx]
		for _, s := range strings.Split(m[3], ",") {
			p.placements = append(p.placements, mig.Placement{Start: atoi(s), Size: size})
		}
		p.placementsSeen = true
	}
	return out, nil
}

// compareMIG puts each GPU's geometry as the plugin read it beside what
// nvidia-smi lists: per profile ID its name, instance count, memory (GiB
// to two decimals), SMs, engines and placements. It returns a line per
// GPU and the disagreements.
func compareMIG(gpus []inventory.GPU, smi map[int][]*smiProfile) (lines, diffs []string) {
	for _, g := range gpus {
		listed := smi[g.Index]
		switch {
		case g.MIG == nil && len(listed) == 0:
			lines = append(lines, fmt.Sprintf("GPU %d: no MIG: %s; nvidia-smi lists no profile either", g.Index, g.NoMIG))
			continue
		case g.MIG == nil:
			diffs = append(diffs, fmt.Sprintf("GPU %d: nvidia-smi lists %d profiles, the plugin reads none: %s", g.Index, len(listed), g.NoMIG))
			continue
		case len(listed) == 0:
			diffs = append(diffs, fmt.Sprintf("GPU %d: the plugin reads %d profiles (%s), nvidia-smi lists none", g.Index, len(g.MIG.Profiles), strings.Join(g.MIG.ProfileNames(), ", ")))
			continue
		}
		before := len(diffs)
		var agreed []string
		for _, p := range g.MIG.Profiles {
			idx := slices.IndexFunc(listed, func(s *smiProfile) bool { return s.id == p.ID })
			if idx < 0 {
				diffs = append(diffs, fmt.Sprintf("GPU %d: the plugin reads profile %s (ID %d), nvidia-smi lists no profile ID %d", g.Index, p.Name, p.ID, p.ID))
				continue
			}
			if d := profileDiffs(p, listed[idx]); len(d) > 0 {
				diffs = append(diffs, fmt.Sprintf("GPU %d profile ID %d: %s", g.Index, p.ID, strings.Join(d, "; ")))
				continue
			}
			agreed = append(agreed, fmt.Sprintf("%s (ID %d, %d, %.2f GiB, %s)", p.Name, p.ID, p.MaxInstances, float64(p.MemoryMiB)/1024, placementsString(p.Placements)))
		}
		for _, s := range listed {
			if _, err := g.MIG.ProfileByID(s.id); err != nil {
				diffs = append(diffs, fmt.Sprintf("GPU %d: nvidia-smi lists MIG %s (ID %d), the plugin reads no such profile", g.Index, s.name, s.id))
			}
		}
		if len(diffs) == before {
			lines = append(lines, fmt.Sprintf("GPU %d: %d profiles agree: %s", g.Index, len(agreed), strings.Join(agreed, ", ")))
		}
	}
	return lines, diffs
}

// profileDiffs are the fields of a profile the plugin and nvidia-smi
// disagree on.
func profileDiffs(p mig.Profile, s *smiProfile) []string {
	var d []string
	field := func(what string, plugin, smi any) {
		if fmt.Sprint(plugin) != fmt.Sprint(smi) {
			d = append(d, fmt.Sprintf("%s: the plugin %v, nvidia-smi %v", what, plugin, smi))
		}
	}
	field("name", p.Name, s.name)
	field("instances", p.MaxInstances, s.total)
	// nvidia-smi prints NVML's MiB as GiB to two decimals.
	if math.Abs(float64(p.MemoryMiB)/1024-s.memoryGiB) > 0.0051 {
		d = append(d, fmt.Sprintf("memory: the plugin %d MiB (%.3f GiB), nvidia-smi %.2f GiB", p.MemoryMiB, float64(p.MemoryMiB)/1024, s.memoryGiB))
	}
	field("SMs", p.SMs, s.sms)
	field("decoders", p.Decoders, s.decoders)
	field("encoders", p.Encoders, s.encoders)
	field("copy engines", p.CopyEngines, s.copyEngines)
	field("JPEG decoders", p.JPEGs, s.jpegs)
	field("OFAs", p.OFAs, s.ofas)
	if !s.placementsSeen {
		d = append(d, "nvidia-smi mig -lgipp lists no placements")
	} else {
		field("placements", placementsString(p.Placements), placementsString(s.placements))
	}
	return d
}

// placementsString writes placements as -lgipp does: {0,2,4}:2.
func placementsString(pls []mig.Placement) string {
	if len(pls) == 0 {
		return "{}"
	}
	starts := make([]string, 0, len(pls))
	for _, pl := range pls {
		starts = append(starts, strconv.Itoa(pl.Start))
	}
	return fmt.Sprintf("{%s}:%d", strings.Join(starts, ","), pls[0].Size)
}
