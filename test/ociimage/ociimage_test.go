package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	v1 "github.com/opencontainers/image-spec/specs-go/v1"
)

func testImage(created time.Time) Image {
	return Image{
		Name:     "example.com/team/app:1.2.3",
		Platform: v1.Platform{OS: "linux", Architecture: "amd64"},
		Created:  created,
		Config: v1.ImageConfig{
			User:       "65532:65532",
			Entrypoint: []string{"/usr/local/bin/app"},
			Env:        []string{"PATH=/usr/local/bin:/bin"},
			Labels:     map[string]string{"org.opencontainers.image.version": "1.2.3", "a": "b"},
		},
		Layers: []Layer{
			{CreatedBy: "base", Files: []File{
				// Out of order on purpose: the writer sorts.
				{Path: "tmp", Type: Dir, Mode: 0o1777},
				{Path: "etc/passwd", Data: []byte("root:x:0:0::/root:/sbin/nologin\n"), Mode: 0o644},
				{Path: "etc", Type: Dir, Mode: 0o755},
				{Path: "home/nonroot", Type: Dir, Mode: 0o700, UID: 65532, GID: 65532},
				{Path: "home", Type: Dir, Mode: 0o755},
				{Path: "lib64", Type: Dir, Mode: 0o755},
				{Path: "lib64/ld.so", Type: Symlink, Link: "/lib/ld.so", Mode: 0o777},
				{Path: "old", Data: []byte("gone in the next layer"), Mode: 0o600},
			}},
			{CreatedBy: "app", Files: []File{
				{Path: "usr", Type: Dir, Mode: 0o755},
				{Path: "usr/local", Type: Dir, Mode: 0o755},
				{Path: "usr/local/bin", Type: Dir, Mode: 0o755},
				{Path: "usr/local/bin/app", Data: []byte("#!app"), Mode: 0o755},
				{Path: "usr/local/bin/app2", Type: Hardlink, Link: "usr/local/bin/app"},
				{Path: "etc/passwd", Data: []byte("replaced\n"), Mode: 0o644},
				{Path: ".wh.old", Mode: 0o600},
			}},
		},
	}
}

// TestWriteIsReproducible: the archive follows from the image alone, not
// from when it is written or in which order its files are listed.
func TestWriteIsReproducible(t *testing.T) {
	created := time.Unix(1700000000, 0)
	var first bytes.Buffer
	d1, err := testImage(created).Write(&first)
	if err != nil {
		t.Fatal(err)
	}
	img := testImage(created)
	files := img.Layers[0].Files
	for i, j := 0, len(files)-1; i < j; i, j = i+1, j-1 {
		files[i], files[j] = files[j], files[i]
	}
	var second bytes.Buffer
	d2, err := img.Write(&second)
	if err != nil {
		t.Fatal(err)
	}
	if d1 != d2 || !bytes.Equal(first.Bytes(), second.Bytes()) {
		t.Errorf("two writes of one image differ: %s and %s", d1, d2)
	}
	d3, err := testImage(created.Add(time.Second)).Write(io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d3 == d1 {
		t.Errorf("another creation time gave the same digest %s", d3)
	}
}

// TestArchiveLayout checks the archive's own entries: the layout marker,
// an index naming the image for containerd and for OCI tools, blobs by
// digest, and every time the image's.
func TestArchiveLayout(t *testing.T) {
	created := time.Unix(1700000000, 0)
	var b bytes.Buffer
	d, err := testImage(created).Write(&b)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	entries := map[string][]byte{}
	tr := tar.NewReader(&b)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(created) || h.Uname != "" || h.Uid != 0 {
			t.Errorf("%s: time %v, owner %q (%d); want %v, root by number", h.Name, h.ModTime, h.Uname, h.Uid, created)
		}
		data, _ := io.ReadAll(tr)
		names = append(names, h.Name)
		entries[h.Name] = data
	}
	if len(names) != 8 || !reflect.DeepEqual(names[:4], []string{"oci-layout", "index.json", "blobs/", "blobs/sha256/"}) {
		t.Errorf("entries %q; want oci-layout, index.json, blobs/, blobs/sha256/, then 4 blobs (config, manifest, 2 layers)", names)
	}
	if got := string(entries["oci-layout"]); got != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout %s", got)
	}
	var index v1.Index
	if err := json.Unmarshal(entries["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("index has %d manifests, want 1", len(index.Manifests))
	}
	m := index.Manifests[0]
	want := map[string]string{"org.opencontainers.image.ref.name": "example.com/team/app:1.2.3", "io.containerd.image.name": "example.com/team/app:1.2.3"}
	if m.Digest != d || m.MediaType != v1.MediaTypeImageManifest || !reflect.DeepEqual(m.Annotations, want) ||
		m.Platform == nil || m.Platform.OS != "linux" || m.Platform.Architecture != "amd64" {
		t.Errorf("index entry %+v; want the manifest %s for linux/amd64 with annotations %v", m, d, want)
	}
	var manifest v1.Manifest
	if err := json.Unmarshal(entries["blobs/sha256/"+d.Encoded()], &manifest); err != nil {
		t.Fatal(err)
	}
	if len(manifest.Layers) != 2 || manifest.Layers[0].MediaType != v1.MediaTypeImageLayerGzip {
		t.Errorf("manifest layers %+v; want 2 gzip layers", manifest.Layers)
	}
}

