package draplugin_test

import (
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/mps/mpstest"
)

// sizedBenchConfig gives a dgx-h100 sized seats on GPUs 0–2, seats of
// equal shares of the same MPS groups (8 a group each) on GPUs 3–5, and
// a whole GPU a seat on GPUs 6 and 7.
const sizedBenchConfig = `
profiles:
- resource: kyb.ai/gpu-1x-sized
  seatsPerGroup: 8
  gpus: [0, 1, 2]
  sharing: {strategy: mps, sized: true}
- resource: kyb.ai/gpu-1x-seat
  seatsPerGroup: 8
  gpus: [3, 4, 5]
  sharing: {strategy: mps}
- {resource: kyb.ai/gpu-1x-whole, gpus: [6, 7]}
`

const classWhole = "gpu-1x-whole.kyb.ai"

// BenchmarkSizedPrepare is the latency of one claim's prepare over the
// plugin's socket, with the node's simulated MPS daemons, for a sized
// seat beside a seat of equal shares: joining a group whose daemon runs
// (a sized seat larger than those held, so that the daemon's limits are
// raised for it, and one smaller, so that they stay), and as the first
// seat of its group (the prepare starts the daemon); a whole GPU's seat,
// without MPS, beside them. Every MPS group holds one seat before the
// timer starts, except where the first seat is measured; each claim is made before and unprepared after its prepare,
// outside the timer. It reports the p50 and p99 of the prepares, in ms;
// -benchtime=200x gives a p99 over 200.
func BenchmarkSizedPrepare(b *testing.B) {
	control := mpstest.Build(b)
	for _, tc := range []struct {
		name      string
		class     string
		held      []func(*resourceapi.DeviceRequest)
		measured  []func(*resourceapi.DeviceRequest)
		firstSeat bool
	}{
		{name: "seat=whole-gpu", class: classWhole, firstSeat: true},
		{name: "seat=equal-share/joins", class: class1x},
		{name: "seat=sized/joins,larger", class: classSized, held: []func(*resourceapi.DeviceRequest){sized("4Gi", "5")}, measured: []func(*resourceapi.DeviceRequest){sized("16Gi", "20")}},
		{name: "seat=sized/joins,smaller", class: classSized, held: []func(*resourceapi.DeviceRequest){sized("40Gi", "50")}, measured: []func(*resourceapi.DeviceRequest){sized("16Gi", "20")}},
		{name: "seat=equal-share/first", class: class1x, firstSeat: true},
		{name: "seat=sized/first", class: classSized, measured: []func(*resourceapi.DeviceRequest){sized("16Gi", "20")}, firstSeat: true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e := newEnv(b, "dgx-h100", sizedBenchConfig, withSharing(mpstest.Root(b), control))
			if !tc.firstSeat {
				// One seat held on each of the class's three groups.
				for range 3 {
					e.prepareOK(e.claim(tc.class, tc.held...))
				}
			}
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				c := e.claim(tc.class, tc.measured...)
				b.StartTimer()
				start := time.Now()
				e.prepareOK(c)
				took = append(took, time.Since(start))
				b.StopTimer()
				e.unprepare(c)
				e.cluster.Release(c.Status.Allocation)
				if err := e.client.ResourceV1().ResourceClaims(c.Namespace).Delete(e.ctx, c.Name, metav1.DeleteOptions{}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			slices.Sort(took)
			b.ReportMetric(percentileMs(took, 50), "p50-ms")
			b.ReportMetric(percentileMs(took, 99), "p99-ms")
		})
	}
}

// percentileMs is the p-th percentile of sorted, in ms: the sample at
// or above that share of the samples.
func percentileMs(sorted []time.Duration, p int) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, (len(sorted)*p+99)/100-1)
	return float64(sorted[max(i, 0)].Microseconds()) / 1e3
}
