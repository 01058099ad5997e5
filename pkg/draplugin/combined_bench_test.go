package draplugin_test

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources/podresourcestest"
)

// BenchmarkPrepareAsksTheKubelet is the cost of asking the kubelet's
// PodResources API which containers hold a claim: a one-claim prepare and
// its unprepare over the plugin's socket, on a node that already holds a
// claim (so the kubelet is asked), with the API (over a real unix socket)
// and without it. The claims are made and stored outside the timer; the
// node has a GPU seat for each of 30 iterations at most (-benchtime=20x).
func BenchmarkPrepareAsksTheKubelet(b *testing.B) {
	for _, asked := range []bool{false, true} {
		b.Run(fmt.Sprintf("asked=%v", asked), func(b *testing.B) {
			var kubelet *podresourcestest.Server
			var opts []envOption
			if asked {
				opts = append(opts, withPodResources(b, &kubelet))
			}
			e := newEnv(b, "dgx-h100", seed, opts...)
			held := e.reserveFor(e.claim(class1x), "held")
			if kubelet != nil {
				kubelet.SetPod(held.Namespace, "held", ctr("app", held))
			}
			e.prepareOK(held)
			// One prepare that asks, so that the connection to the kubelet
			// is made before the timer runs, as on a node that prepares
			// claims all day.
			warm := e.reserveFor(e.claim(class1x), "warm")
			if kubelet != nil {
				kubelet.SetPod(warm.Namespace, "warm", ctr("app", warm))
			}
			e.prepareOK(warm)
			e.unprepare(warm)
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				pod := fmt.Sprintf("pod-%d", i)
				c := e.reserveFor(e.claim(class1x), pod)
				if kubelet != nil {
					kubelet.SetPod(c.Namespace, pod, ctr("app", c))
				}
				b.StartTimer()
				e.prepareOK(c)
				e.unprepare(c)
			}
			if kubelet != nil && kubelet.Gets() < b.N {
				b.Fatalf("the kubelet was asked %d times for %d prepares", kubelet.Gets(), b.N)
			}
		})
	}
}

// BenchmarkThirtyTwoPreparesOneAfterAnother fills a node of 32 one-seat
// seats the way a job of 32 pods does: 32 standalone claims, each of a
// pod of its own, prepared one after another over the plugin's socket,
// through a prepare client limited as kyb-dra-plugin's is by default
// (client-go's token bucket: a burst of 64, then 20 a second), with the
// kubelet's PodResources API (over a real unix socket) and without it
// (each prepare then decides what it must of the standalone claims the
// node holds), in a namespace of their own and in one holding 1,000
// claims of other nodes besides (more than one LIST page). One op is the
// 32 prepares, from a full bucket; the claims are made before and
// released after, outside the timer. The goal is under 1 s an op either
// way; requests/op counts what the prepare client sent, claims/op the
// claims its answers held.
func BenchmarkThirtyTwoPreparesOneAfterAnother(b *testing.B) {
	for _, others := range []int{0, 1000} {
		for _, asked := range []bool{false, true} {
			b.Run(fmt.Sprintf("otherClaims=%d/podResources=%v", others, asked), func(b *testing.B) {
				benchmarkThirtyTwoPrepares(b, others, asked)
			})
		}
	}
}

func benchmarkThirtyTwoPrepares(b *testing.B, others int, asked bool) {
	var kubelet *podresourcestest.Server
	var api *prepareClient
	var opts []envOption
	if asked {
		opts = append(opts, withPodResources(b, &kubelet))
	}
	opts = append(opts, withPrepareClient(&api, prepareQPS, prepareBurst))
	e := newEnv(b, "nvlink-2x4", seed, opts...)
	for i := range others {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("another-node-%04d", i)}}
		if _, err := e.client.ResourceV1().ResourceClaims(c.Namespace).Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	requests, claims := 0, 0
	b.ResetTimer()
	for n := range b.N {
		b.StopTimer()
		batch := make([]*resourceapi.ResourceClaim, 32)
		for i := range batch {
			pod := fmt.Sprintf("pod-%d-%d", n, i)
			batch[i] = e.reserveFor(e.standaloneClaim(class1x), pod)
			if kubelet != nil {
				kubelet.SetPod(batch[i].Namespace, pod, ctr("app", batch[i]))
			}
		}
		api.reset(prepareQPS, prepareBurst)
		b.StartTimer()
		for _, c := range batch {
			e.prepareOK(c)
		}
		b.StopTimer()
		requests += api.total()
		claims += api.claimsRead()
		e.unprepare(batch...)
		for _, c := range batch {
			e.cluster.Release(c.Status.Allocation)
			if err := e.client.ResourceV1().ResourceClaims(c.Namespace).Delete(e.ctx, c.Name, metav1.DeleteOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(requests)/float64(b.N), "requests/op")
	b.ReportMetric(float64(claims)/float64(b.N), "claims/op")
}
