package draplugin_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
)

// metadataMounts injects ids as a runtime does and returns the metadata
// files the container gets, by their path in the container.
func (e *env) metadataMounts(ids ...string) map[string]string {
	e.t.Helper()
	out := map[string]string{}
	for _, m := range e.inject(ids...).Mounts {
		if strings.HasPrefix(m.Destination, "/var/run/kubernetes.io/dra-device-attributes/") {
			out[m.Destination] = m.Source
		}
	}
	return out
}

// readMetadata reads a metadata file's stream and returns the v1beta1
// object in it.
func readMetadata(t *testing.T, path string) metadatav1beta1.DeviceMetadata {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		var m metadatav1beta1.DeviceMetadata
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			t.Fatalf("no %s object in %s", metadatav1beta1.SchemeGroupVersion, data)
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if m.APIVersion == metadatav1beta1.SchemeGroupVersion.String() {
			return m
		}
	}
}

// A container of a prepared claim finds its device's published attributes,
// its seats, their generations and the GPUs' UUIDs in the metadata file
// (KEP-5304), as the kubelet mounts it.
func TestDeviceMetadataInTheContainer(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed, withOptions(func(o *draplugin.Options) { o.DeviceMetadata = true }))
	c := e.claim(class2x)
	ids := e.prepareOK(c)
	mounts := e.metadataMounts(ids...)
	// /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/gpu.kyb.ai-metadata.json
	path := metadata.ResourceClaimFilePath("gpu.kyb.ai", c.Name, "gpu")
	if _, ok := mounts[path]; !ok || len(mounts) != 1 {
		t.Fatalf("metadata mounts %v, want %s", mounts, path)
	}
	m := readMetadata(t, mounts[path])
	if len(m.Requests) != 1 || m.Requests[0].Name != "gpu" || len(m.Requests[0].Devices) != 1 {
		t.Fatalf("metadata requests: %+v", m.Requests)
	}
	dev := m.Requests[0].Devices[0]
	if dev.Driver != "gpu.kyb.ai" || dev.Pool != nodeName || dev.Name != "g01-2x" {
		t.Errorf("device %s/%s/%s, want gpu.kyb.ai/%s/g01-2x", dev.Driver, dev.Pool, dev.Name, nodeName)
	}
	str := func(name string) string {
		if v, ok := dev.Attributes[resourceapi.QualifiedName(name)]; ok && v.StringValue != nil {
			return *v.StringValue
		}
		return ""
	}
	if str("profile") != "2x" || str("group") != "G01" || str("gpuIndices") != "0,1" || str("interconnect") != "nvlink" {
		t.Errorf("published attributes: %+v", dev.Attributes)
	}
	if v := dev.Attributes["seats"].IntValues; !slices.Equal(v, []int64{0}) {
		t.Errorf("seats %v, want [0]", v)
	}
	if v := dev.Attributes["seatGenerations"].IntValues; !slices.Equal(v, []int64{1}) {
		t.Errorf("seatGenerations %v, want [1]", v)
	}
	if v := dev.Attributes["gpuUUIDs"].StringValues; strings.Join(v, ",") != e.uuids(0, 1) {
		t.Errorf("gpuUUIDs %v, want %s", v, e.uuids(0, 1))
	}

	// Unprepared, the file goes.
	if r := e.unprepare(c)[string(c.UID)]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if _, err := os.Stat(mounts[path]); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("metadata file after unprepare: %v", err)
	}
}

func TestNoDeviceMetadataWhenOff(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	if mounts := e.metadataMounts(e.prepareOK(e.claim(class1x))...); len(mounts) != 0 {
		t.Errorf("metadata mounts without DeviceMetadata: %v", mounts)
	}
}
