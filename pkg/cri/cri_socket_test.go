package cri_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cri"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cri/critest"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sockettest"
)

// A container ID names its pod and container through the labels the
// kubelet gives it; an ID that is only a prefix of one, or a container of
// no pod, is not found; a runtime that is not there is an error, not
// "not found".
func TestContainerOverRealSocket(t *testing.T) {
	dir := sockettest.Dir(t)
	srv := critest.Start(t, filepath.Join(dir, "containerd.sock"))
	id := strings.Repeat("a", 64)
	srv.Add(cri.Container{ID: id, PodUID: "uid-1", PodNamespace: "ns", PodName: "trainer", Name: "train"})
	srv.Add(cri.Container{ID: strings.Repeat("b", 64), Name: "no-pod"})
	client, err := cri.NewClient(srv.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()

	got, err := client.Container(ctx, id)
	want := cri.Container{ID: id, PodUID: "uid-1", PodNamespace: "ns", PodName: "trainer", Name: "train"}
	if err != nil || got != want {
		t.Errorf("Container(%s) = %+v, %v; want %+v", id, got, err, want)
	}
	for _, missing := range []string{strings.Repeat("a", 12), strings.Repeat("b", 64), strings.Repeat("c", 64)} {
		if _, err := client.Container(ctx, missing); !errors.Is(err, cri.ErrNotFound) {
			t.Errorf("Container(%s): %v, want ErrNotFound", missing, err)
		}
	}

	gone, err := cri.NewClient(filepath.Join(dir, "absent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	if _, err := gone.Container(ctx, id); err == nil || errors.Is(err, cri.ErrNotFound) || !strings.Contains(err.Error(), "absent.sock") {
		t.Errorf("no runtime at the socket: %v, want an error naming the socket", err)
	}
}
