// Package v1alpha1 holds the user-facing file formats of the kyb DRA driver,
// API group kyb.ai, version v1alpha1:
//
//   - NodeConfig: seat profiles, explicit GPU groups and policies of a node.
//     It is what the Helm chart's ConfigMap carries and what --config reads.
//   - NodeTopology: the description of a simulated node (GPUs, NVLinks,
//     PCIe placement), read by --simulate when it names a file.
//   - SeatConfig: the opaque configuration a ResourceClaim may pass to the
//     driver.
//   - SeatStatus: the data the driver writes into a claim's status for
//     each device: the seats it holds.
//
// Every format is decoded strictly: unknown fields are errors, and every
// error names the file, the line and the field path at fault, so that a
// bad ConfigMap is refused at start with a message that says what to fix.
package v1alpha1

const (
	// GroupName is the API group of every kind in this package.
	GroupName = "kyb.ai"
	// Version is the API version of this package.
	Version = "v1alpha1"
	// APIVersion is the value of the apiVersion field.
	APIVersion = GroupName + "/" + Version
)
