// Package ociimage writes container images as OCI image layout archives,
// the tar that `ctr images import`, `podman load` and `docker load` read,
// and reads such archives back: images without a registry and without a
// container engine, for the driver's own image (test/productimage) and the
// real nodes' test images (test/realnode).
//
// The writer does only what those images need, so it stays small enough to
// check by reading: gzip layers of plain files, directories and links, one
// manifest for one platform, an index naming it. Its output depends on its
// input alone: entries sorted by path, every time the image's Created (the
// SOURCE_DATE_EPOCH convention), owners numeric, no user or group names,
// gzip without a name or a time, so the same input gives the same digest.
// go-containerregistry would also do, but writes an OCI layout as a
// directory (the archive would be ours to make anyway) and brings its own
// module graph for what is here a few JSON documents.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	// go-digest's sha256 is crypto/sha256, registered by this import:
	// without it digest.FromBytes panics in a program that does not
	// happen to import it elsewhere.
	_ "crypto/sha256"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// ContainerdNameAnnotation names the image when containerd imports the
// archive; docker load reads it too. OCI's own ref.name annotation carries
// the same full reference, which is what podman load names the image by.
const ContainerdNameAnnotation = "io.containerd.image.name"

// FileType is the kind of a layer entry.
type FileType int

const (
	Regular FileType = iota
	Dir
	Symlink
	// Hardlink is a second name of a regular file of the same layer.
	Hardlink
)

// File is one entry of a layer.
type File struct {
	// Path in the image: slash-separated, relative to the root, clean.
	Path string
	Type FileType
	// Mode is the permission bits, setuid, setgid and sticky included.
	Mode     int64
	UID, GID int
	// Data is a regular file's contents, unless Source is set.
	Data []byte
	// Source is a host file whose contents a regular file gets, read
	// when the layer is written.
	Source string
	// Link is a symlink's target, or the path of a hard link's file.
	Link string
}

// Layer is one layer of an image.
type Layer struct {
	Files []File
	// CreatedBy says what made the layer, in the image's history.
	CreatedBy string
}

// Image is what the archive holds.
type Image struct {
	// Name is the image's full reference (registry/repository:tag): an
	// import into containerd or podman names it so.
	Name     string
	Platform v1.Platform
	// Created is the image's time and every file's.
	Created time.Time
	// Config is what a container of the image runs: user, entrypoint,
	// environment, labels.
	Config v1.ImageConfig
	Layers []Layer
}