// TestReadBack: what Read gives is what was written, the second layer
// over the first (a file replaced, one whited out), owners and modes kept.
func TestReadBack(t *testing.T) {
	created := time.Unix(0, 0)
	file := filepath.Join(t.TempDir(), "app.oci.tar")
	d, err := testImage(created).WriteFile(file)
	if err != nil {
		t.Fatal(err)
	}
	a, err := Read(file)
	if err != nil {
		t.Fatal(err)
	}
	if a.Name != "example.com/team/app:1.2.3" || a.Digest != d {
		t.Errorf("name %q digest %s; want example.com/team/app:1.2.3 %s", a.Name, a.Digest, d)
	}
	wantConfig := testImage(created).Config
	if !reflect.DeepEqual(a.Config.Config, wantConfig) || a.Config.OS != "linux" || a.Config.Architecture != "amd64" || !a.Config.Created.Equal(created) {
		t.Errorf("config %+v; want %+v for linux/amd64 created %v", a.Config, wantConfig, created)
	}
	if len(a.Config.History) != 2 || a.Config.History[0].CreatedBy != "base" || a.Config.History[1].CreatedBy != "app" {
		t.Errorf("history %+v; want base, app", a.Config.History)
	}
	want := []File{
		{Path: "etc", Type: Dir, Mode: 0o755},
		{Path: "etc/passwd", Data: []byte("replaced\n"), Mode: 0o644},
		{Path: "home", Type: Dir, Mode: 0o755},
		{Path: "home/nonroot", Type: Dir, Mode: 0o700, UID: 65532, GID: 65532},
		{Path: "lib64", Type: Dir, Mode: 0o755},
		{Path: "lib64/ld.so", Type: Symlink, Link: "/lib/ld.so", Mode: 0o777},
		{Path: "tmp", Type: Dir, Mode: 0o1777},
		{Path: "usr", Type: Dir, Mode: 0o755},
		{Path: "usr/local", Type: Dir, Mode: 0o755},
		{Path: "usr/local/bin", Type: Dir, Mode: 0o755},
		{Path: "usr/local/bin/app", Data: []byte("#!app"), Mode: 0o755},
		{Path: "usr/local/bin/app2", Type: Hardlink, Link: "usr/local/bin/app"},
	}
	for i := range a.Files {
		if a.Files[i].Type == Regular && len(a.Files[i].Data) == 0 {
			a.Files[i].Data = nil
		}
	}
	if !reflect.DeepEqual(a.Files, want) {
		t.Errorf("files:\n%+v\nwant:\n%+v", a.Files, want)
	}
	if f, ok := a.File("usr/local/bin/app"); !ok || string(f.Data) != "#!app" {
		t.Errorf("File(usr/local/bin/app) = %+v, %v", f, ok)
	}
	if _, ok := a.File("old"); ok {
		t.Errorf("the whited-out file is still there")
	}
	info, err := os.Stat(file)
	if err != nil || info.Mode().Perm() != 0o644 {
		t.Errorf("archive mode %v (%v); want 0644", info.Mode(), err)
	}
}

func TestWriteRefusesBadFiles(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files []File
		want  string
	}{
		{"absolute", []File{{Path: "/etc/passwd"}}, `file "/etc/passwd": not a clean relative path`},
		{"unclean", []File{{Path: "etc/../passwd"}}, `file "etc/../passwd": not a clean relative path`},
		{"outside", []File{{Path: "../passwd"}}, `file "../passwd": not a clean relative path`},
		{"twice", []File{{Path: "etc", Type: Dir}, {Path: "etc", Type: Dir}}, `file "etc": twice in one layer`},
		{"missing source", []File{{Path: "bin/app", Source: "/nonexistent/app"}}, "file bin/app: open /nonexistent/app: no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := Image{Name: "x:1", Platform: v1.Platform{OS: "linux", Architecture: "amd64"}, Layers: []Layer{{CreatedBy: "test", Files: tc.files}}}
			_, err := img.Write(io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v; want one saying %q", err, tc.want)
			}
		})
	}
}

// TestDigestsInAProgramOfItsOwn: go-digest hashes with whatever
// crypto/sha256 registered, and a test binary always links it (testing
// does), so only a program of its own shows that ociimage registers it.
func TestDigestsInAProgramOfItsOwn(t *testing.T) {
	out, err := exec.Command("go", "run", "./testdata/writeone").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "sha256:") {
		t.Errorf("a program writing an image with ociimage alone (%v) printed:\n%s", err, out)
	}
}
