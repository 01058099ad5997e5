package draplugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/api/metadata"

	"github.com/kyb-ai/kyb-dra-driver/pkg/draplugin"
)

// The CDI directory is a tmpfs: a reboot empties it. A container that then
// starts without a new prepare resolves the CDI devices its claim's
// prepare returned against whatever specs are there, so once the plugin
// has started every one of them must resolve: the claim's own spec and its
// device metadata's, which the kubelet plugin helper wrote after the
// prepare. The metadata files those specs mount are in the plugin's data
// directory, on disk; when they are gone too, they are written again from
// the checkpoint, as the prepare wrote them. Through the real sockets:
// prepare, stop, empty the CDI directory, start with a new boot ID.
func TestRebootRestoresDeviceMetadataSocket(t *testing.T) {
	for _, tc := range []struct {
		name string
		// lost is what goes besides the CDI directory's content.
		lost string
		// apiDown: the API server does not answer after the reboot.
		apiDown bool
	}{
		{name: "CDI directory emptied"},
		{name: "metadata files lost too", lost: "dra-device-metadata"},
		// The pod's name for a claim made from a template, which chooses
		// the file's path in the container, is then known from nowhere:
		// nothing is written rather than a spec that mounts the file
		// elsewhere. (The claims' own specs come back.)
		{name: "metadata files lost, API server down", lost: "dra-device-metadata", apiDown: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "nvlink-2x4", seed, withOptions(func(o *draplugin.Options) { o.DeviceMetadata = true }))
			// A claim made from a pod's template: its metadata is at the
			// pod's name for the claim, which only the claim's annotation
			// tells.
			fromTemplate := e.claim(class2x)
			fromTemplate.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: "pair"}
			fromTemplate, err := e.client.ResourceV1().ResourceClaims(fromTemplate.Namespace).Update(e.ctx, fromTemplate, metav1.UpdateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			standalone := e.standaloneClaim(class1x)
			claims := []*resourceapi.ResourceClaim{fromTemplate, standalone}
			wantPaths := []string{
				metadata.ResourceClaimTemplateFilePath("gpu.kyb.ai", "pair", "gpu"),
				metadata.ResourceClaimFilePath("gpu.kyb.ai", standalone.Name, "gpu"),
			}
			ids := map[string][]string{}
			before := map[string][]byte{} // metadata file content, by container path
			for i, c := range claims {
				ids[c.Name] = e.prepareOK(c)
				mounts := e.metadataMounts(ids[c.Name]...)
				source, ok := mounts[wantPaths[i]]
				if !ok || len(mounts) != 1 {
					t.Fatalf("claim %s before the reboot: metadata mounts %v, want %s", c.Name, mounts, wantPaths[i])
				}
				if before[wantPaths[i]], err = os.ReadFile(source); err != nil {
					t.Fatal(err)
				}
			}

			e.stop()
			specs, _ := filepath.Glob(filepath.Join(e.dirs.cdi, "*"))
			if len(specs) != 4 {
				t.Fatalf("CDI specs before the reboot: %v, want each claim's and its metadata's", specs)
			}
			for _, s := range specs {
				if err := os.Remove(s); err != nil {
					t.Fatal(err)
				}
			}
			if tc.lost != "" {
				if err := os.RemoveAll(filepath.Join(e.dirs.plugin, tc.lost)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.apiDown {
				apiDown(e.client)
			}
			e.setBootID("boot-2")
			e.start()

			cache, err := cdiapiCache(e.dirs.cdi)
			if err != nil {
				t.Fatal(err)
			}
			for i, c := range claims {
				if tc.apiDown {
					var own []string
					for _, id := range ids[c.Name] {
						if !strings.HasPrefix(id, "gpu.kyb.ai/metadata=") {
							own = append(own, id)
						}
					}
					if unresolved, err := cache.InjectDevices(ociSpec(), own...); err != nil {
						t.Errorf("claim %s after the reboot: its own CDI devices %v do not resolve: %v", c.Name, unresolved, err)
					}
					continue
				}
				if unresolved, err := cache.InjectDevices(ociSpec(), ids[c.Name]...); err != nil {
					t.Errorf("claim %s after the reboot: CDI devices %v do not resolve: %v", c.Name, unresolved, err)
					continue
				}
				mounts := e.metadataMounts(ids[c.Name]...)
				source, ok := mounts[wantPaths[i]]
				if !ok || len(mounts) != 1 {
					t.Errorf("claim %s after the reboot: metadata mounts %v, want %s", c.Name, mounts, wantPaths[i])
					continue
				}
				got, err := os.ReadFile(source)
				if err != nil {
					t.Errorf("claim %s after the reboot: the metadata file the spec mounts: %v", c.Name, err)
					continue
				}
				if string(got) != string(before[wantPaths[i]]) {
					t.Errorf("claim %s after the reboot: metadata file\n%s\nwant, as the prepare wrote it,\n%s", c.Name, got, before[wantPaths[i]])
				}
			}
			if tc.apiDown {
				if left, _ := filepath.Glob(filepath.Join(e.dirs.cdi, "gpu.kyb.ai_metadata_*")); len(left) != 0 {
					t.Errorf("metadata specs written without the pod's name for the claim: %v", left)
				}
			}

			// The kubelet's unprepare removes what was restored, as what
			// the prepare wrote.
			for _, c := range claims {
				if r := e.unprepare(c)[string(c.UID)]; r.Error != "" {
					t.Fatal(r.Error)
				}
			}
			if left, _ := filepath.Glob(filepath.Join(e.dirs.cdi, "*")); len(left) != 0 {
				t.Errorf("CDI specs after every claim was unprepared: %v", left)
			}
			if left, _ := filepath.Glob(filepath.Join(e.dirs.plugin, "dra-device-metadata", "*")); len(left) != 0 {
				t.Errorf("metadata files after every claim was unprepared: %v", left)
			}
		})
	}
}