// WriteFile writes the image's archive to file, through a temporary file
// in the same directory, and returns the manifest's digest: the image's ID
// as containerd and podman show it.
func (img Image) WriteFile(file string) (digest.Digest, error) {
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+"-*")
	if err != nil {
		return "", fmt.Errorf("image %s: %w", img.Name, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	d, err := img.Write(tmp)
	if err != nil {
		_ = tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o644); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("image %s: %w", img.Name, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("image %s: %w", img.Name, err)
	}
	if err := os.Rename(tmp.Name(), file); err != nil {
		return "", fmt.Errorf("image %s: %w", img.Name, err)
	}
	return d, nil
}

// Write writes the image as an OCI image layout archive and returns the
// manifest's digest.
func (img Image) Write(w io.Writer) (digest.Digest, error) {
	if img.Name == "" || img.Platform.OS == "" || img.Platform.Architecture == "" {
		return "", fmt.Errorf("image %q: a name, an OS and an architecture are required", img.Name)
	}
	created := img.Created.UTC()
	type blob struct {
		desc v1.Descriptor
		data []byte
	}
	var blobs []blob
	add := func(mediaType string, data []byte) v1.Descriptor {
		d := v1.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}
		blobs = append(blobs, blob{d, data})
		return d
	}
	config := v1.Image{
		Created:  &created,
		Platform: img.Platform,
		Config:   img.Config,
		RootFS:   v1.RootFS{Type: "layers"},
	}
	var layers []v1.Descriptor
	for i, l := range img.Layers {
		tarball, err := layerTar(l.Files, created)
		if err != nil {
			return "", fmt.Errorf("image %s: layer %d (%s): %w", img.Name, i, l.CreatedBy, err)
		}
		gz, err := compress(tarball)
		if err != nil {
			return "", fmt.Errorf("image %s: layer %d: %w", img.Name, i, err)
		}
		config.RootFS.DiffIDs = append(config.RootFS.DiffIDs, digest.FromBytes(tarball))
		config.History = append(config.History, v1.History{Created: &created, CreatedBy: l.CreatedBy})
		layers = append(layers, add(v1.MediaTypeImageLayerGzip, gz))
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return "", fmt.Errorf("image %s: config: %w", img.Name, err)
	}
	manifest := v1.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageManifest,
		Config:    add(v1.MediaTypeImageConfig, configJSON),
		Layers:    layers,
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return "", fmt.Errorf("image %s: manifest: %w", img.Name, err)
	}
	md := add(v1.MediaTypeImageManifest, manifestJSON)
	md.Platform = &img.Platform
	md.Annotations = map[string]string{v1.AnnotationRefName: img.Name, ContainerdNameAnnotation: img.Name}
	index, err := json.Marshal(v1.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: v1.MediaTypeImageIndex,
		Manifests: []v1.Descriptor{md},
	})
	if err != nil {
		return "", fmt.Errorf("image %s: index: %w", img.Name, err)
	}
	layout, err := json.Marshal(v1.ImageLayout{Version: v1.ImageLayoutVersion})
	if err != nil {
		return "", err
	}

	tw := tar.NewWriter(w)
	entry := func(name string, data []byte) error {
		h := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: created, Typeflag: tar.TypeReg}
		if data == nil {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	if err := entry(v1.ImageLayoutFile, layout); err != nil {
		return "", fmt.Errorf("image %s: %w", img.Name, err)
	}
	if err := entry(v1.ImageIndexFile, index); err != nil {
		return "", fmt.Errorf("image %s: %w", img.Name, err)
	}
	if err := entry(v1.ImageBlobsDir+"/", nil); err != nil {
		return "", fmt.Errorf("image %s: %w", img.Name, err)
	}
	if err := entry(v1.ImageBlobsDir+"/sha256/", nil); err != nil {
		return "", fmt.Errorf("image %s: %w", img.Name, err)
	}
	slices.SortFunc(blobs, func(a, b blob) int { return strings.Compare(a.desc.Digest.String(), b.desc.Digest.String()) })
	written := map[digest.Digest]bool{}
	for _, b := range blobs {
		// Two layers alike are one blob.
		if written[b.desc.Digest] {
			continue
		}
		written[b.desc.Digest] = true
		if err := entry(blobPath(b.desc.Digest), b.data); err != nil {
			return "", fmt.Errorf("image %s: %w", img.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return "", fmt.Errorf("image %s: %w", img.Name, err)
	}
	return md.Digest, nil
}

func blobPath(d digest.Digest) string {
	return path.Join(v1.ImageBlobsDir, d.Algorithm().String(), d.Encoded())
}

// layerTar writes a layer's files as a tar, sorted by path: a directory
// comes before what it holds.
func layerTar(files []File, mtime time.Time) ([]byte, error) {
	files = slices.Clone(files)
	slices.SortStableFunc(files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for i, f := range files {
		if f.Path == "" || path.Clean(f.Path) != f.Path || path.IsAbs(f.Path) || f.Path == "." || strings.HasPrefix(f.Path, "../") {
			return nil, fmt.Errorf("file %q: not a clean relative path", f.Path)
		}
		if i > 0 && files[i-1].Path == f.Path {
			return nil, fmt.Errorf("file %q: twice in one layer", f.Path)
		}
		h := &tar.Header{Name: f.Path, Mode: f.Mode, Uid: f.UID, Gid: f.GID, ModTime: mtime}
		var data []byte
		switch f.Type {
		case Dir:
			h.Typeflag, h.Name = tar.TypeDir, f.Path+"/"
		case Symlink:
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
		case Hardlink:
			h.Typeflag, h.Linkname = tar.TypeLink, f.Link
		case Regular:
			data = f.Data
			if f.Source != "" {
				var err error
				if data, err = os.ReadFile(f.Source); err != nil {
					return nil, fmt.Errorf("file %s: %w", f.Path, err)
				}
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		default:
			return nil, fmt.Errorf("file %s: unknown type %d", f.Path, f.Type)
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("file %s: %w", f.Path, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("file %s: %w", f.Path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// compress gzips a layer. The header has no name and no time, so the
// output follows the input alone (for one Go release: compress/flate's
// output may change between releases, the layer's diff ID does not).
func compress(data []byte) ([]byte, error) {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
