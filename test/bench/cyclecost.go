package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
)

// cycleCosts are a scheduler process's mean times per scheduling cycle,
// in seconds, read from its metrics at the end of a round: the
// scheduling algorithm (a pod's filtering and scoring, one cycle after
// another; scheduler_scheduling_attempt_duration_seconds would add the
// binding, which runs beside the next cycles), and the placement score's
// own work (kyb_placement_duration_seconds: its PreFilter, the device
// order it hands the DynamicResources plugin, its PreScore), both
// recorded in every cycle. The framework's
// scheduler_plugin_execution_duration_seconds is not used: it times a
// tenth of the cycles and drops observations while its buffer (1,000 a
// second) is full, which Filter alone, one observation per plugin and
// node, fills on a few hundred nodes.
type cycleCosts struct {
	attempt, score float64
	// steps: the score's time per cycle by step (PreFilter, DeviceOrder,
	// PreScore).
	steps map[string]float64
	// scoreCycles are the cycles the score's PreScore ran in.
	scoreCycles float64
	// draFilters are the DynamicResources plugin's Filter calls, one
	// per pod and node tried (scheduler_plugin_evaluation_total).
	draFilters float64
}

// scoreShare is the score's own time as a share of an attempt; 0 where
// the scheduler runs no score.
func (c cycleCosts) scoreShare() float64 {
	if c.attempt <= 0 {
		return 0
	}
	return c.score / c.attempt
}

// scanSamples calls sample for each sample line of a Prometheus text page
// (comments skipped), with its metric name, labels and value.
func scanSamples(page []byte, sample func(name string, labels map[string]string, v float64)) error {
	sc := bufio.NewScanner(bytes.NewReader(page))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var name, labels, value string
		if n, rest, ok := strings.Cut(line, "{"); ok {
			name = n
			if labels, value, ok = strings.Cut(rest, "} "); !ok {
				return fmt.Errorf("scheduler metrics: malformed line %q", line)
			}
		} else if name, value, ok = strings.Cut(line, " "); !ok {
			return fmt.Errorf("scheduler metrics: malformed line %q", line)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return fmt.Errorf("scheduler metrics: line %q: %w", line, err)
		}
		ls := map[string]string{}
		for l := range strings.SplitSeq(labels, ",") {
			if k, val, ok := strings.Cut(l, "="); ok {
				ls[k] = strings.Trim(val, `"`)
			}
		}
		sample(name, ls, v)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("scheduler metrics: %w", err)
	}
	return nil
}

// parseCycleCosts reads cycleCosts from a scheduler's metrics page.
func parseCycleCosts(page []byte) (cycleCosts, error) {
	var algorithmSum, algorithmCount, scoreSum, preScores, draFilters float64
	steps := map[string]float64{}
	err := scanSamples(page, func(name string, labels map[string]string, v float64) {
		switch name {
		case "scheduler_scheduling_algorithm_duration_seconds_sum":
			algorithmSum += v
		case "scheduler_scheduling_algorithm_duration_seconds_count":
			algorithmCount += v
		case "kyb_placement_duration_seconds_sum":
			scoreSum += v
			steps[labels["step"]] += v
		case "kyb_placement_duration_seconds_count":
			if labels["step"] == "PreScore" {
				preScores += v
			}
		case "scheduler_plugin_evaluation_total":
			if labels["plugin"] == "DynamicResources" && labels["extension_point"] == "Filter" {
				draFilters += v
			}
		}
	})
	if err != nil || algorithmCount == 0 {
		return cycleCosts{}, err
	}
	for k := range steps {
		steps[k] /= algorithmCount
	}
	return cycleCosts{attempt: algorithmSum / algorithmCount, score: scoreSum / algorithmCount, steps: steps, scoreCycles: preScores, draFilters: draFilters}, nil
}

// processCycleCosts reads a scheduler process's cycleCosts.
func processCycleCosts(ctx context.Context, metrics func(context.Context) ([]byte, error)) (cycleCosts, error) {
	page, err := metrics(ctx)
	if err != nil {
		return cycleCosts{}, err
	}
	return parseCycleCosts(page)
}

// processCPUSeconds reads process_cpu_seconds_total from a process's
// metrics page: the CPU it has used, in seconds.
func processCPUSeconds(ctx context.Context, metrics func(context.Context) ([]byte, error)) (float64, error) {
	page, err := metrics(ctx)
	if err != nil {
		return 0, err
	}
	cpu, found := 0.0, false
	err = scanSamples(page, func(name string, _ map[string]string, v float64) {
		if name == "process_cpu_seconds_total" {
			cpu, found = v, true
		}
	})
	if err != nil {
		return 0, err
	}
	if !found {
		return 0, fmt.Errorf("scheduler metrics: no process_cpu_seconds_total")
	}
	return cpu, nil
}