// Turning device metadata off does not take back what a prepare returned
// while it was on: after a reboot the claim's metadata CDI device still
// resolves (its file is on disk, its spec is written again), and the
// kubelet's unprepare, without a reboot, removes the metadata's spec and
// file, which the helper no longer does.
func TestDeviceMetadataTurnedOff(t *testing.T) {
	for _, reboot := range []bool{true, false} {
		name := "unprepare"
		if reboot {
			name = "reboot"
		}
		t.Run(name, func(t *testing.T) {
			metadataOn := true
			e := newEnv(t, "nvlink-2x4", seed, withOptions(func(o *draplugin.Options) { o.DeviceMetadata = metadataOn }))
			c := e.standaloneClaim(class1x)
			ids := e.prepareOK(c)
			if len(e.metadataMounts(ids...)) != 1 {
				t.Fatalf("CDI devices %v give no metadata mount", ids)
			}
			e.stop()
			if reboot {
				removeAll(t, filepath.Join(e.dirs.cdi, "*"))
				e.setBootID("boot-2")
			}
			metadataOn = false
			e.start()
			if reboot {
				cache, err := cdiapiCache(e.dirs.cdi)
				if err != nil {
					t.Fatal(err)
				}
				if unresolved, err := cache.InjectDevices(ociSpec(), ids...); err != nil {
					t.Errorf("after the reboot: CDI devices %v the prepare returned do not resolve (unresolved %v): %v", ids, unresolved, err)
				}
			}
			if r := e.unprepare(c)[string(c.UID)]; r == nil || r.Error != "" {
				t.Fatalf("unprepare: %+v", r)
			}
			if left, _ := filepath.Glob(filepath.Join(e.dirs.cdi, "*")); len(left) != 0 {
				t.Errorf("CDI specs after the claim was unprepared: %v", left)
			}
			if left, _ := filepath.Glob(filepath.Join(e.dirs.plugin, "dra-device-metadata", "*")); len(left) != 0 {
				t.Errorf("metadata files after the claim was unprepared: %v", left)
			}
		})
	}
}

