package cdi

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/fifotest"
)

// blockBound is far beyond what reading a CDI directory takes; a read
// blocked on a FIFO never ends.
const blockBound = 20 * time.Second

const nvidiaSpec = `cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}
`

// Whoever can write in a CDI directory decides what is there: a FIFO, a
// device, a symlink to either, a file too large, named as a spec. Each is
// left out, with an error naming it and what it is, and nothing blocks on
// it; the specs beside them are read, a symlink to a regular file
// included, as the runtimes read it.
func TestReadSpecDirsLeavesOutWhatIsNotARegularFileOfBoundedSize(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	valid := write("nvidia.yaml", nvidiaSpec)
	fifo := filepath.Join(dir, "fifo.json")
	fifotest.Make(t, fifo)
	outside := filepath.Join(t.TempDir(), "outside.yaml")
	if err := os.WriteFile(outside, []byte(strings.ReplaceAll(nvidiaSpec, `"0"`, `"1"`)), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.yaml")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	fifoLink := filepath.Join(dir, "fifo-link.yaml")
	if err := os.Symlink(fifo, fifoLink); err != nil {
		t.Fatal(err)
	}
	device := filepath.Join(dir, "zero.json")
	// /dev/zero's numbers: a reader that does not stop reads for ever.
	if err := syscall.Mknod(device, syscall.S_IFCHR|0o644, int(unix.Mkdev(1, 5))); err != nil {
		t.Fatal(err)
	}
	large := write("large.yaml", nvidiaSpec+"# "+strings.Repeat("x", MaxSpecSize)+"\n")
	empty := write("empty.json", `{"cdiVersion":"0.5.0","kind":"example.com/x","devices":[{"name":"a","containerEdits":{}}]}`)
	write("notes.txt", "not a spec")
	if err := os.Mkdir(filepath.Join(dir, "sub.json"), 0o755); err != nil {
		t.Fatal(err)
	}

	var specs *Specs
	if !fifotest.Returns(t, blockBound, func() { specs = ReadSpecDirs([]string{dir, filepath.Join(dir, "none")}) }, fifo) {
		t.Fatalf("ReadSpecDirs blocked on %s", fifo)
	}
	if got := specs.Paths(); len(got) != 2 || got[0] != link || got[1] != valid {
		t.Errorf("read %v, want %s and %s", got, link, valid)
	}
	want := map[string]string{
		fifo:     fifo + " is a FIFO, not a regular file",
		fifoLink: fifoLink + " is a FIFO, not a regular file",
		device:   device + " is a device, not a regular file",
		large:    "more than the 4194304 a CDI spec may have",
		empty:    "empty device edits",
	}
	if len(specs.Skipped) != len(want) {
		t.Errorf("left out %v, want %d files", specs.Skipped, len(want))
	}
	for path, msg := range want {
		found := false
		for _, err := range specs.Skipped {
			found = found || (strings.Contains(err.Error(), path) && strings.Contains(err.Error(), msg))
		}
		if !found {
			t.Errorf("no error names %s with %q: %v", path, msg, specs.Skipped)
		}
		if _, err := ReadSpecFile(path); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ReadSpecFile(%s): %v, want %q", path, err, msg)
		}
	}
	if got, err := specs.NVIDIADevices(nil); err != nil || len(got) != 0 {
		t.Errorf("NVIDIA devices %v %v", got, err)
	}
	if d := specs.Devices(); len(d) != 2 || d["nvidia.com/gpu=0"] == nil || d["nvidia.com/gpu=1"] == nil {
		t.Errorf("devices %v, want nvidia.com/gpu=0 and =1", d)
	}
}

// The CDI cache's resolution: a later directory's device wins over an
// earlier one's; two specs of one directory that define the same device
// both lose it.
func TestSpecsDevicesResolveAsTheCDICacheDoes(t *testing.T) {
	early, late := t.TempDir(), t.TempDir()
	for path, name := range map[string]string{
		filepath.Join(early, "a.yaml"): "0", filepath.Join(late, "b.yaml"): "0",
		filepath.Join(early, "c.yaml"): "1", filepath.Join(early, "d.yaml"): "1",
	} {
		if err := os.WriteFile(path, []byte(strings.ReplaceAll(nvidiaSpec, `"0"`, `"`+name+`"`)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := ReadSpecDirs([]string{early, late}).Devices()
	if len(d) != 1 || d["nvidia.com/gpu=0"] == nil || d["nvidia.com/gpu=0"].Path != filepath.Join(late, "b.yaml") {
		t.Errorf("devices %v, want nvidia.com/gpu=0 of %s alone", d, late)
	}
}

// The plugin opens its CDI root with a Writer at start, and reads a
// claim's spec back when it rebuilds its checkpoint: neither blocks on a
// FIFO there, named as NVIDIA's spec or as a claim's.
func TestWriterBesideAFIFO(t *testing.T) {
	dir := t.TempDir()
	nvidia, claim := filepath.Join(dir, "nvidia.yaml"), filepath.Join(dir, SpecName("uid-fifo")+specExt)
	fifotest.Make(t, nvidia)
	fifotest.Make(t, claim)
	edits := &containeredits.Edits{Env: []string{"KYB_GPU_GROUP=G0"}}
	var readErr error
	var present bool
	if !fifotest.Returns(t, blockBound, func() {
		w, err := NewWriter(dir)
		if err != nil {
			t.Error(err)
			return
		}
		if err := w.Write("uid-a", []Device{{Name: "d", Edits: edits}}); err != nil {
			t.Error(err)
		}
		_, present, readErr = w.ReadEnv(types.UID("uid-fifo"))
	}, nvidia, claim) {
		t.Fatalf("the writer blocked on a FIFO in %s", dir)
	}
	if !present || readErr == nil || !strings.Contains(readErr.Error(), "is a FIFO") {
		t.Errorf("a FIFO as a claim's spec: present %v, %v; want present, with an error saying it is a FIFO", present, readErr)
	}
}
