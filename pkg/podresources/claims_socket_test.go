package podresources_test

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources/podresourcestest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// PodClaims reads which claims each container of a pod references from
// the kubelet's Get; a pod the kubelet does not know is an error.
func TestPodClaimsOverRealSocket(t *testing.T) {
	srv := podresourcestest.Start(t, filepath.Join(sockettest.Dir(t), "kubelet.sock"))
	a, b := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "b"}
	srv.SetPod("ns", "p", podresources.ContainerClaims{Name: "both", Claims: []types.NamespacedName{a, b}},
		podresources.ContainerClaims{Name: "one", Claims: []types.NamespacedName{b}}, podresources.ContainerClaims{Name: "none"})
	client, err := podresources.NewClient(srv.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	got, err := client.PodClaims(context.Background(), "ns", "p")
	if err != nil {
		t.Fatal(err)
	}
	want := podresources.PodClaims{Namespace: "ns", Name: "p", Containers: []podresources.ContainerClaims{
		{Name: "both", Claims: []types.NamespacedName{a, b}}, {Name: "one", Claims: []types.NamespacedName{b}}, {Name: "none"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PodClaims = %+v, want %+v", got, want)
	}
	if c, ok := got.Container("one"); !ok || !reflect.DeepEqual(c.Claims, []types.NamespacedName{b}) {
		t.Errorf("Container(one) = %+v, %v", c, ok)
	}
	if !got.References(a) || got.References(types.NamespacedName{Namespace: "ns", Name: "c"}) {
		t.Error("References: a is referenced, c is not")
	}
	if _, err := client.PodClaims(context.Background(), "ns", "unknown"); err == nil || !strings.Contains(err.Error(), "ns/unknown") {
		t.Errorf("a pod the kubelet does not know: %v", err)
	}
}

// A call the kubelet refuses for its rate limit says so, through the
// error's wrapping; other errors do not.
func TestRateLimitedOverRealSocket(t *testing.T) {
	srv := podresourcestest.Start(t, filepath.Join(sockettest.Dir(t), "kubelet.sock"))
	srv.SetPod("ns", "p", podresources.ContainerClaims{Name: "app"})
	client, err := podresources.NewClient(srv.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	if _, err := client.PodClaims(ctx, "ns", "unknown"); err == nil || podresources.RateLimited(err) {
		t.Errorf("a pod the kubelet does not know: %v, rate limited %v", err, podresources.RateLimited(err))
	}
	srv.Limit(rate.NewLimiter(rate.Every(time.Hour), 1))
	if _, err := client.PodClaims(ctx, "ns", "p"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.PodClaims(ctx, "ns", "p"); !podresources.RateLimited(err) {
		t.Errorf("a call over the limit: %v, want one the rate limit refused", err)
	}
	if podresources.RateLimited(nil) {
		t.Error("no error is rate limited")
	}
}

// BenchmarkPodClaims is one Get over a real unix socket, as the DRA
// plugin makes per reserving pod on its prepare path.
func BenchmarkPodClaims(b *testing.B) {
	srv := podresourcestest.Start(b, filepath.Join(sockettest.Dir(b), "kubelet.sock"))
	srv.SetPod("ns", "p", podresources.ContainerClaims{Name: "app", Claims: []types.NamespacedName{{Namespace: "ns", Name: "a"}}})
	client, err := podresources.NewClient(srv.Socket)
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	if _, err := client.PodClaims(ctx, "ns", "p"); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := client.PodClaims(ctx, "ns", "p"); err != nil {
			b.Fatal(err)
		}
	}
}
