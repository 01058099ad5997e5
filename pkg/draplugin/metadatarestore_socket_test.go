package draplugin_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
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

// apiDown makes every read of a claim fail, as when the API server does not
// answer.
func apiDown(client *fake.Clientset) {
	client.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("the API server does not answer")
	})
}
