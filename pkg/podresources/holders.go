package podresources

import (
	"fmt"
	"slices"
	"strings"
)

// The holders of one of the driver's two surfaces (the DRA plugin, the
// device-plugin shim) name the containers that still hold devices it
// handed out: the other surface does not take the node over while there
// are any (pkg/driver).

// ResourceHolders names the containers that hold device-plugin devices of
// the resources match accepts, one line each, such as
// "ns/pod container app: kyb.ai/gpu-1x-seat g2-1x-seat-0".
func (l Listing) ResourceHolders(match func(resource string) bool) []string {
	return l.Holders(func(resource string, _ []string) bool { return match(resource) })
}

// Holders is ResourceHolders for a match that is told the devices' IDs
// too.
func (l Listing) Holders(match func(resource string, ids []string) bool) []string {
	var out []string
	for _, a := range l.Assignments {
		if match(a.Resource, a.IDs) {
			out = append(out, fmt.Sprintf("%s container %s: %s %s", a.Pod, a.Container, a.Resource, strings.Join(a.IDs, ",")))
		}
	}
	return out
}

// DriverHolders names the containers that reference claims whose devices
// driver prepared, one line each, such as
// "ns/pod container app: claim ns/gpu".
func (l Listing) DriverHolders(driver string) []string {
	var out []string
	for _, c := range l.Claims {
		if slices.Contains(c.Drivers, driver) {
			out = append(out, fmt.Sprintf("%s container %s: claim %s", c.Pod, c.Container, c.Claim))
		}
	}
	return out
}

// AssignedIDs are the device-plugin device IDs of resources match accepts
// that some container holds.
func (l Listing) AssignedIDs(match func(resource string) bool) map[string]bool {
	out := map[string]bool{}
	for _, a := range l.Assignments {
		if match(a.Resource) {
			for _, id := range a.IDs {
				out[id] = true
			}
		}
	}
	return out
}
