package containeredits

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// DriverFiles are the NVIDIA driver's user-space libraries and tools, found
// under a driver root, to be bind-mounted into containers so that CUDA runs
// without the NVIDIA container runtime hook.
//
// Libraries go to /usr/local/nvidia/lib64 under their soname, tools to
// /usr/local/nvidia/bin: the CUDA base images put both on their
// LD_LIBRARY_PATH and PATH, so no symlink or ldconfig hook is needed. The
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

// DriverFile is one file: where it is and what it is called in the container.
type DriverFile struct {
	Path string
	Name string
}

const (
	// ContainerLibDir and ContainerBinDir are where driver files appear.
	ContainerLibDir = "/usr/local/nvidia/lib64"
	ContainerBinDir = "/usr/local/nvidia/bin"
)

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
			df.Libraries = append(df.Libraries, DriverFile{Path: real, Name: soname})
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
				df.Binaries = append(df.Binaries, DriverFile{Path: real, Name: b})
			}
		}
	}
	slices.SortFunc(df.Libraries, func(a, b DriverFile) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(df.Binaries, func(a, b DriverFile) int { return strings.Compare(a.Name, b.Name) })
	return df, nil
}

// Empty reports whether nothing was found.
func (d *DriverFiles) Empty() bool { return d == nil || len(d.Libraries) == 0 }

// Mounts returns the bind mounts, host paths on the host's side.
func (d *DriverFiles) Mounts() []Mount {
	var out []Mount
	for _, l := range d.Libraries {
		out = append(out, Mount{HostPath: d.toHost(l.Path), ContainerPath: ContainerLibDir + "/" + l.Name})
	}
	for _, b := range d.Binaries {
		out = append(out, Mount{HostPath: d.toHost(b.Path), ContainerPath: ContainerBinDir + "/" + b.Name})
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
