package cdi

// Spec files are input that neither the plugin nor the doctor controls:
// whoever can write a file in a CDI directory (the plugin's CDI root,
// NVIDIA's /etc/cdi and /var/run/cdi) decides what is there. The CNCF CDI
// library reads a spec with os.ReadFile of its path, which blocks for
// ever on a FIFO (with no writer) and never ends on a device such as
// /dev/zero; its cache reads every *.json and *.yaml of a directory as it
// is created. So no spec file here reaches the library by its path. It is
// read here, only if it is a regular file of at most MaxSpecSize bytes,
// opened without waiting; what was read
// is then parsed and validated by the library, from an anonymous memory
// file, so that it validates exactly the bytes read. A file refused is
// left out with an error naming it, as the library's cache leaves out a
// spec it cannot read, and the caller says so. A symlink is followed, as
// the runtimes follow it when they read the same directory, but only to
// a regular file.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// MaxSpecSize bounds what is read of one spec file: NVIDIA's spec for a
// node of eight GPUs, every library and MIG device included, is some
// tens of KiB.
const MaxSpecSize = 4 << 20

// SpecFile is a spec read from a file and validated as the CDI library
// validates the specs it reads.
type SpecFile struct {
	// Path is the file.
	Path string
	// Priority is the index of its directory among those read: a device
	// of a later directory's spec wins over an earlier one's.
	Priority int
	// Vendor and Class are those of the spec's kind.
	Vendor, Class string
	*cdispec.Spec
}

// Kind is the spec's vendor/class.
func (s *SpecFile) Kind() string { return s.Vendor + "/" + s.Class }

// ReadSpecFile reads and validates one spec file.
func ReadSpecFile(path string) (*SpecFile, error) { return readSpecFile(path, 0) }

func readSpecFile(path string, priority int) (*SpecFile, error) {
	data, err := readRegular(path, MaxSpecSize)
	if err != nil {
		return nil, fmt.Errorf("read CDI spec: %w", err)
	}
	raw, err := cdiapi.ParseSpec(data)
	if err != nil {
		return nil, fmt.Errorf("CDI spec %s: %w", path, err)
	}
	if raw == nil {
		return nil, fmt.Errorf("CDI spec %s: no spec data", path)
	}
	if err := validate(data); err != nil {
		return nil, fmt.Errorf("CDI spec %s: %w", path, err)
	}
	vendor, class := parser.ParseQualifier(raw.Kind)
	return &SpecFile{Path: path, Priority: priority, Vendor: vendor, Class: class, Spec: raw}, nil
}

// validate validates a spec as the CDI library validates the specs it
// reads, which it does only for a file it opens by path: the bytes
// already read are written to an anonymous memory file, which the library
// opens by its /proc/self/fd path.
func validate(data []byte) error {
	fd, err := unix.MemfdCreate("cdi-spec", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("validate: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "cdi-spec")
	defer func() { _ = f.Close() }() // in memory only
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("validate: %w", err)
	}
	_, err = cdiapi.ReadSpec(fmt.Sprintf("/proc/self/fd/%d", fd), 0)
	return err
}

// readRegular reads a file that must be a regular file (or a symlink to
// one) of at most limit bytes. It does not wait on a FIFO or device
// swapped in after the Stat (the open does not block and the open file is
// checked again), and reads no more than limit+1 bytes of a file that
// grows meanwhile. The Stat before the open keeps it from opening a
// device at all: opening some (a watchdog) has effects of its own.
func readRegular(path string, limit int64) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, notRegular(path, fi.Mode())
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only
	if fi, err = f.Stat(); err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, notRegular(path, fi.Mode())
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d a CDI spec may have", path, fi.Size(), limit)
	}
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s grew past the %d bytes a CDI spec may have while it was read", path, limit)
	}
	return data, nil
}

func notRegular(path string, mode fs.FileMode) error {
	what := "not a regular file"
	switch {
	case mode&fs.ModeNamedPipe != 0:
		what = "a FIFO"
	case mode&fs.ModeSymlink != 0:
		what = "a symbolic link"
	case mode&fs.ModeDevice != 0:
		what = "a device"
	case mode&fs.ModeSocket != 0:
		what = "a socket"
	case mode.IsDir():
		what = "a directory"
	}
	return fmt.Errorf("%s is %s, not a regular file", path, what)
}

// Specs are the spec files read from CDI directories.
type Specs struct {
	// Files are the specs read, in the order of their directories.
	Files []*SpecFile
	// Skipped are the files (and directories) left out, each error naming
	// its path.
	Skipped []error
}

// ReadSpecDirs reads the spec files of dirs as the CDI library's cache
// finds them: the *.json and *.yaml files of each directory, not of its
// subdirectories; a directory that does not exist holds none.
func ReadSpecDirs(dirs []string) *Specs {
	s := &Specs{}
	for priority, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			s.Skipped = append(s.Skipped, fmt.Errorf("list CDI directory %s: %w", dir, err))
			continue
		}
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); e.IsDir() || (ext != ".json" && ext != ".yaml") {
				continue
			}
			spec, err := readSpecFile(filepath.Join(dir, e.Name()), priority)
			if err != nil {
				s.Skipped = append(s.Skipped, err)
				continue
			}
			s.Files = append(s.Files, spec)
		}
	}
	return s
}

// Warn logs each file left out.
func (s *Specs) Warn(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for _, err := range s.Skipped {
		logger.Info("CDI spec left out", "warning", err.Error())
	}
}

// Devices are the devices the specs define, by qualified name, as the CDI
// library's cache resolves them: a device in a later directory's spec
// replaces one of an earlier directory's; two specs of one directory that
// define the same device both lose it, as the runtime refuses it as
// ambiguous.
func (s *Specs) Devices() map[string]*SpecFile {
	devices := map[string]*SpecFile{}
	conflicts := map[string]bool{}
	for _, spec := range s.Files {
		for _, d := range spec.Devices {
			name := parser.QualifiedName(spec.Vendor, spec.Class, d.Name)
			if old := devices[name]; old != nil && old.Priority == spec.Priority {
				conflicts[name] = true
			}
			devices[name] = spec
		}
	}
	for name := range conflicts {
		delete(devices, name)
	}
	return devices
}

// Paths are the spec files read.
func (s *Specs) Paths() []string {
	var out []string
	for _, f := range s.Files {
		out = append(out, f.Path)
	}
	return out
}

// MissingHostPaths returns the files that the specs of kind mount or run
// as hooks and that do not exist: a spec generated for an earlier driver
// names libraries that are gone, and every container given one of its
// devices then fails to start. Device nodes are left out: runtimes make
// them from their numbers.
func (s *Specs) MissingHostPaths(kind string) []string {
	var missing []string
	seen := map[string]bool{}
	check := func(p string) {
		if p == "" || seen[p] {
			return
		}
		seen[p] = true
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			missing = append(missing, p)
		}
	}
	edits := func(e cdispec.ContainerEdits) {
		for _, m := range e.Mounts {
			check(m.HostPath)
		}
		for _, h := range e.Hooks {
			check(h.Path)
		}
	}
	for _, spec := range s.Files {
		if spec.Kind() != kind {
			continue
		}
		edits(spec.ContainerEdits)
		for _, d := range spec.Devices {
			edits(d.ContainerEdits)
		}
	}
	slices.Sort(missing)
	return missing
}
