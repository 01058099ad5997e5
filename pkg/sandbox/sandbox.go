// Package sandbox is the inside of the doctor's sandbox: run as the first
// stage of a program in a new mount namespace, it builds a root that holds
// only what a Config lists (bind mounts and device nodes), changes into it
// and executes the program there with the Config's environment, as a
// container runtime would start a container. It links nothing but the
// standard library and x/sys, so that the probe that embeds it stays
// small; package cdisandbox writes the Config from CDI specs.
package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// ProgramPath is where the program is in the sandbox.
const ProgramPath = "/probe"

// Config is everything the sandbox's first stage needs, written by Run and
// read by Enter in the new mount namespace.
type Config struct {
	// Root is an empty directory that becomes the sandbox's root.
	Root string `json:"root"`
	// Binds are files and directories bound in, sources as this process
	// sees them.
	Binds []Bind `json:"binds"`
	// Nodes are device nodes the host lacks, made from their numbers.
	Nodes []Node `json:"nodes"`
	// Env is the program's whole environment.
	Env []string `json:"env"`
	// Hooks are the CDI hooks not run, for the report.
	Hooks []string `json:"hooks,omitempty"`
}

// Bind is one bind mount.
type Bind struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly"`
}

// Node is a character device node.
type Node struct {
	Path  string `json:"path"`
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
}

// EnterArg is the program's first argument that makes it Enter the
// sandbox described by the second.
const EnterArg = "--enter-sandbox"

// ErrNoNamespace explains why the sandbox cannot be built.
var ErrNoNamespace = errors.New("the sandbox needs a mount namespace: run as root (CAP_SYS_ADMIN)")

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
		return fmt.Errorf("make mounts private: %w: %w", err, ErrNoNamespace)
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
