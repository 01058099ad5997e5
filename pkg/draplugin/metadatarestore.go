package draplugin

// Device metadata after a reboot.
//
// With device metadata on, the kubelet plugin helper writes two files per
// request of a claim after each prepare (kubeletplugin/metadata.go): the
// metadata file, a JSON stream of the request's devices and attributes, at
// <plugin data dir>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json,
// and a CDI spec that bind-mounts it into containers, at
// <CDI dir>/gpu.kyb.ai_metadata_<claim UID>_<request>.json, whose device
// (gpu.kyb.ai/metadata=<claim UID>_<request>) it adds to the prepare's
// answer. A reboot empties the CDI directory (a tmpfs) and keeps the plugin
// data directory (on disk). The plugin's start writes back the specs of
// prepared claims, so that every CDI device a prepare returned resolves
// whether or not the kubelet prepares the claim again before a container
// starts (a container restarted in its running pod is not prepared
// again). Where the seat ledger restores a claim's own spec, or finds a
// metadata spec missing, the metadata's specs come back, and the metadata
// files too if they are gone. Whatever --device-metadata says now: a
// claim prepared while it was on named its metadata's CDI device to the
// kubelet, and a metadata file on disk for the claim says so. A release
// removes them too (metadatacleanup.go), since the helper removes only
// what it writes while device metadata is on.
//
// The helper has no call that writes them outside a prepare
// (UpdateRequestMetadata rewrites an existing metadata file, without the
// spec), so restore writes what the helper writes, from the same
// parts: the metadata API's scheme and encoders, the CDI spec types, the
// device metadata the prepare returned (Driver.metadata, from the ledger
// entry). One input is not in the ledger: the pod's name for a claim made
// from a template (the claim's resource.kubernetes.io/pod-claim-name
// annotation), which chooses the path in the container. It is read from
// the metadata file, or from the claim when the file is gone.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	resourceclient "k8s.io/client-go/kubernetes/typed/resource/v1"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/api/metadata/install"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/utils/clock"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatledger"
)

// The helper's layout and modes (kubeletplugin/metadata.go).
const (
	metadataSubDir    = "dra-device-metadata"
	metadataFileName  = "metadata.json"
	metadataFileMode  = 0o644
	metadataDirMode   = 0o755
	metadataLookupMax = 10 * time.Second
)

// metadataVersions are the metadata API versions every metadata file
// holds. v1beta1 is the newest version of 1.37; containers read the first
// version of the stream they understand.
func metadataVersions() []schema.GroupVersion {
	return []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}
}

// restoringSpecs are the claim specs as the seat ledger keeps them in step
// with its record. The ledger writes a spec outside a prepare to restore
// it (at start, after a reboot emptied the CDI directory; for a rebuilt
// checkpoint; for a claim the other pod of a rolling update prepared
// anew), and then every spec the claim's prepare returned comes back with
// it. A prepare writes the claim's own spec alone: the helper writes the
// metadata after the prepare answers.
type restoringSpecs struct {
	*claimSpecs
	files           *deviceMetadataFiles
	restoreMetadata func(types.UID, *checkpoint.Claim, *specPlan) error
}

// Write writes the claim's spec and restores its device metadata, both
// from one plan.
func (s restoringSpecs) Write(uid types.UID, c *checkpoint.Claim) error {
	p, err := s.plan(uid, c)
	if err != nil {
		return err
	}
	if err := s.write(uid, c, p); err != nil {
		return err
	}
	return s.restoreMetadata(uid, c, p)
}

// Complete reports whether the claim's spec is there, and the spec of
// each of its metadata files.
func (s restoringSpecs) Complete(uid types.UID, c *checkpoint.Claim) bool {
	return s.Exists(uid) && s.files.specsPresent(uid, c)
}

// Remove removes the claim's device metadata, then its spec: should the
// first fail, the claim keeps its spec and its seats, and the release is
// retried.
func (s restoringSpecs) Remove(uid types.UID, claim types.NamespacedName) error {
	if err := s.files.remove(uid, claim); err != nil {
		return err
	}
	return s.claimSpecs.Remove(uid)
}

// ledgerSpecs are the specs the seat ledger keeps in step with its
// record: the claims' own and their device metadata's. A metadata file
// that is gone is written again only while the plugin gives device
// metadata.
func (d *Driver) ledgerSpecs(ctx context.Context) (seatledger.Specs, error) {
	content := func(dev checkpoint.Device, plan *specPlan) *kubeletplugin.DeviceMetadata {
		return metadataOf(d.node, dev, plan)
	}
	files, err := newDeviceMetadataFiles(d.opts.Dirs.PluginData, d.opts.Dirs.CDI, content, d.opts.Client.ResourceV1(), d.opts.Clock)
	if err != nil {
		return nil, err
	}
	files.writeLost = d.opts.DeviceMetadata
	return restoringSpecs{claimSpecs: d.specs, files: files, restoreMetadata: func(uid types.UID, c *checkpoint.Claim, p *specPlan) error {
		return files.restore(ctx, uid, c, p)
	}}, nil
}

