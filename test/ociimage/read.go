package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"runtime"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"
	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

// Archive is an image read back from an archive: what Write wrote, or what
// `docker save` writes (an OCI layout since Docker 25, its own
// manifest.json before), so that the two can be compared.
type Archive struct {
	// Name is the reference the archive gives the image.
	Name string
	// Digest is the manifest's digest; empty for a Docker archive without
	// an OCI index.
	Digest digest.Digest
	Config v1.Image
	// Files is the image's file system, its layers applied in order,
	// sorted by path; regular files carry their Data.
	Files []File
}

// File returns the file at p (no leading slash), if the image has one.
func (a *Archive) File(p string) (File, bool) {
	i, ok := slices.BinarySearchFunc(a.Files, p, func(f File, p string) int { return strings.Compare(f.Path, p) })
	if !ok {
		return File{}, false
	}
	return a.Files[i], true
}

// Read reads an image archive. Of an index of several images it takes the
// one for this machine's platform.
func Read(file string) (*Archive, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	entries := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", file, h.Name, err)
		}
		entries[path.Clean(h.Name)] = data
	}
	var a *Archive
	if _, ok := entries[v1.ImageIndexFile]; ok {
		a, err = readLayout(entries)
	} else {
		a, err = readDockerArchive(entries)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return a, nil
}

func readLayout(entries map[string][]byte) (*Archive, error) {
	blob := func(d v1.Descriptor) ([]byte, error) {
		data, ok := entries[blobPath(d.Digest)]
		if !ok {
			return nil, fmt.Errorf("blob %s is missing", d.Digest)
		}
		if digest.FromBytes(data) != d.Digest {
			return nil, fmt.Errorf("blob %s has another digest", d.Digest)
		}
		return data, nil
	}
	var index v1.Index
	if err := json.Unmarshal(entries[v1.ImageIndexFile], &index); err != nil {
		return nil, fmt.Errorf("%s: %w", v1.ImageIndexFile, err)
	}
	var name string
	// Indexes nest (docker save of a multi-platform image): follow them
	// down to this platform's manifest.
	for depth := 0; ; depth++ {
		d, err := pick(index.Manifests)
		if err != nil {
			return nil, err
		}
		name = nameOf(d.Annotations, name)
		data, err := blob(d)
		if err != nil {
			return nil, err
		}
		switch {
		case d.MediaType == v1.MediaTypeImageIndex && depth < 4:
			if err := json.Unmarshal(data, &index); err != nil {
				return nil, fmt.Errorf("index %s: %w", d.Digest, err)
			}
			continue
		case d.MediaType != v1.MediaTypeImageManifest && d.MediaType != "application/vnd.docker.distribution.manifest.v2+json":
			return nil, fmt.Errorf("descriptor %s: media type %s is not an image manifest", d.Digest, d.MediaType)
		}
		var m v1.Manifest
		if err := json.Unmarshal(data, &m); err != nil {
			return nil, fmt.Errorf("manifest %s: %w", d.Digest, err)
		}
		configData, err := blob(m.Config)
		if err != nil {
			return nil, err
		}
		var layers [][]byte
		for _, l := range m.Layers {
			data, err := blob(l)
			if err != nil {
				return nil, err
			}
			layers = append(layers, data)
		}
		return assemble(name, d.Digest, configData, layers)
	}
}

// pick chooses this platform's image among an index's descriptors; Docker's
// attestation manifests have the platform unknown/unknown.
func pick(ds []v1.Descriptor) (v1.Descriptor, error) {
	var fit []v1.Descriptor
	for _, d := range ds {
		if d.Platform == nil || (d.Platform.OS == runtime.GOOS && d.Platform.Architecture == runtime.GOARCH) {
			fit = append(fit, d)
		}
	}
	if len(fit) != 1 {
		return v1.Descriptor{}, fmt.Errorf("the index has %d images for %s/%s, not one", len(fit), runtime.GOOS, runtime.GOARCH)
	}
	return fit[0], nil
}

