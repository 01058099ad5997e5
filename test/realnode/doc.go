// Package realnode runs real nodes for end-to-end tests: containerd with
// runc and a real kubelet, joined to the in-process control plane of
// package harness, with the driver's own binaries on them. Pods on these
// nodes are real containers; what they print is read back through the API
// server (kubectl logs).
//
// Everything a node needs comes from hack/node-tools.sh (Debian packages
// and the Go module proxy); a node runs as root and keeps every file,
// mount, cgroup and process under its own directory, and takes them all
// away when the test ends.
package realnode
