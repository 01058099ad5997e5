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
			return nil, fmt.Errorf("the glibc base image: %s is in none of %v", lib, libraryDirs)
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
				return nil, fmt.Errorf("%s needs %s, which is in none of %v", path, lib, libraryDirs)
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

func findLibrary(name string) string {
	for _, d := range libraryDirs {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}
