// Package bench measures the driver against the real Kubernetes components
// it works with: the scheduler's DRA allocator and the in-process
// kube-scheduler over our ResourceSlices against upstream's scheduler_perf
// "basic devices" shape, NodePrepareResources over the plugin's socket and
// through the kubelet's DRA manager against a no-op driver, and the plugin
// binary's footprint.
//
// The machines these run on are shared and noisy, so every study reports
// ratios taken inside one process run (both sides measured interleaved, in
// rounds), and the median over rounds. Absolute times are printed for
// orientation only. kyb-bench (test/cmd/kyb-bench) runs the studies; `make
// bench` runs it with the other benchmarks and prints one table.
package bench