// deviceMetadataFiles writes a prepared claim's device metadata files and
// their CDI specs as the helper does.
type deviceMetadataFiles struct {
	pluginDir, cdiDir string
	encoders          []runtime.Encoder
	// content is the metadata a prepare returns for a device of a claim
	// whose spec is planned so.
	content func(checkpoint.Device, *specPlan) *kubeletplugin.DeviceMetadata
	// claims reads a claim whose metadata file is gone, for the pod's
	// name for it.
	claims resourceclient.ResourceClaimsGetter
	clock  clock.PassiveClock
	// writeLost writes a metadata file that is gone (device metadata on);
	// else only the specs of files that are there are restored.
	writeLost bool

	mu sync.Mutex
	// unanswered is when the API server last failed to answer: for a
	// while after, claims are not asked for, so that a start with many
	// lost files and no API server is not held up by each in turn.
	unanswered time.Time
}

func newDeviceMetadataFiles(pluginDir, cdiDir string, content func(checkpoint.Device, *specPlan) *kubeletplugin.DeviceMetadata, claims resourceclient.ResourceClaimsGetter, clk clock.PassiveClock) (*deviceMetadataFiles, error) {
	codecs := serializer.NewCodecFactory(install.NewScheme())
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	if !ok {
		return nil, errors.New("device metadata: no JSON serializer for the metadata API")
	}
	f := &deviceMetadataFiles{pluginDir: pluginDir, cdiDir: cdiDir, content: content, claims: claims, clock: clk}
	for _, gv := range metadataVersions() {
		f.encoders = append(f.encoders, codecs.EncoderForVersion(info.PrettySerializer, gv))
	}
	return f, nil
}

// metadataRequest is one metadata file of a claim: a request (by the name
// the prepare's devices give, which may name a subrequest) and its devices.
type metadataRequest struct {
	ref     string
	devices []checkpoint.Device
}

// metadataRequests groups a claim's devices by the file the helper writes
// them to: one per request, named by its base request.
func metadataRequests(c *checkpoint.Claim) map[string]metadataRequest {
	out := map[string]metadataRequest{}
	for _, dev := range c.Devices {
		for _, ref := range dev.Requests {
			base := resourceclaim.BaseRequestRef(ref)
			r := out[base]
			r.ref = ref
			r.devices = append(r.devices, dev)
			out[base] = r
		}
	}
	return out
}

// restore writes what a reboot (or a lost file) took of a prepared claim's
// device metadata: each request's CDI spec, and, with device metadata on,
// its metadata file when that is gone or belongs to an earlier claim of
// the same name. Files that are there are left alone.
func (f *deviceMetadataFiles) restore(ctx context.Context, uid types.UID, c *checkpoint.Claim, plan *specPlan) error {
	if err := cdi.CheckClaimUID(uid); err != nil {
		return err
	}
	var errs []error
	// The pod's name for the claim, asked of the API server once, and
	// only when a metadata file is gone.
	var fromClaim *string
	var lookupErr error
	lookedUp := false
	reqs := metadataRequests(c)
	for _, base := range slices.Sorted(maps.Keys(reqs)) {
		file := f.filePath(c.Namespace, c.Name, base)
		var podClaim *string
		if recorded, err := readMetadataFile(file, uid); err == nil {
			podClaim = recorded.PodClaimName
			if _, err := os.Stat(f.specPath(uid, base)); err == nil {
				continue
			}
		} else {
			if !f.writeLost {
				// Device metadata is off: only a file that is there
				// says the prepare named the metadata's CDI device.
				continue
			}
			if !lookedUp {
				fromClaim, lookupErr = f.podClaimName(ctx, c.Namespace, c.Name, uid)
				lookedUp = true
			}
			if lookupErr != nil {
				errs = append(errs, fmt.Errorf("device metadata of request %s: %w (%w)", base, lookupErr, err))
				continue
			}
			podClaim = fromClaim
			if err := f.writeFile(file, uid, c, reqs[base], podClaim, plan); err != nil {
				errs = append(errs, fmt.Errorf("device metadata of request %s: %w", base, err))
				continue
			}
		}
		if err := f.writeSpec(uid, c, base, podClaim); err != nil {
			errs = append(errs, fmt.Errorf("device metadata of request %s: %w", base, err))
		}
	}
	return errors.Join(errs...)
}

// readMetadataFile reads the metadata file the helper wrote for claim uid.
func readMetadataFile(path string, uid types.UID) (*metadata.DeviceMetadata, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m metadata.DeviceMetadata
	if err := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &m); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if m.UID != uid {
		return nil, fmt.Errorf("%s is of claim %s, not %s", path, m.UID, uid)
	}
	return &m, nil
}

