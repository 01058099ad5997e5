package sandbox

// The sandbox's image is the host's glibc, not the program's dependencies
// alone: a container image that runs a CUDA program is a glibc
// distribution (debian, ubuntu, ubi, distroless "cc"), and the driver's
// libraries a CDI spec mounts into it need more of glibc than the program
// that loads them. The real libcuda.so.1 needs libm, libdl, libpthread and
// librt, which a probe that only links libc does not bring; an image of
// the probe's own dependencies fails to dlopen it where every real image
// succeeds. So the image is glibc's base libraries, resolved where the
// host's loader finds them, with everything they and the program need.

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// BaseLibraries are the libraries of a glibc base image: every glibc
// image has them, and a driver's libraries may need any of them.
var BaseLibraries = []string{"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"}

// optionalLibraries are in a glibc base image where the host's glibc has
// them: before glibc 2.34, getpwuid and getgrgid load libnss_files.so.2 to
// read /etc/passwd and /etc/group.
var optionalLibraries = []string{"libnss_files.so.2"}

// libraryDirs are where the image's libraries are looked for, as the
// dynamic loader of a glibc system looks.
var libraryDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// imageFrom names the image's binds in errors.
const imageFrom = "the sandbox's image"

// Image is the sandbox's image: the program at ProgramPath, the host's
// glibc base (its loader and BaseLibraries) and every shared library
// those and the program need, each bound read-only at the path the host
// has it. Nothing else of the host is in it, so that whatever driver file
// the program finds came from a CDI spec.
func Image(program string) ([]Bind, error) {
	// Its libraries are looked for by this process's machine.
	if err := ownMachine(program); err != nil {
		return nil, fmt.Errorf("the sandbox's program: %w", err)
	}
	binds := []Bind{{Source: program, Target: ProgramPath, ReadOnly: true, From: imageFrom}}
	seen := map[string]bool{}
	queue := []string{program}
	add := func(path string) {
		if !seen[path] {
			seen[path] = true
			binds = append(binds, Bind{Source: path, Target: path, ReadOnly: true, From: imageFrom})
			queue = append(queue, path)
		}
	}
	for _, lib := range BaseLibraries {
		found := findLibrary(lib)
		if found == "" {
			return nil, fmt.Errorf("the glibc base image: %s for %s is in none of %v", lib, runtime.GOARCH, libraryDirs)
		}
		add(found)
	}
	for _, lib := range optionalLibraries {
		if found := findLibrary(lib); found != "" {
			add(found)
		}
	}
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		f, err := elf.Open(path)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		needed, err := f.ImportedLibraries()
		interp := interpreter(f)
		_ = f.Close() // read only
		if err != nil {
			return nil, fmt.Errorf("libraries of %s: %w", path, err)
		}
		if interp != "" && !seen[interp] {
			// The loader needs nothing; it is bound at the path every
			// program of the image names.
			seen[interp] = true
			binds = append(binds, Bind{Source: interp, Target: interp, ReadOnly: true, From: imageFrom})
		}
		for _, lib := range needed {
			found := findLibrary(lib)
			if found == "" {
				return nil, fmt.Errorf("%s needs %s, which for %s is in none of %v", path, lib, runtime.GOARCH, libraryDirs)
			}
			add(found)
		}
	}
	return binds, nil
}

func interpreter(f *elf.File) string {
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err == nil {
				return string(b[:len(b)-1])
			}
		}
	}
	return ""
}

// findLibrary is the first library called name in libraryDirs that the
// loader would map into the program: one of the program's machine and
// class. A multiarch host (dpkg --add-architecture amd64 on an arm64
// GH200) has another machine's libm.so.6 in a directory looked in first,
// which the loader refuses and no image of this node holds.
func findLibrary(name string) string {
	for _, d := range libraryDirs {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil && ownMachine(p) == nil {
			return p
		}
	}
	return ""
}

// ownMachine says why the ELF file at path is no program or library of
// this process's machine and class, nil where it is one. The program the
// sandbox runs is built for the node with the plugin (Image checks it),
// so this process's are the program's.
func ownMachine(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	machine, class := f.Machine, f.Class
	_ = f.Close() // read only
	var want elf.Machine
	switch runtime.GOARCH {
	case "amd64":
		want = elf.EM_X86_64
	case "arm64":
		want = elf.EM_AARCH64
	default:
		return nil // an architecture the plugin is not built for: any ELF file
	}
	if machine != want || class != elf.ELFCLASS64 {
		return fmt.Errorf("%s is %s %s, not %s %s", path, machine, class, want, elf.ELFCLASS64)
	}
	return nil
}
