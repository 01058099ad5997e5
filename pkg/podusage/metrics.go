package podusage

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	// mig_uuid and placement name the MIG device of a MIG seat; they are
	// empty for a whole GPU.
	containerLabels = []string{"namespace", "pod", "container", "group", "seat", "gpu", "mig_uuid", "placement"}
	gpuLabels       = []string{"gpu", "uuid"}
	migLabels       = []string{"gpu", "mig_uuid", "placement"}

	containerMemoryDesc = prometheus.NewDesc("kyb_container_gpu_memory_used_bytes",
		"GPU memory the container's processes use on the GPU, by the seat(s) the container holds there (seat \"admin\": admin access, no seat), and the MIG device of a MIG seat (mig_uuid, placement).",
		containerLabels, nil)
	containerSMDesc = prometheus.NewDesc("kyb_container_gpu_sm_utilization_ratio",
		"Share of the GPU's SM time the container's processes used, from NVML's per-process utilization samples newer than the previous sample (0-1).",
		containerLabels, nil)
	containerProcsDesc = prometheus.NewDesc("kyb_container_gpu_processes",
		"Processes of the container running on the GPU.",
		containerLabels, nil)
	// A sized seat's size, beside its use: a panel divides one by the
	// other. Served for the containers whose use is, on the GPUs of sized
	// groups.
	containerMemorySizeDesc = prometheus.NewDesc("kyb_container_gpu_memory_size_bytes",
		"GPU memory the container's sized seats hold on the GPU, which their MPS limits enforce: the memory their claims consumed, added up; served beside kyb_container_gpu_memory_used_bytes where the container holds sized seats.",
		containerLabels, nil)
	containerComputeSizeDesc = prometheus.NewDesc("kyb_container_gpu_compute_size_ratio",
		"Share of the GPU's SMs the container's sized seats hold, which their MPS active thread percentage enforces (0-1): the compute their claims consumed, added up to at most 1; served beside kyb_container_gpu_sm_utilization_ratio where the container holds sized seats.",
		containerLabels, nil)
	gpuMemoryDesc = prometheus.NewDesc("kyb_gpu_memory_used_bytes",
		"GPU memory in use, by every process.", gpuLabels, nil)
	gpuMemoryTotalDesc = prometheus.NewDesc("kyb_gpu_memory_total_bytes",
		"GPU memory in all.", gpuLabels, nil)
	gpuSMDesc = prometheus.NewDesc("kyb_gpu_sm_utilization_ratio",
		"Share of time the GPU was busy over NVML's last sample period (0-1).", gpuLabels, nil)
	migMemoryDesc = prometheus.NewDesc("kyb_mig_memory_used_bytes",
		"Memory in use on a MIG device, by every process in it; placement is the memory slices of its GPU instance, {start}:size.", migLabels, nil)
	migMemoryTotalDesc = prometheus.NewDesc("kyb_mig_memory_total_bytes",
		"Memory of a MIG device in all.", migLabels, nil)
	unattributedDesc = prometheus.NewDesc("kyb_gpu_unattributed_memory_used_bytes",
		"GPU memory used by processes that hold no seat on the GPU: reason outside-pods (the MPS daemon, a host process) or no-seat-here (a pod's process on a GPU it holds no seat of).",
		[]string{"gpu", "reason"}, nil)
)

// Collector serves the last sample.
func (u *Usage) Collector() prometheus.Collector { return usageCollector{u} }

// usageCollector serves the last sample of a Usage.
type usageCollector struct{ u *Usage }

func (c usageCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{containerMemoryDesc, containerSMDesc, containerProcsDesc, containerMemorySizeDesc, containerComputeSizeDesc, gpuMemoryDesc, gpuMemoryTotalDesc, gpuSMDesc, migMemoryDesc, migMemoryTotalDesc, unattributedDesc} {
		ch <- d
	}
}

func (c usageCollector) Collect(ch chan<- prometheus.Metric) {
	snap := c.u.snapshot()
	for _, g := range snap.gpus {
		if g.Err != nil {
			continue
		}
		idx := strconv.Itoa(g.GPU.Index)
		ch <- prometheus.MustNewConstMetric(gpuMemoryDesc, prometheus.GaugeValue, float64(g.MemoryUsedBytes), idx, g.GPU.UUID)
		ch <- prometheus.MustNewConstMetric(gpuMemoryTotalDesc, prometheus.GaugeValue, float64(g.MemoryTotalBytes), idx, g.GPU.UUID)
		ch <- prometheus.MustNewConstMetric(gpuSMDesc, prometheus.GaugeValue, float64(g.SMPercent)/100, idx, g.GPU.UUID)
		for _, in := range g.Instances {
			ch <- prometheus.MustNewConstMetric(migMemoryDesc, prometheus.GaugeValue, float64(in.MemoryUsedBytes), idx, in.UUID, in.Placement.String())
			ch <- prometheus.MustNewConstMetric(migMemoryTotalDesc, prometheus.GaugeValue, float64(in.MemoryTotalBytes), idx, in.UUID, in.Placement.String())
		}
		for _, reason := range []string{outsidePods, noSeatHere} {
			ch <- prometheus.MustNewConstMetric(unattributedDesc, prometheus.GaugeValue, float64(snap.unattributed[unattributedKey{g.GPU.Index, reason}]), idx, reason)
		}
	}
	for k, use := range snap.containers {
		labels := []string{k.namespace, k.pod, k.container, k.group, k.seat, strconv.Itoa(k.gpu), k.migUUID, k.placement}
		ch <- prometheus.MustNewConstMetric(containerMemoryDesc, prometheus.GaugeValue, float64(use.memory), labels...)
		ch <- prometheus.MustNewConstMetric(containerSMDesc, prometheus.GaugeValue, use.sm/100, labels...)
		ch <- prometheus.MustNewConstMetric(containerProcsDesc, prometheus.GaugeValue, float64(use.processes), labels...)
		if !use.size.IsZero() {
			ch <- prometheus.MustNewConstMetric(containerMemorySizeDesc, prometheus.GaugeValue, float64(use.size.MemoryBytes), labels...)
			ch <- prometheus.MustNewConstMetric(containerComputeSizeDesc, prometheus.GaugeValue, float64(use.size.ComputePercent)/100, labels...)
		}
	}
}
