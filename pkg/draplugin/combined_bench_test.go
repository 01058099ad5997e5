package draplugin_test

import (
	"fmt"
	"testing"

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
