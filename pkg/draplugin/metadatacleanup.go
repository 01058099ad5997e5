package draplugin

// Device metadata at release.
//
// The kubelet plugin helper removes a claim's metadata files and their CDI
// specs after an unprepare, but only while device metadata is on; a stale
// claim the ledger releases itself is no unprepare at all. So the ledger's
// release removes them (restoringSpecs.Remove), whatever --device-metadata
// says now: the specs by the claim's UID, which their names carry, and the
// files under dra-device-metadata/<namespace>_<claim>/, whose name carries
// no UID. A claim of the same name created since may own that directory
// now (its pod's claim made anew from the same template), so a request's
// file goes only if it records the released claim's UID. Where the ledger
// does not know the claim's name (a spec no entry owns, a release while
// the checkpoint is lost), the directory is the one the metadata specs
// mount.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// specsPresent reports whether each metadata file of the claim has its
// CDI spec: a file that records the claim means its prepare named the
// spec's device.
func (f *deviceMetadataFiles) specsPresent(uid types.UID, c *checkpoint.Claim) bool {
	for base := range metadataRequests(c) {
		if _, err := os.Stat(f.specPath(uid, base)); err == nil {
			continue
		}
		if _, err := readMetadataFile(f.filePath(c.Namespace, c.Name, base), uid); err == nil {
			return false
		}
	}
	return true
}

// remove removes a released claim's metadata files, then their specs.
func (f *deviceMetadataFiles) remove(uid types.UID, claim types.NamespacedName) error {
	if err := cdi.CheckClaimUID(uid); err != nil {
		return err
	}
	specs, err := filepath.Glob(filepath.Join(f.cdiDir, fmt.Sprintf("%s_metadata_%s_*.json", driver.Name, uid)))
	if err != nil {
		return fmt.Errorf("list the device metadata specs of claim %s: %w", uid, err)
	}
	var dirs []string
	if claim.Name != "" {
		dirs = append(dirs, f.claimDir(claim.Namespace, claim.Name))
	}
	for _, spec := range specs {
		if dir, ok := f.mountedClaimDir(spec); ok && !slices.Contains(dirs, dir) {
			dirs = append(dirs, dir)
		}
	}
	var errs []error
	for _, dir := range dirs {
		errs = append(errs, removeClaimFiles(dir, uid))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove the device metadata of claim %s: %w", uid, err)
	}
	for _, spec := range specs {
		if err := os.Remove(spec); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove the device metadata spec of claim %s: %w", uid, err)
		}
	}
	return nil
}

// claimDir is the directory of a claim's metadata files.
func (f *deviceMetadataFiles) claimDir(namespace, name string) string {
	return filepath.Join(f.pluginDir, metadataSubDir, namespace+"_"+name)
}

// mountedClaimDir reads the claim directory a metadata spec mounts a file
// of; ok is false for a spec that mounts nothing there.
func (f *deviceMetadataFiles) mountedClaimDir(spec string) (string, bool) {
	data, err := os.ReadFile(spec)
	if err != nil {
		return "", false
	}
	var s cdispec.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return "", false
	}
	root := filepath.Join(f.pluginDir, metadataSubDir) + string(filepath.Separator)
	for _, d := range s.Devices {
		for _, m := range d.ContainerEdits.Mounts {
			// <root><namespace>_<claim>/<request>/metadata.json
			rel, ok := strings.CutPrefix(filepath.Clean(m.HostPath), root)
			parts := strings.Split(rel, string(filepath.Separator))
			if ok && len(parts) == 3 && parts[2] == metadataFileName && strings.Contains(parts[0], "_") {
				return filepath.Join(root, parts[0]), true
			}
		}
	}
	return "", false
}

// removeClaimFiles removes the request directories under dir whose
// metadata file records claim uid, and dir once it is empty.
func removeClaimFiles(dir string, uid types.UID) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		request := filepath.Join(dir, e.Name())
		file := filepath.Join(request, metadataFileName)
		if _, err := readMetadataFile(file, uid); err != nil {
			// Another claim's file, one that is not the helper's, or
			// none (the directory goes if it is empty).
			_ = os.Remove(request)
			continue
		}
		if err := os.RemoveAll(request); err != nil {
			return err
		}
	}
	// Left where another claim's files remain.
	if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) {
		return err
	}
	return nil
}
