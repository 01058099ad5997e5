//go:build gpucheck

package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
)

// eventNames name NVML's event types, by bit, as nvml.h does.
var eventNames = []struct {
	bit  uint64
	name string
}{
	{nvml.EventTypeSingleBitEccError, "SingleBitEccError"},
	{nvml.EventTypeDoubleBitEccError, "DoubleBitEccError"},
	{nvml.EventTypePState, "PState"},
	{nvml.EventTypeXidCriticalError, "XidCriticalError"},
	{nvml.EventTypeClock, "Clock"},
	{nvml.EventTypePowerSourceChange, "PowerSourceChange"},
	{nvml.EventMigConfigChange, "MigConfigChange"},
	{nvml.EventTypeSingleBitEccErrorStorm, "SingleBitEccErrorStorm"},
	{nvml.EventTypeDramRetirementEvent, "DramRetirementEvent"},
	{nvml.EventTypeDramRetirementFailure, "DramRetirementFailure"},
	{nvml.EventTypeNonFatalPoisonError, "NonFatalPoisonError"},
	{nvml.EventTypeFatalPoisonError, "FatalPoisonError"},
	{nvml.EventTypeGpuUnavailableError, "GpuUnavailableError"},
	{nvml.EventTypeGpuRecoveryAction, "GpuRecoveryAction"},
}

// describeEvents is "0x800a (DoubleBitEccError, XidCriticalError, GpuRecoveryAction)".
func describeEvents(mask uint64) string {
	if mask == 0 {
		return "0 (none)"
	}
	var names []string
	rest := mask
	for _, e := range eventNames {
		if mask&e.bit != 0 {
			names = append(names, e.name)
			rest &^= e.bit
		}
	}
	if rest != 0 {
		names = append(names, fmt.Sprintf("%#x", rest))
	}
	return fmt.Sprintf("%#x (%s)", mask, strings.Join(names, ", "))
}

// healthWatch is how long step 9 lets the monitor watch.
const healthWatch = 2 * time.Second

// health is step 9: the plugin's health monitor started on the node's
// GPUs for a moment, as the plugin starts it: which events each GPU
// supports (NVML's own answer), which of them the monitor registered for,
// whether the driver reports the GPU's recovery action, and whether the
// monitor found a GPU unhealthy. A GPU the monitor could register for no
// event, or found unhealthy, fails the step.
func (c *check) health(ctx context.Context) (outcome, error) {
	o := outcome{
		hardware:  "the driver's NVML: GetSupportedEventTypes, RegisterEvents and an event set's Wait for every GPU; the GPU recovery-action field (GetFieldValues); the monitor's probes (GetUUID, GetMemoryInfo)",
		unchecked: []string{"no fault was raised: an XID, an ECC error or a recovery action cannot be made on purpose without harming the GPU; how the monitor handles each is tested on the simulated node (go test ./pkg/health)"},
	}
	opts := health.Options{NVML: c.node.Host.NVML, Inventory: c.node.Inv}
	if c.node.Config != nil {
		opts.Config = c.node.Config.Health
	}
	m, err := health.New(opts)
	if err != nil {
		return o, err
	}
	m.Start(ctx)
	time.Sleep(healthWatch)
	m.Stop()
	registered, reports, faults := m.Registered(), m.ReportsRecoveryActions(), m.Faults()

	var errs []string
	regCount, reportCount := 0, 0
	for _, g := range c.node.Inv.GPUs {
		supported := supportedEvents(c.node.Host.NVML, g.UUID)
		action := "not reported by the driver: XIDs follow the XID lists and the recovery period alone"
		if reports[g.Index] {
			action, reportCount = "reported by the driver", reportCount+1
		}
		o.details = append(o.details,
			fmt.Sprintf("GPU %d (%s): supports %s", g.Index, g.UUID, supported),
			fmt.Sprintf("  registered for %s", describeEvents(registered[g.Index])),
			fmt.Sprintf("  recovery action: %s", action))
		if registered[g.Index] == 0 {
			errs = append(errs, fmt.Sprintf("GPU %d is registered for no health event", g.Index))
		} else {
			regCount++
		}
	}
	for _, gpu := range slices.Sorted(maps.Keys(faults)) {
		f := faults[gpu]
		o.details = append(o.details, fmt.Sprintf("GPU %d is unhealthy: %s (%s)", gpu, f.Message, f.Reason))
		errs = append(errs, fmt.Sprintf("GPU %d is unhealthy: %s", gpu, f.Message))
	}
	o.details = append(o.details, "the monitor watches "+describeEvents(health.WatchedEvents)+" where a GPU supports them")
	if len(errs) > 0 {
		return o, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	o.summary = fmt.Sprintf("%d of %d GPUs registered for their health events; %d report the driver's recovery action; none unhealthy after %s",
		regCount, len(c.node.Inv.GPUs), reportCount, healthWatch)
	return o, nil
}

// supportedEvents is NVML's answer for a GPU's supported event types.
func supportedEvents(lib nvml.Interface, uuid string) string {
	dev, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return "(" + lib.ErrorString(ret) + ")"
	}
	mask, ret := dev.GetSupportedEventTypes()
	if ret != nvml.SUCCESS {
		return "(" + lib.ErrorString(ret) + ")"
	}
	return describeEvents(mask)
}