// A start checks every spec a prepared claim's CDI devices name: where
// the claim's own spec is there and its metadata's is not, the metadata's
// is written again.
func TestStartRestoresAMissingMetadataSpec(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed, withOptions(func(o *draplugin.Options) { o.DeviceMetadata = true }))
	c := e.standaloneClaim(class1x)
	ids := e.prepareOK(c)
	e.stop()
	removeAll(t, filepath.Join(e.dirs.cdi, "gpu.kyb.ai_metadata_*"))
	e.start()
	cache, err := cdiapiCache(e.dirs.cdi)
	if err != nil {
		t.Fatal(err)
	}
	if unresolved, err := cache.InjectDevices(ociSpec(), ids...); err != nil {
		t.Errorf("after the start: CDI devices %v do not resolve (unresolved %v): %v", ids, unresolved, err)
	}
}

// A claim the ledger releases itself (deleted while the plugin was down,
// so the kubelet never unprepares it here) loses its device metadata with
// its seats, whether or not device metadata is on now; a claim of the same
// name created since keeps the files that record it.
func TestStaleClaimReleaseRemovesDeviceMetadata(t *testing.T) {
	for _, metadataAfter := range []bool{true, false} {
		t.Run(fmt.Sprintf("device metadata %v after", metadataAfter), func(t *testing.T) {
			metadataOn := true
			e := newEnv(t, "nvlink-2x4", seed, withOptions(func(o *draplugin.Options) { o.DeviceMetadata = metadataOn }))
			gone := e.standaloneClaim(class1x)
			e.prepareOK(gone)
			kept := e.standaloneClaim(class1x)
			e.prepareOK(kept)
			e.stop()
			if err := e.client.ResourceV1().ResourceClaims(gone.Namespace).Delete(e.ctx, gone.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			// Another request directory under the deleted claim's name,
			// recording another claim (one made anew under that name).
			other := filepath.Join(e.dirs.plugin, "dra-device-metadata", gone.Namespace+"_"+gone.Name, "other")
			copyFile(t, filepath.Join(e.dirs.plugin, "dra-device-metadata", kept.Namespace+"_"+kept.Name, "gpu", "metadata.json"), filepath.Join(other, "metadata.json"))
			metadataOn = metadataAfter
			e.start()
			err := wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				left, _ := filepath.Glob(filepath.Join(e.dirs.cdi, "*"+string(gone.UID)+"*"))
				return len(left) == 0, nil
			})
			if err != nil {
				left, _ := filepath.Glob(filepath.Join(e.dirs.cdi, "*"))
				t.Fatalf("CDI specs after the deleted claim's release: %v", left)
			}
			if _, err := os.Stat(filepath.Join(e.dirs.plugin, "dra-device-metadata", gone.Namespace+"_"+gone.Name, "gpu")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the released claim's metadata file: %v, want it gone", err)
			}
			if _, err := os.Stat(filepath.Join(other, "metadata.json")); err != nil {
				t.Errorf("another claim's metadata file under the released claim's name: %v, want it kept", err)
			}
			if _, err := os.Stat(filepath.Join(e.dirs.plugin, "dra-device-metadata", kept.Namespace+"_"+kept.Name, "gpu", "metadata.json")); err != nil {
				t.Errorf("a held claim's metadata file: %v", err)
			}
		})
	}
}

func removeAll(t *testing.T, pattern string) {
	t.Helper()
	files, _ := filepath.Glob(pattern)
	for _, f := range files {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// apiDown makes every read of a claim fail, as when the API server does not
// answer.
func apiDown(client *fake.Clientset) {
	client.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("the API server does not answer")
	})
}
