// Package harness runs a Kubernetes control plane and simulated GPU nodes
// inside one Go process, for end-to-end tests and the local demo: embedded
// etcd, the real kube-apiserver, kube-scheduler and resource-claim
// controller, and per node the kubelet's DRA manager and plugin manager
// with the driver's real plugin command (the same code path as
// bin/kyb-dra-plugin, with --simulate).
package harness
