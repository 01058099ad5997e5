package nvmlconformance

import (
	"fmt"
	"math/bits"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// events makes an event set as pkg/health's monitor does, asks each GPU
// which events it supports, and registers each of them with the set: the
// monitor registers the ones it watches, and a GPU that refused one it
// says it supports would be watched by probes only. XID critical errors
// must be among them, the events the monitor's XID rules act on. No event
// is waited for; the set is freed.
func (s *suite) events() Result {
	var p problems
	set, ret := s.t.NVML.EventSetCreate()
	if ret != nvml.SUCCESS {
		p.add("EventSetCreate: %s", s.errorString(ret))
		return p.result(CheckEvents, NodeWide, "")
	}
	var found []gpuLine
	for _, g := range s.gpus {
		supported, ret := g.dev.GetSupportedEventTypes()
		if ret != nvml.SUCCESS {
			p.add("GPU %d: GetSupportedEventTypes: %s", g.index, s.errorString(ret))
			continue
		}
		if supported&nvml.EventTypeXidCriticalError == 0 {
			p.add("GPU %d: supports events %#x, without XID critical errors", g.index, supported)
		}
		var refused []string
		for mask := supported; mask != 0; mask &= mask - 1 {
			bit := uint64(1) << bits.TrailingZeros64(mask)
			if ret := g.dev.RegisterEvents(bit, set); ret != nvml.SUCCESS {
				refused = append(refused, fmt.Sprintf("%s (%s)", eventName(bit), s.errorString(ret)))
			}
		}
		if len(refused) > 0 {
			p.add("GPU %d: RegisterEvents refuses supported events: %s", g.index, strings.Join(refused, ", "))
		}
		found = append(found, gpuLine{g.index, fmt.Sprintf("%#x (%s), each registered", supported, eventNames(supported))})
	}
	if ret := set.Free(); ret != nvml.SUCCESS {
		p.add("EventSet.Free: %s", s.errorString(ret))
	}
	return p.result(CheckEvents, NodeWide, grouped(found))
}

func eventNames(mask uint64) string {
	var out []string
	for m := mask; m != 0; m &= m - 1 {
		out = append(out, eventName(uint64(1)<<bits.TrailingZeros64(m)))
	}
	return strings.Join(out, " ")
}

// eventName is an event type as nvml.h names it, less nvmlEventType.
func eventName(bit uint64) string {
	switch bit {
	case nvml.EventTypeSingleBitEccError:
		return "SingleBitEccError"
	case nvml.EventTypeDoubleBitEccError:
		return "DoubleBitEccError"
	case nvml.EventTypePState:
		return "PState"
	case nvml.EventTypeXidCriticalError:
		return "XidCriticalError"
	case nvml.EventTypeClock:
		return "Clock"
	case nvml.EventTypePowerSourceChange:
		return "PowerSourceChange"
	case nvml.EventMigConfigChange:
		return "MigConfigChange"
	case nvml.EventTypeSingleBitEccErrorStorm:
		return "SingleBitEccErrorStorm"
	case nvml.EventTypeDramRetirementEvent:
		return "DramRetirementEvent"
	case nvml.EventTypeDramRetirementFailure:
		return "DramRetirementFailure"
	case nvml.EventTypeNonFatalPoisonError:
		return "NonFatalPoisonError"
	case nvml.EventTypeFatalPoisonError:
		return "FatalPoisonError"
	case nvml.EventTypeGpuUnavailableError:
		return "GpuUnavailableError"
	case nvml.EventTypeGpuRecoveryAction:
		return "GpuRecoveryAction"
	}
	return fmt.Sprintf("%#x", bit)
}
