// Package cdi writes the driver's CDI specs: one transient spec per
// prepared claim, vendor kyb.ai, class gpu, in the CDI directory the
// container runtime reads; and reads the specs of CDI directories, its
// own and NVIDIA's, as regular files of bounded size only (specfile.go).
// It uses the CNCF CDI library for naming, parsing and validation.
package cdi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

const (
	// Vendor and Class make the CDI kind kyb.ai/gpu.
	Vendor = "kyb.ai"
	Class  = "gpu"
	// specExt is the encoding of the spec files.
	specExt  = ".json"
	specMode = 0o644
	// SpecVersion is the CDI version of every spec the driver writes.
	SpecVersion = "0.5.0"
)

// Device is one CDI device of a claim's spec.
type Device struct {
	// Name is unique within the claim; the CDI name prefixes it with the
	// claim UID so that it is unique on the node and never reused (container
	// runtimes cache specs).
	Name  string
	Edits *containeredits.Edits
}

// Writer writes and removes claim specs in one directory.
type Writer struct {
	dir string
}

// NewWriter prepares dir (creating it if needed). It reads nothing there:
// the directory holds files others write.
func NewWriter(dir string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI directory %s: %w", dir, err)
	}
	return &Writer{dir: dir}, nil
}

// Dir is the directory the writer writes to.
func (w *Writer) Dir() string { return w.dir }

// SpecName is the file name (without extension) of a claim's spec.
func SpecName(claimUID types.UID) string {
	return cdiapi.GenerateTransientSpecName(Vendor, Class, string(claimUID))
}

// DeviceID is the qualified CDI name of a claim's device, as the kubelet
// passes it to the runtime: kyb.ai/gpu=<claim UID>-<name>.
func DeviceID(claimUID types.UID, name string) string {
	return parser.QualifiedName(Vendor, Class, deviceName(claimUID, name))
}

func deviceName(claimUID types.UID, name string) string {
	return string(claimUID) + "-" + name
}

// Spec builds a claim's spec without writing it.
func Spec(claimUID types.UID, devices []Device) (*cdispec.Spec, error) {
	spec := &cdispec.Spec{Kind: Vendor + "/" + Class}
	for _, d := range devices {
		spec.Devices = append(spec.Devices, cdispec.Device{Name: deviceName(claimUID, d.Name), ContainerEdits: toCDI(d.Edits)})
	}
	// One version for every spec, not the least each one needs: the least
	// depends on the claim's UID (a device name that starts with a digit
	// needs 0.5.0), so a node's specs would differ for no reason a reader
	// could see. 0.5.0 covers every edit we write and every runtime with
	// CDI support in use (containerd 1.7+, CRI-O 1.28+, podman 4.3+).
	spec.Version = SpecVersion
	if err := cdispec.ValidateVersion(spec); err != nil {
		return nil, fmt.Errorf("CDI spec of claim %s: %w", claimUID, err)
	}
	return spec, nil
}

