package realnode

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// An image is one layer of files: enough for the pause container and a
// busybox workload, with no registry involved.
type image struct {
	name       string // reference, e.g. kyb.local/busybox:e2e
	entrypoint []string
	files      []imageFile
}

type imageFile struct {
	path   string // in the image, no leading slash
	src    string // host file to copy; empty for a directory or a link
	link   string // symlink target
	mode   int64
	isDir  bool
	binary []byte
}

// busyboxImage is the workload image: Debian's static busybox with the
// applets the pods use, and the CUDA probe with the host's glibc. It is a
// plain image, not NVIDIA's: no LD_LIBRARY_PATH, no /usr/local/nvidia, no
// loader cache; the probe finds libcuda.so.1 only where our specs put it.
func busyboxImage(name, busybox, probe string) (image, error) {
	img := image{name: name, entrypoint: []string{"/bin/sh"}}
	for _, d := range []string{"bin", "dev", "etc", "lib", "lib/x86_64-linux-gnu", "lib64", "proc", "sys", "tmp", "usr", "usr/lib", "var", "var/run"} {
		img.files = append(img.files, imageFile{path: d, isDir: true, mode: 0o755})
	}
	img.files = append(img.files, imageFile{path: "bin/busybox", src: busybox, mode: 0o755})
	img.files = append(img.files, imageFile{path: "bin/kyb-cuda-probe", src: probe, mode: 0o755})
	// What the probe links: the loader and libc (dlopen is in libc).
	for _, f := range []string{"lib64/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu/libc.so.6"} {
		src, err := filepath.EvalSymlinks("/" + f)
		if err != nil {
			return image{}, fmt.Errorf("the probe's glibc: %w", err)
		}
		img.files = append(img.files, imageFile{path: f, src: src, mode: 0o755})
	}
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
	layer, err := img.layer()
	if err != nil {
		return err
	}
	layerDigest := digest(layer)
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": img.entrypoint, "Env": []string{"PATH=/bin"}},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar", layer)},
	})
	if err != nil {
		return err
	}
	md := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	md["annotations"] = map[string]string{"io.containerd.image.name": img.name}
	md["platform"] = map[string]string{"architecture": "amd64", "os": "linux"}
	index, err := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []any{md}})
	if err != nil {
		return err
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for _, e := range []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(layer), layer},
		{blobPath(config), config},
		{blobPath(manifest), manifest},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(file, out.Bytes(), 0o644)
}

func (img image) layer() ([]byte, error) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, f := range img.files {
		h := &tar.Header{Name: f.path, Mode: f.mode, ModTime: time.Unix(0, 0)}
		switch {
		case f.isDir:
			h.Typeflag, h.Name = tar.TypeDir, f.path+"/"
		case f.link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, f.link, 0o777
		default:
			data, err := os.ReadFile(f.src)
			if err != nil {
				return nil, fmt.Errorf("image %s: %w", img.name, err)
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
			f.binary = data
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if f.binary != nil {
			if _, err := tw.Write(f.binary); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(b []byte) string {
	sum := sha256.Sum256(b)
	return "blobs/sha256/" + hex.EncodeToString(sum[:])
}

func descriptor(mediaType string, b []byte) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
}
