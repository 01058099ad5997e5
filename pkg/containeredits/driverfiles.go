package containeredits

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
)

// DriverFiles are the NVIDIA driver's user-space libraries and tools, found
// under a driver root, to be bind-mounted into containers so that CUDA runs
// without the NVIDIA container runtime hook.
//
// Libraries go, under their sonames, into the directories the dynamic
// loader searches without a cache: /usr/lib/<multiarch> (Debian, Ubuntu)
// and /usr/lib64 (RHEL, Fedora, SUSE). So any glibc image finds
// libcuda.so.1 with no ldconfig hook and no LD_LIBRARY_PATH; the CUDA
// images find them the same way. Tools go to /usr/bin, on every PATH. The
// set is the driver's compute and utility libraries, the same set the
// NVIDIA container toolkit injects for those capabilities.
type DriverFiles struct {
	// Root is the driver root as the plugin sees it.
	Root string
	// HostRoot is the same directory as the host sees it (mount sources
	// in a CDI spec are host paths). Default: Root.
	HostRoot string
	// Libraries and Binaries hold paths as the plugin sees them.
	Libraries []DriverFile
	Binaries  []DriverFile
}

// DriverFile is one file: where it is and what it is called in the
// container.
type DriverFile struct {
	// Path is the mount's source as the plugin sees it: a library's
	// soname link where the driver has one that stays inside its
	// directory, so that a driver upgrade, which moves the link to the
	// new version, does not break containers whose spec was written
	// before it; else the file itself.
	Path string
	// Resolved is the file Path leads to now (libcuda.so.580.95.05).
	Resolved string
	// Name is the file's name in the container (a library's soname).
	Name string
	// Library tells a library from a tool.
	Library bool
}

// ContainerPaths are where the file appears in a container.
func (f DriverFile) ContainerPaths() []string {
	if !f.Library {
		return []string{"/usr/bin/" + f.Name}
	}
	out := make([]string, 0, len(ContainerLibDirs))
	for _, d := range ContainerLibDirs {
		out = append(out, d+"/"+f.Name)
	}
	return out
}

// ContainerLibDirs are the directories a container's dynamic loader
// searches for a library that its cache does not name, for the node's
// architecture, in both families of glibc layouts.
var ContainerLibDirs = containerLibDirs(runtime.GOARCH)

func containerLibDirs(goarch string) []string {
	triplet := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu", "ppc64le": "powerpc64le-linux-gnu"}[goarch]
	if triplet == "" {
		return []string{"/usr/lib64"}
	}
	return []string{"/usr/lib/" + triplet, "/usr/lib64"}
}

// driverLibraries are the sonames' stems of the compute and utility libraries.
var driverLibraries = []string{
	"libcuda.so", "libcudadebugger.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so",
	"libnvidia-nvvm.so", "libnvidia-gpucomp.so", "libnvidia-cfg.so", "libnvidia-opencl.so",
	"libnvidia-allocator.so", "libnvidia-pkcs11.so", "libnvidia-pkcs11-openssl3.so",
}

var driverBinaries = []string{
	"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
}

var libraryDirs = []string{
	"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib", "lib64", "lib/x86_64-linux-gnu",
}

var binaryDirs = []string{"usr/bin", "usr/local/bin", "bin"}

// FindDriverFiles looks for the driver's files under root. hostRoot is the
// same directory as the host sees it ("" means root). It is not an error to
// find nothing: the result is then empty, and the caller says so.
func FindDriverFiles(root, hostRoot string) (*DriverFiles, error) {
	if root == "" {
		root = "/"
	}
	if hostRoot == "" {
		hostRoot = root
	}
	df := &DriverFiles{Root: root, HostRoot: hostRoot}
	seen := map[string]bool{}
	for _, dir := range libraryDirs {
		entries, err := os.ReadDir(filepath.Join(root, dir))
		if err != nil {
			continue
		}
		for _, e := range entries {
			name := e.Name()
			stem, ok := libraryStem(name)
			if !ok || seen[stem] {
				continue
			}
			full := filepath.Join(root, dir, name)
			real, err := filepath.EvalSymlinks(full)
			if err != nil {
				continue
			}
			soname := readSoname(real)
			if soname == "" {
				// Not readable as ELF (or no DT_SONAME): the name that a
				// symlink to it carries is the loader's name.
				if e.Type()&os.ModeSymlink == 0 {
					continue
				}
				soname = name
			}
			seen[stem] = true
			df.Libraries = append(df.Libraries, DriverFile{Path: stablePath(filepath.Join(root, dir), soname, real), Resolved: real, Name: soname, Library: true})
		}
	}
	for _, dir := range binaryDirs {
		for _, b := range driverBinaries {
			if slices.ContainsFunc(df.Binaries, func(f DriverFile) bool { return f.Name == b }) {
				continue
			}
			p := filepath.Join(root, dir, b)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
				real, err := filepath.EvalSymlinks(p)
				if err != nil {
					return nil, fmt.Errorf("resolve %s: %w", p, err)
				}
				df.Binaries = append(df.Binaries, DriverFile{Path: real, Resolved: real, Name: b})
			}
		}
	}
	slices.SortFunc(df.Libraries, func(a, b DriverFile) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(df.Binaries, func(a, b DriverFile) int { return strings.Compare(a.Name, b.Name) })
	return df, nil
}