// validUID guards the file names built from claim UIDs: the API server
// assigns UUIDs, but a name that reaches a path is never trusted blindly.
var validUID = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]{0,127}$`)

// CheckClaimUID refuses a claim UID that is not safe in a file name (the
// spec's): a claim with one cannot be prepared.
func CheckClaimUID(claimUID types.UID) error { return checkUID(claimUID) }

func checkUID(claimUID types.UID) error {
	if !validUID.MatchString(string(claimUID)) || strings.Contains(string(claimUID), "..") {
		return fmt.Errorf("claim UID %q is not a safe file name", claimUID)
	}
	return nil
}

// Write writes a claim's spec atomically, replacing an older one. The
// spec is validated as the CDI library validates what a runtime reads.
func (w *Writer) Write(claimUID types.UID, devices []Device) error {
	if err := checkUID(claimUID); err != nil {
		return err
	}
	spec, err := Spec(claimUID, devices)
	if err != nil {
		return err
	}
	data, err := json.Marshal(spec)
	if err == nil {
		err = validate(data)
	}
	if err == nil {
		err = writeAtomic(w.dir, SpecName(claimUID)+specExt, data)
	}
	if err != nil {
		return fmt.Errorf("write CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// writeAtomic writes a file through a temporary one in the same
// directory, renamed over it: a runtime reads the old spec or the new,
// never part of one. The temporary name does not end in .json or .yaml,
// so runtimes do not read it.
func writeAtomic(dir, name string, data []byte) error {
	tmp, err := os.CreateTemp(dir, "spec.*.tmp")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	// Readable by all, as the runtimes' own spec directories are: a spec
	// holds device nodes, GPU UUIDs and paths, nothing secret, and
	// rootless tools (podman, cdi validators) read it as their user.
	if err == nil {
		err = tmp.Chmod(specMode)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		_ = os.Remove(tmp.Name()) // the error says what failed
	}
	return err
}

// Remove removes a claim's spec; a missing one is not an error.
func (w *Writer) Remove(claimUID types.UID) error {
	if err := checkUID(claimUID); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(w.dir, SpecName(claimUID)+specExt)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove CDI spec of claim %s: %w", claimUID, err)
	}
	return nil
}

// ReadEnv reads a claim's spec back: the environment of each of its CDI
// devices, by device name (without the claim UID the CDI name prefixes
// it with). ok is false when the claim has no spec; a spec that is there
// but cannot be read or parsed is ok with an error.
func (w *Writer) ReadEnv(claimUID types.UID) (env map[string]map[string]string, ok bool, err error) {
	if err := checkUID(claimUID); err != nil {
		return nil, false, err
	}
	raw, err := readRegular(filepath.Join(w.dir, SpecName(claimUID)+specExt), MaxSpecSize)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		// There, but not readable: what it gives a container is not known.
		return nil, true, fmt.Errorf("read the CDI spec of claim %s: %w", claimUID, err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, true, fmt.Errorf("read the CDI spec of claim %s: %w", claimUID, err)
	}
	if spec.Kind != Vendor+"/"+Class {
		return nil, true, fmt.Errorf("the CDI spec of claim %s is of kind %q, not %s/%s", claimUID, spec.Kind, Vendor, Class)
	}
	env = map[string]map[string]string{}
	prefix := string(claimUID) + "-"
	for _, d := range spec.Devices {
		name, mine := strings.CutPrefix(d.Name, prefix)
		if !mine {
			return nil, true, fmt.Errorf("the CDI spec of claim %s has device %q, not one of the claim's", claimUID, d.Name)
		}
		vars := map[string]string{}
		for _, kv := range d.ContainerEdits.Env {
			k, v, _ := strings.Cut(kv, "=")
			vars[k] = v
		}
		env[name] = vars
	}
	return env, true, nil
}

// Exists reports whether a claim's spec file is there.
func (w *Writer) Exists(claimUID types.UID) bool {
	if checkUID(claimUID) != nil {
		return false
	}
	_, err := os.Stat(filepath.Join(w.dir, SpecName(claimUID)+specExt))
	return err == nil
}

// Claims lists the claims that have a spec file in the directory. Files
// that look like a claim's spec but name no claim UID the plugin could
// have written (kyb.ai-gpu_.json, a UID with a space) are not the
// plugin's: they are listed in skipped, for the caller to report, and left
// alone.
func (w *Writer) Claims() (uids []types.UID, skipped []string, err error) { return ListClaims(w.dir) }

// ListClaims is Writer.Claims for a directory read without a Writer, which
// would create it.
func ListClaims(dir string) (uids []types.UID, skipped []string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("list CDI directory %s: %w", dir, err)
	}
	prefix := SpecName("")
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), specExt)
		if !ok || !strings.HasPrefix(name, prefix) {
			continue
		}
		uid := types.UID(strings.TrimPrefix(name, prefix))
		if e.IsDir() || checkUID(uid) != nil {
			skipped = append(skipped, e.Name())
			continue
		}
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	return uids, skipped, nil
}

func toCDI(e *containeredits.Edits) cdispec.ContainerEdits {
	var ce cdispec.ContainerEdits
	ce.Env = slices.Clone(e.Env)
	for _, d := range e.DeviceNodes {
		dn := &cdispec.DeviceNode{Path: d.Path, Type: "c", Major: d.Major, Minor: d.Minor, Permissions: "rw"}
		// hostPath needs CDI 0.5.0; leaving it out where it equals the path
		// keeps the spec readable by older runtimes.
		if d.HostPath != d.Path {
			dn.HostPath = d.HostPath
		}
		ce.DeviceNodes = append(ce.DeviceNodes, dn)
	}
	for _, m := range e.Mounts {
		mode := "ro"
		if m.Writable {
			mode = "rw"
		}
		ce.Mounts = append(ce.Mounts, &cdispec.Mount{
			HostPath: m.HostPath, ContainerPath: m.ContainerPath, Type: "bind",
			Options: []string{mode, "nosuid", "nodev", "rbind", "rprivate"},
		})
	}
	return ce
}

// NVIDIAKind is the CDI kind of NVIDIA's container toolkit spec.
const NVIDIAKind = "nvidia.com/gpu"

// FindNVIDIADevices looks in dirs for NVIDIA's CDI spec and returns, per
// GPU index, the qualified name of its device there: by UUID where the
// spec names devices by UUID, else by index (nvidia-ctk's default). It
// logs the files it leaves out.
func FindNVIDIADevices(ctx context.Context, dirs []string, gpus []inventory.GPU) (map[int]string, error) {
	specs := ReadSpecDirs(dirs)
	specs.Warn(ctx)
	return specs.NVIDIADevices(gpus)
}

// NVIDIADevices returns, per GPU index, the qualified name of its device
// in NVIDIA's spec, as FindNVIDIADevices does.
func (s *Specs) NVIDIADevices(gpus []inventory.GPU) (map[int]string, error) {
	names := map[string]bool{}
	for id := range s.Devices() {
		vendor, class, name, err := parser.ParseQualifiedName(id)
		if err != nil || vendor+"/"+class != NVIDIAKind {
			continue
		}
		names[name] = true
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no %s devices", NVIDIAKind)
	}
	out := map[int]string{}
	for _, g := range gpus {
		switch idx := strconv.Itoa(g.Index); {
		case names[g.UUID]:
			out[g.Index] = parser.QualifiedName("nvidia.com", "gpu", g.UUID)
		case names[idx]:
			out[g.Index] = parser.QualifiedName("nvidia.com", "gpu", idx)
		}
	}
	return out, nil
}

// InjectionOrder orders the CDI device IDs of one of our devices for the
// runtime: NVIDIA's own entries first, ours last. A runtime applies the
// devices in order, each spec's spec-level edits when it first meets the
// spec, and the last value of a variable wins; NVIDIA's spec sets
// NVIDIA_VISIBLE_DEVICES=void at spec level, which would otherwise
// replace the GPUs our device names.
func InjectionOrder(ours string, nvidia []string) []string {
	return append(slices.Clone(nvidia), ours)
}
