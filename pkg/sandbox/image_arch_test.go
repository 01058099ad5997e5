package sandbox

import (
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A host with the libraries of another architecture installed beside its
// own (Debian multiarch: dpkg --add-architecture amd64 on an arm64 GH200
// or GB200 host, for tools run under emulation) has a libm.so.6 in a
// directory the image looks in first. The image must be the program's
// glibc: a library of another machine is no image a container of this
// node has, and the loader refuses it, so the probe fails for a reason no
// seat's container meets. Here the foreign library is the host's own
// libm.so.6 marked as an aarch64 one, in a directory looked in first.
func TestTheImageTakesNoLibraryOfAnotherMachine(t *testing.T) {
	// The host's /bin/sh: a dynamically linked program of its machine.
	program, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	prog, err := elf.Open(program)
	if err != nil {
		t.Fatal(err)
	}
	machine := prog.Machine
	_ = prog.Close()
	real := findLibrary("libm.so.6")
	if real == "" {
		t.Fatal("the host has no libm.so.6")
	}
	data, err := os.ReadFile(real)
	if err != nil {
		t.Fatal(err)
	}
	other := elf.EM_AARCH64
	if machine == elf.EM_AARCH64 {
		other = elf.EM_X86_64
	}
	binary.LittleEndian.PutUint16(data[18:20], uint16(other)) // e_machine
	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "libm.so.6"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	saved := libraryDirs
	libraryDirs = append([]string{foreign}, saved...)
	t.Cleanup(func() { libraryDirs = saved })

	binds, err := Image(program)
	if err != nil {
		return // refused, naming the library: no image of another machine
	}
	for _, b := range binds {
		if b.Target == ProgramPath {
			continue
		}
		f, err := elf.Open(b.Source)
		if err != nil {
			t.Fatalf("%s: %v", b.Source, err)
		}
		if f.Machine != machine {
			t.Errorf("the image binds %s, a %s library, at %s for a %s program", b.Source, f.Machine, b.Target, machine)
		}
		_ = f.Close()
	}
	if !slices.ContainsFunc(binds, func(b Bind) bool { return filepath.Base(b.Target) == "libm.so.6" }) {
		t.Error("the image has no libm.so.6")
	}
}