// stablePath is the path to mount a library from: its soname link in dir
// when the link leads to real and stays inside dir (as ldconfig makes
// them), so that it means the same on the host whatever the driver root is
// called there; else real.
func stablePath(dir, soname, real string) string {
	link := filepath.Join(dir, soname)
	target, err := os.Readlink(link)
	if err != nil || strings.Contains(target, "/") {
		return real
	}
	if now, err := filepath.EvalSymlinks(link); err != nil || now != real {
		return real
	}
	return link
}

// Files returns d itself: a fixed set of files, as tests and one-off
// checks use.
func (d *DriverFiles) Files() (*DriverFiles, error) { return d, nil }

// Empty reports whether nothing was found.
func (d *DriverFiles) Empty() bool { return d == nil || len(d.Libraries) == 0 }

// Mounts returns the bind mounts, host paths on the host's side.
func (d *DriverFiles) Mounts() []Mount {
	var out []Mount
	for _, f := range slices.Concat(d.Libraries, d.Binaries) {
		for _, p := range f.ContainerPaths() {
			out = append(out, Mount{HostPath: d.toHost(f.Path), ContainerPath: p})
		}
	}
	return out
}

func (d *DriverFiles) toHost(p string) string {
	rel, err := filepath.Rel(d.Root, p)
	if err != nil || strings.HasPrefix(rel, "..") {
		return p
	}
	return filepath.Join(d.HostRoot, rel)
}

// libraryStem reports whether name is a versioned driver library
// ("libcuda.so.580.95.05" or "libcuda.so.1") and returns its stem.
func libraryStem(name string) (string, bool) {
	for _, stem := range driverLibraries {
		if strings.HasPrefix(name, stem+".") {
			return stem, true
		}
	}
	return "", false
}

func readSoname(path string) string {
	f, err := elf.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	names, err := f.DynString(elf.DT_SONAME)
	if err != nil || len(names) == 0 {
		return ""
	}
	return names[0]
}

// DriverSource gives the driver files for a container about to be
// prepared.
type DriverSource interface {
	Files() (*DriverFiles, error)
}

// DriverRoot is a driver root looked at again whenever it changed: a
// driver upgraded or installed under a running plugin (a driver container
// that was not ready when the plugin started) is what the next container
// gets. Looking costs a stat of each of the few directories searched
// while nothing changed.
type DriverRoot struct {
	root, hostRoot string
	// required makes a root without libraries an error: the plugin was
	// told that containers get the driver's files from it.
	required bool

	mu    sync.Mutex
	stamp string
	files *DriverFiles
	// found: the root held the driver's libraries once.
	found bool
}

// NewDriverRoot watches root (hostRoot on the host's side, "" if the same).
func NewDriverRoot(root, hostRoot string, required bool) *DriverRoot {
	return &DriverRoot{root: root, hostRoot: hostRoot, required: required}
}

// Files returns the driver's files as they are now, for a container.
func (d *DriverRoot) Files() (*DriverFiles, error) {
	files, found, err := d.look()
	if err != nil {
		return nil, err
	}
	// Once the driver was there, a root without it is being changed
	// under the plugin (an upgrade's window): the prepare fails and is
	// retried, rather than give a container no driver for good.
	if (d.required || found) && files.Empty() {
		return nil, fmt.Errorf("no NVIDIA driver libraries under the driver root %s (looked in %v): the driver is not installed there or not ready yet", d.root, libraryDirs)
	}
	return files, nil
}

// Look returns what the root holds now, empty or not: the plugin's first
// look at start, which the next prepare's reuses while nothing changed.
func (d *DriverRoot) Look() (*DriverFiles, error) {
	files, _, err := d.look()
	return files, err
}

// look scans the root again when it changed, and reports whether it ever
// held the driver's libraries.
func (d *DriverRoot) look() (*DriverFiles, bool, error) {
	stamp, recent := d.stampNow()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.files == nil || stamp != d.stamp || recent {
		files, err := FindDriverFiles(d.root, d.hostRoot)
		if err != nil {
			return nil, false, err
		}
		d.files, d.stamp = files, stamp
		d.found = d.found || !files.Empty()
	}
	return d.files, d.found, nil
}

// stampNow sums up the searched directories' modification times: adding,
// removing or renaming an entry changes its directory's. recent says one
// changed within the last moments: a kernel's file times may be as coarse
// as its clock tick, so a change right after a look may leave the same
// time, and a stamp that recent is not trusted.
func (d *DriverRoot) stampNow() (stamp string, recent bool) {
	var b strings.Builder
	now := time.Now()
	for _, dir := range slices.Concat(libraryDirs, binaryDirs) {
		st, err := os.Stat(filepath.Join(d.root, dir))
		if err != nil {
			b.WriteString("-;")
			continue
		}
		// Within two seconds either side: a time in the future (skewed
		// clocks, unpacked archives) is not recent for ever.
		if d := now.Sub(st.ModTime()); d < 2*time.Second && d > -2*time.Second {
			recent = true
		}
		b.WriteString(st.ModTime().Format(time.RFC3339Nano))
		b.WriteByte(';')
	}
	return b.String(), recent
}
