package realnode

import (
	"fmt"
	"maps"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	v1 "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/sandbox"
	"github.com/kyb-ai/kyb-dra-driver/test/ociimage"
)

// An image is one layer of files: enough for the pause container and a
// busybox workload, with no registry involved.
type image struct {
	name       string // reference, e.g. kyb.local/busybox:e2e
	entrypoint []string
	files      []imageFile
}

type imageFile struct {
	path  string // in the image, no leading slash
	src   string // host file to copy; empty for a directory or a link
	link  string // symlink target
	mode  int64
	isDir bool
}

// busyboxImage is the workload image: Debian's static busybox with the
// applets the pods use, and the CUDA probe with the host's glibc base (the
// doctor's sandbox's image: the loader, libc, libm, libdl, libpthread,
// librt and what they need), which every glibc image has and the driver's
// libcuda.so.1 needs. It is a plain image, not NVIDIA's: no
// LD_LIBRARY_PATH, no /usr/local/nvidia, no loader cache; the probe finds
// libcuda.so.1 only where our specs put it.
func busyboxImage(name, busybox, probe string) (image, error) {
	img := image{name: name, entrypoint: []string{"/bin/sh"}}
	base, err := sandbox.Image(probe)
	if err != nil {
		return image{}, fmt.Errorf("the probe's glibc: %w", err)
	}
	var libs []imageFile
	dirs := []string{"bin", "dev", "etc", "lib", "lib64", "proc", "sys", "tmp", "usr", "usr/lib", "var", "var/run"}
	for _, b := range base {
		if b.Target == sandbox.ProgramPath {
			continue
		}
		src, err := filepath.EvalSymlinks(b.Source)
		if err != nil {
			return image{}, fmt.Errorf("the probe's glibc: %w", err)
		}
		libs = append(libs, imageFile{path: b.Target[1:], src: src, mode: 0o755})
		for d := filepath.Dir(b.Target[1:]); d != "."; d = filepath.Dir(d) {
			if !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
	}
	// Sorted, a directory comes before what is in it.
	slices.Sort(dirs)
	for _, d := range dirs {
		img.files = append(img.files, imageFile{path: d, isDir: true, mode: 0o755})
	}
	img.files = append(img.files, imageFile{path: "bin/busybox", src: busybox, mode: 0o755})
	img.files = append(img.files, imageFile{path: "bin/kyb-cuda-probe", src: probe, mode: 0o755})
	img.files = append(img.files, libs...)
	for _, applet := range []string{"sh", "env", "ls", "cat", "sleep", "grep", "sort", "echo", "test", "mount", "head", "find", "readlink", "true", "wc"} {
		img.files = append(img.files, imageFile{path: "bin/" + applet, link: "busybox"})
	}
	return img, nil
}

// busyboxImage is the node's workload image, with the node's extra files.
func (n *Node) busyboxImage() (image, error) {
	img, err := busyboxImage(BusyboxImage, filepath.Join(n.tools.Dir, "busybox"), filepath.Join(n.tools.Bin, "kyb-cuda-probe"))
	if err != nil {
		return image{}, err
	}
	for _, p := range slices.Sorted(maps.Keys(n.Options.ImageFiles)) {
		img.files = append(img.files, imageFile{path: p, src: n.Options.ImageFiles[p], mode: 0o755})
	}
	return img, nil
}

// pauseImage is the sandbox image: the kubelet's own pause program.
func pauseImage(name, pause string) image {
	return image{name: name, entrypoint: []string{"/pause"}, files: []imageFile{{path: "pause", src: pause, mode: 0o755}}}
}

// writeArchive writes the image as an OCI image layout archive, the form
// `ctr images import` reads.
func (img image) writeArchive(file string) error {
	layer := ociimage.Layer{CreatedBy: "realnode: " + img.name}
	for _, f := range img.files {
		of := ociimage.File{Path: f.path, Mode: f.mode, Source: f.src}
		switch {
		case f.isDir:
			of.Type = ociimage.Dir
		case f.link != "":
			of.Type, of.Link, of.Mode = ociimage.Symlink, f.link, 0o777
		}
		layer.Files = append(layer.Files, of)
	}
	_, err := ociimage.Image{
		Name:     img.name,
		Platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH},
		Created:  time.Unix(0, 0),
		Config:   v1.ImageConfig{Entrypoint: img.entrypoint, Env: []string{"PATH=/bin"}},
		Layers:   []ociimage.Layer{layer},
	}.WriteFile(file)
	return err
}
