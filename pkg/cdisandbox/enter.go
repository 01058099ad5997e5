package cdisandbox

import (
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// libraryDirs are where the image's libraries are looked for, as the
// dynamic loader of a glibc system looks.
var libraryDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// imageFiles are the sandbox's image: the program at ProgramPath, its ELF
// interpreter and the shared libraries it needs (and they need), each at
// its own path. Nothing else of the host is visible, so that whatever
// driver file the program finds came from the devices' edits.
func imageFiles(program string) ([]Bind, error) {
	binds := []Bind{{Source: program, Target: ProgramPath, ReadOnly: true}}
	seen := map[string]bool{}
	queue := []string{program}
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
			seen[interp] = true
			binds = append(binds, Bind{Source: interp, Target: interp, ReadOnly: true})
		}
		for _, lib := range needed {
			found := findLibrary(lib)
			if found == "" {
				return nil, fmt.Errorf("%s needs %s, which is in none of %v", path, lib, libraryDirs)
			}
			if seen[found] {
				continue
			}
			seen[found] = true
			binds = append(binds, Bind{Source: found, Target: found, ReadOnly: true})
			queue = append(queue, found)
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

// Enter is the sandbox's first stage, run as `<program> --enter-sandbox
// <config>` in a new mount namespace: it builds the root the config
// describes, changes into it and executes the program there with the
// config's environment. It returns only on failure.
func Enter(configPath string) error {
	data, err := os.ReadFile(configPath)
	if err != nil {
		return fmt.Errorf("read sandbox config: %w", err)
	}
	var cfg Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("sandbox config %s: %w", configPath, err)
	}
	// Nothing mounted here may leak to the host's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w: %w", err, errNoNamespace)
	}
	if err := unix.Mount("tmpfs", cfg.Root, "tmpfs", unix.MS_NOSUID, "mode=0755"); err != nil {
		return fmt.Errorf("sandbox root: %w", err)
	}
	for _, b := range cfg.Binds {
		if err := bind(cfg.Root, b); err != nil {
			return err
		}
	}
	for _, n := range cfg.Nodes {
		target := filepath.Join(cfg.Root, n.Path)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if err := unix.Mknod(target, unix.S_IFCHR|0o666, int(unix.Mkdev(uint32(n.Major), uint32(n.Minor)))); err != nil {
			return fmt.Errorf("device node %s: %w", n.Path, err)
		}
	}
	if err := os.MkdirAll(filepath.Join(cfg.Root, "tmp"), 0o1777); err != nil {
		return err
	}
	if err := unix.Chroot(cfg.Root); err != nil {
		return fmt.Errorf("chroot %s: %w", cfg.Root, err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	return unix.Exec(ProgramPath, []string{ProgramPath}, cfg.Env)
}

// bind mounts b.Source at b.Target under root, read-only where asked.
func bind(root string, b Bind) error {
	fi, err := os.Stat(b.Source)
	if err != nil {
		return fmt.Errorf("bind %s: %w", b.Target, err)
	}
	target := filepath.Join(root, b.Target)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	if fi.IsDir() {
		err = os.MkdirAll(target, 0o755)
	} else if _, statErr := os.Stat(target); os.IsNotExist(statErr) {
		err = os.WriteFile(target, nil, 0o644)
	}
	if err != nil {
		return fmt.Errorf("bind %s: %w", b.Target, err)
	}
	if err := unix.Mount(b.Source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", b.Source, b.Target, err)
	}
	if b.ReadOnly {
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_REC)
		if err := unix.Mount("", target, "", flags, ""); err != nil {
			return fmt.Errorf("read-only %s: %w", b.Target, err)
		}
	}
	return nil
}

// Targets are the paths the sandbox shows, sorted, for reports.
func (c *Config) Targets() []string {
	var out []string
	for _, b := range c.Binds {
		out = append(out, b.Target)
	}
	for _, n := range c.Nodes {
		out = append(out, n.Path)
	}
	slices.Sort(out)
	return out
}