// podClaimName is the pod's name for a claim made from its template, as
// the helper takes it at prepare: nil for a claim that has none.
func (f *deviceMetadataFiles) podClaimName(ctx context.Context, namespace, name string, uid types.UID) (*string, error) {
	f.mu.Lock()
	failed, since := !f.unanswered.IsZero(), f.clock.Since(f.unanswered)
	f.mu.Unlock()
	if failed && since < metadataLookupMax {
		return nil, fmt.Errorf("the metadata file is gone and the claim, which names its path in containers, cannot be read: the API server did not answer %s ago", since.Round(time.Second))
	}
	ctx, cancel := context.WithTimeout(ctx, metadataLookupMax)
	defer cancel()
	claim, err := f.claims.ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			f.mu.Lock()
			f.unanswered = f.clock.Now()
			f.mu.Unlock()
		}
		return nil, fmt.Errorf("the metadata file is gone and the claim, which names its path in containers, cannot be read: %w", err)
	}
	if claim.UID != uid {
		return nil, fmt.Errorf("the metadata file is gone and claim %s/%s is now %s, not %s", namespace, name, claim.UID, uid)
	}
	if v, ok := claim.Annotations[resourceapi.PodResourceClaimAnnotation]; ok {
		return &v, nil
	}
	return nil, nil
}

// writeFile writes a request's metadata file as the prepare's helper
// wrote it.
func (f *deviceMetadataFiles) writeFile(path string, uid types.UID, c *checkpoint.Claim, r metadataRequest, podClaim *string, plan *specPlan) error {
	devices := make([]metadata.Device, 0, len(r.devices))
	for _, dev := range r.devices {
		d := metadata.Device{Driver: driver.Name, Pool: dev.Pool, Name: dev.Device}
		if m := f.content(dev, plan); m != nil {
			if m.Attributes != nil {
				d.Attributes = make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(m.Attributes))
				for k, v := range m.Attributes {
					d.Attributes[resourceapi.QualifiedName(k)] = v
				}
			}
			d.NetworkData = m.NetworkData
		}
		devices = append(devices, d)
	}
	dm := &metadata.DeviceMetadata{
		// A prepare writes generation 1; later ones come from
		// UpdateRequestMetadata, which the plugin does not call.
		ObjectMeta:   metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, UID: uid, Generation: 1},
		PodClaimName: podClaim,
		Requests:     []metadata.DeviceMetadataRequest{{Name: r.ref, Devices: devices}},
	}
	var buf bytes.Buffer
	for _, enc := range f.encoders {
		data, err := runtime.Encode(enc, dm)
		if err != nil {
			return fmt.Errorf("encode %s: %w", path, err)
		}
		buf.Write(data)
		buf.WriteByte('\n')
	}
	if err := os.MkdirAll(filepath.Dir(path), metadataDirMode); err != nil {
		return fmt.Errorf("create the metadata directory: %w", err)
	}
	return writeFileAtomically(path, buf.Bytes())
}

// writeSpec writes the CDI spec that mounts a request's metadata file.
func (f *deviceMetadataFiles) writeSpec(uid types.UID, c *checkpoint.Claim, base string, podClaim *string) error {
	container := metadata.ResourceClaimFilePath(driver.Name, c.Name, base)
	if podClaim != nil && *podClaim != "" {
		container = metadata.ResourceClaimTemplateFilePath(driver.Name, *podClaim, base)
	}
	spec := &cdispec.Spec{
		Kind: driver.Name + "/metadata",
		Devices: []cdispec.Device{{
			Name: string(uid) + "_" + base,
			ContainerEdits: cdispec.ContainerEdits{Mounts: []*cdispec.Mount{{
				HostPath:      f.filePath(c.Namespace, c.Name, base),
				ContainerPath: container,
				Options:       []string{"ro", "bind"},
			}}},
		}},
	}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return fmt.Errorf("CDI spec version: %w", err)
	}
	spec.Version = version
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode the CDI spec: %w", err)
	}
	if err := os.MkdirAll(f.cdiDir, metadataDirMode); err != nil {
		return fmt.Errorf("create the CDI directory: %w", err)
	}
	return writeFileAtomically(f.specPath(uid, base), data)
}

// filePath is where the helper writes a request's metadata file.
func (f *deviceMetadataFiles) filePath(namespace, claimName, base string) string {
	return filepath.Join(f.pluginDir, metadataSubDir, namespace+"_"+claimName, base, metadataFileName)
}

// specPath is where the helper writes the CDI spec of a request's metadata.
func (f *deviceMetadataFiles) specPath(uid types.UID, base string) string {
	return filepath.Join(f.cdiDir, fmt.Sprintf("%s_metadata_%s_%s.json", driver.Name, uid, base))
}

// writeFileAtomically replaces path with data: a temporary file, synced,
// renamed over it, the directory synced; a crash leaves the old file or
// the new one.
func writeFileAtomically(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(metadataFileMode)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("write %s: sync the directory: %w", path, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("write %s: sync the directory: %w", path, err)
	}
	return nil
}
