package migseats

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
)

// reportNoMIGGeometry says, once at start, which GPUs the configuration
// gives to MIG profiles publish no MIG device because NVML gives no MIG
// geometry for them, and why, in one Warning Node event per cause: one
// configuration serves a mixed fleet, so the node starts and serves its
// other seats. A GPU with MIG whose geometry NVML would not give is also
// an error log line: the driver or the GPU is at fault, and a restart of
// the plugin once it is fixed publishes its MIG devices (the geometry is
// read at start).
func reportNoMIGGeometry(ctx context.Context, opts Options) {
	node, events := opts.Node, opts.Events
	logger := klog.FromContext(ctx)
	type cause struct {
		product, reason, profiles string
		capable                   bool
	}
	var causes []cause
	gpus := map[cause][]string{}
	for _, u := range node.Plan.MIGUnavailable() {
		c := cause{node.Inv.GPUs[u.GPU].ProductName, u.Reason, strings.Join(u.Profiles, ", "), u.Capable}
		if _, ok := gpus[c]; !ok {
			causes = append(causes, c)
		}
		gpus[c] = append(gpus[c], strconv.Itoa(u.GPU))
	}
	for _, c := range causes {
		list := strings.Join(gpus[c], ", ")
		note := fmt.Sprintf("GPU %s (%s), given to MIG profile %s, publish no MIG device: NVML gives no MIG geometry for them (%s).", list, c.product, c.profiles, c.reason)
		if c.capable {
			logger.Error(nil, "GPUs given to a MIG profile have MIG, but NVML gives no MIG geometry for them; they publish no MIG device until the plugin restarts",
				"gpus", list, "product", c.product, "profiles", c.profiles, "reason", c.reason)
			note += " Check them with nvidia-smi mig -lgip and kubectl kyb doctor, then restart the plugin pod."
		} else {
			note += " They have no MIG: leave them out of the profile's gpus to silence this."
		}
		events.Warning(ctx, nodeevents.ReasonNoMIGGeometry, note)
	}
}
