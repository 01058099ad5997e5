// Package sandbox is the inside of the doctor's sandbox: run as the first
// stage of a program in new mount and PID namespaces, it builds a root
// that holds only what a Config lists (a container's own file systems,
// device nodes, links and files, and bind mounts), changes into it and
// executes the program there with the Config's environment, as a
// container runtime would start a container. Container says what a plain
// container holds (container.go), Image what its image is (image.go).
// Every path of the Config is resolved inside the root and nothing is
// made outside it (paths.go says how). It links nothing but the standard
// library and x/sys, so that the probe that embeds it stays small;
// package cdisandbox adds a CDI spec's edits to the Config.
package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
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
	// Mounts are file systems made fresh, first, in order.
	Mounts []Mount `json:"mounts,omitempty"`
	// Files and Links are made next, so that binds may cover them.
	Files []File `json:"files,omitempty"`
	Links []Link `json:"links,omitempty"`
	// Binds are files and directories bound in, sources as this process
	// sees them.
	Binds []Bind `json:"binds"`
	// Nodes are device nodes: a container's own, and those a spec gives
	// that the host lacks, made from their numbers.
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
	// From names where the bind comes from (a CDI device and its spec
	// file), for errors.
	From string `json:"from,omitempty"`
}

// Node is a character device node.
type Node struct {
	Path  string `json:"path"`
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
	// From names where the node comes from, for errors.
	From string `json:"from,omitempty"`
}

// EnterArg is the program's first argument that makes it Enter the
// sandbox described by the second.
const EnterArg = "--enter-sandbox"

// ExitRefused is the first stage's exit status when it refuses a path of
// its config (ErrRefused), so that the caller can tell a hostile or broken
// spec from a sandbox that could not be built.
const ExitRefused = 3

// ExitCode is the first stage's exit status for the error Enter returned.
func ExitCode(err error) int {
	if errors.Is(err, ErrRefused) {
		return ExitRefused
	}
	return 1
}

// ErrNoNamespace explains why the sandbox cannot be built.
var ErrNoNamespace = errors.New("the sandbox needs its own mount and PID namespaces: run as root (CAP_SYS_ADMIN)")

// Enter is the sandbox's first stage, run as `<program> --enter-sandbox
// <config>` in new mount and PID namespaces: it builds the root the
// config describes, changes into it and executes the program there with
// the config's environment. It returns only on failure.
func Enter(configPath string) error {
	data, err := os.ReadFile(configPath)
	if err != nil {
		return fmt.Errorf("read sandbox config: %w", err)
	}
	var cfg Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("sandbox config %s: %w", configPath, err)
	}
	// As the init of its PID namespace, the program's /proc shows only the
	// processes of the sandbox; the kernel kills them all when it exits.
	if pid := os.Getpid(); pid != 1 {
		return fmt.Errorf("the sandbox's first stage is PID %d, not the init of a PID namespace of its own: %w", pid, ErrNoNamespace)
	}
	// Nothing mounted here may leak to the host's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w: %w", err, ErrNoNamespace)
	}
	// Modes are made as written (/tmp 1777, device nodes 0666); the
	// program gets a runtime's default umask.
	unix.Umask(0)
	if err := checkProc(); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", cfg.Root, "tmpfs", unix.MS_NOSUID, "mode=0755"); err != nil {
		return fmt.Errorf("sandbox root: %w", err)
	}
	root, err := openRoot(cfg.Root)
	if err != nil {
		return err
	}
	defer func() { _ = root.Close() }()
	if err := build(root, &cfg); err != nil {
		return err
	}
	if err := unix.Fchdir(root.fd); err != nil {
		return fmt.Errorf("enter sandbox root %s: %w", cfg.Root, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot %s: %w", cfg.Root, err)
	}
	unix.Umask(0o022)
	return unix.Exec(ProgramPath, []string{ProgramPath}, cfg.Env)
}

// build makes in root what cfg lists, in order: the file systems, files
// and links, the binds (each resolved after the ones before it, which may
// have bound directories on its way), the device nodes, and /tmp.
func build(root *rootDir, cfg *Config) error {
	for _, m := range cfg.Mounts {
		if err := mount(root, m); err != nil {
			return fmt.Errorf("%s: %s at %s: %w", defaultFrom, m.Type, m.Target, err)
		}
	}
	for _, f := range cfg.Files {
		if err := root.writeFile(f.Path, f.Content); err != nil {
			return fmt.Errorf("%s: file %s: %w", imageFrom, f.Path, err)
		}
	}
	for _, l := range cfg.Links {
		if err := root.symlink(l.Path, l.Target); err != nil {
			return fmt.Errorf("%s: link %s to %s: %w", defaultFrom, l.Path, l.Target, err)
		}
	}
	for _, b := range cfg.Binds {
		if err := bind(root, b); err != nil {
			return fmt.Errorf("%sbind %s at %s: %w", from(b.From), b.Source, b.Target, err)
		}
	}
	for _, n := range cfg.Nodes {
		if err := root.mknod(n.Path, n.Major, n.Minor); err != nil {
			return fmt.Errorf("%sdevice node %s: %w", from(n.From), n.Path, err)
		}
	}
	fd, err := root.open("/tmp", func(dirfd int, name string) error { return unix.Mkdirat(dirfd, name, 0o1777) })
	if err != nil {
		return err
	}
	return unix.Close(fd)
}

func from(s string) string {
	if s == "" {
		return ""
	}
	return s + ": "
}

// bind mounts b.Source at b.Target in root, read-only where asked.
func bind(root *rootDir, b Bind) error {
	if err := CheckPath(b.Target); err != nil {
		return err
	}
	// The source is the host's (a CDI hostPath): its symlinks are followed
	// on the host, as a runtime follows them. It is held open so that what
	// was looked at is what is bound.
	src, err := unix.Open(b.Source, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(src) }()
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return err
	}
	mk := makeFile
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		mk = makeDir
	}
	target, err := root.open(b.Target, mk)
	if err != nil {
		return err
	}
	err = unix.Mount(fdPath(src), fdPath(target), "", unix.MS_BIND|unix.MS_REC, "")
	_ = unix.Close(target) // read only
	if err != nil || !b.ReadOnly {
		return err
	}
	// The descriptor above is of the mount point; the remount needs the
	// new mount's root, which the target resolves to now.
	target, err = root.open(b.Target, nil)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(target) }()
	if err := unix.Mount("", fdPath(target), "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("read-only: %w", err)
	}
	return nil
}

// Targets are the paths the sandbox shows, sorted, for reports.
func (c *Config) Targets() []string {
	var out []string
	for _, m := range c.Mounts {
		out = append(out, m.Target)
	}
	for _, f := range c.Files {
		out = append(out, f.Path)
	}
	for _, l := range c.Links {
		out = append(out, l.Path)
	}
	for _, b := range c.Binds {
		out = append(out, b.Target)
	}
	for _, n := range c.Nodes {
		out = append(out, n.Path)
	}
	slices.Sort(out)
	return out
}