func nameOf(annotations map[string]string, name string) string {
	if n := annotations[ContainerdNameAnnotation]; n != "" {
		return n
	}
	if n := annotations[v1.AnnotationRefName]; n != "" && name == "" {
		return n
	}
	return name
}

// readDockerArchive reads the format of `docker save` before Docker 25.
func readDockerArchive(entries map[string][]byte) (*Archive, error) {
	var m []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	data, ok := entries["manifest.json"]
	if !ok {
		return nil, fmt.Errorf("neither %s nor manifest.json: not an image archive", v1.ImageIndexFile)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("manifest.json: %w", err)
	}
	if len(m) != 1 {
		return nil, fmt.Errorf("manifest.json has %d images, not one", len(m))
	}
	var name string
	if len(m[0].RepoTags) > 0 {
		name = m[0].RepoTags[0]
	}
	var layers [][]byte
	for _, l := range m[0].Layers {
		data, ok := entries[path.Clean(l)]
		if !ok {
			return nil, fmt.Errorf("layer %s is missing", l)
		}
		layers = append(layers, data)
	}
	return assemble(name, "", entries[path.Clean(m[0].Config)], layers)
}

// assemble applies the layers in order, with their whiteouts.
func assemble(name string, d digest.Digest, configData []byte, layers [][]byte) (*Archive, error) {
	a := &Archive{Name: name, Digest: d}
	if err := json.Unmarshal(configData, &a.Config); err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	if len(a.Config.RootFS.DiffIDs) != len(layers) {
		return nil, fmt.Errorf("the config names %d layers, the manifest %d", len(a.Config.RootFS.DiffIDs), len(layers))
	}
	files := map[string]File{}
	for i, layer := range layers {
		if bytes.HasPrefix(layer, []byte{0x1f, 0x8b}) {
			zr, err := gzip.NewReader(bytes.NewReader(layer))
			if err != nil {
				return nil, fmt.Errorf("layer %d: %w", i, err)
			}
			if layer, err = io.ReadAll(zr); err != nil {
				return nil, fmt.Errorf("layer %d: %w", i, err)
			}
		}
		if got := digest.FromBytes(layer); got != a.Config.RootFS.DiffIDs[i] {
			return nil, fmt.Errorf("layer %d: diff ID %s, the config says %s", i, got, a.Config.RootFS.DiffIDs[i])
		}
		if err := apply(files, layer); err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
	}
	a.Files = slices.SortedFunc(maps.Values(files), func(x, y File) int { return strings.Compare(x.Path, y.Path) })
	return a, nil
}

// apply applies one layer's tar to files.
func apply(files map[string]File, layer []byte) error {
	remove := func(p string) {
		for k := range files {
			if k == p || strings.HasPrefix(k, p+"/") {
				delete(files, k)
			}
		}
	}
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if p == "" {
			continue
		}
		dir, base := path.Split(p)
		switch {
		case base == ".wh..wh..opq":
			for k := range files {
				if strings.HasPrefix(k, dir) {
					delete(files, k)
				}
			}
			continue
		case strings.HasPrefix(base, ".wh."):
			remove(dir + strings.TrimPrefix(base, ".wh."))
			continue
		}
		f := File{Path: p, Mode: h.Mode & 0o7777, UID: h.Uid, GID: h.Gid, Link: h.Linkname}
		switch h.Typeflag {
		case tar.TypeDir:
			f.Type = Dir
		case tar.TypeSymlink:
			f.Type = Symlink
		case tar.TypeLink:
			f.Type, f.Link = Hardlink, strings.TrimPrefix(path.Clean("/"+h.Linkname), "/")
		case tar.TypeReg:
			f.Type = Regular
			if f.Data, err = io.ReadAll(tr); err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
		default:
			return fmt.Errorf("%s: entry type %q is not one this package knows", p, h.Typeflag)
		}
		if f.Type != Dir {
			remove(p)
		}
		files[p] = f
	}
}
