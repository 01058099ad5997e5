package sandbox

// A container is more than its image and its CDI edits: runc gives every
// container a procfs of its own PID namespace, a read-only sysfs, a /dev
// of its own with the standard device nodes, ptys and shared memory. A
// driver asks the kernel for them: the real libcuda.so.1's cuInit fails
// with CUDA_ERROR_OPERATING_SYSTEM (304) without /proc, /sys or /dev/null.
// Container writes down what containerd's default spec asks runc for, so
// that the sandbox's program meets the kernel a container's would.
//
// What it leaves out: cgroups (and /sys/fs/cgroup), /dev/mqueue and the
// network, IPC and UTS namespaces, which a CUDA program does not need to
// start; the masked and read-only paths of /proc; seccomp, capabilities
// and a user other than root.

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount is a file system made fresh in the sandbox, as a runtime mounts a
// container's /proc, /sys and /dev.
type Mount struct {
	// Type is the file system's: proc, sysfs, tmpfs or devpts.
	Type   string `json:"type"`
	Target string `json:"target"`
	// Options are mount(8)'s: flags (ro, nosuid, nodev, noexec,
	// strictatime) and the file system's own (mode=755, size=65536k).
	Options []string `json:"options,omitempty"`
}

// Link is a symbolic link in the sandbox, such as /dev/ptmx.
type Link struct {
	Path   string `json:"path"`
	Target string `json:"target"`
}

// File is a small file of the image, such as /etc/passwd, written in the
// sandbox rather than bound from the host.
type File struct {
	Path    string `json:"path"`
	Content string `json:"content"`
}

// mountTypes are the file systems a Mount may make: a container's own.
var mountTypes = []string{"proc", "sysfs", "tmpfs", "devpts"}

// mountFlags are the options that are mount flags; the others are the
// file system's data.
var mountFlags = map[string]uintptr{
	"ro":          unix.MS_RDONLY,
	"nosuid":      unix.MS_NOSUID,
	"nodev":       unix.MS_NODEV,
	"noexec":      unix.MS_NOEXEC,
	"strictatime": unix.MS_STRICTATIME,
}

// ShmBytes is the size of /dev/shm, as runtimes make it by default.
const ShmBytes = 64 << 20

// defaultFrom names the container's own file systems, nodes, links and
// files in errors.
const defaultFrom = "a container's defaults"

// Container is the sandbox of a plain container that runs program, as
// runc builds one from containerd's default spec: /proc of its own PID
// namespace, /sys read-only, /dev a tmpfs with null, zero, full, random,
// urandom and tty, a devpts of its own at /dev/pts, a tmpfs /dev/shm, and
// the image (Image) with the /etc/passwd and /etc/group of a base image.
// The caller adds a CDI spec's binds, nodes and environment.
func Container(program string) (*Config, error) {
	image, err := Image(program)
	if err != nil {
		return nil, err
	}
	cfg := &Config{
		Mounts: []Mount{
			{Type: "proc", Target: "/proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Type: "tmpfs", Target: "/dev", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Type: "devpts", Target: "/dev/pts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Type: "tmpfs", Target: "/dev/shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", fmt.Sprintf("size=%dk", ShmBytes>>10)}},
			{Type: "sysfs", Target: "/sys", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Links: []Link{
			{Path: "/dev/fd", Target: "/proc/self/fd"},
			{Path: "/dev/stdin", Target: "/proc/self/fd/0"},
			{Path: "/dev/stdout", Target: "/proc/self/fd/1"},
			{Path: "/dev/stderr", Target: "/proc/self/fd/2"},
			{Path: "/dev/ptmx", Target: "pts/ptmx"},
		},
		Files: []File{
			{Path: "/etc/passwd", Content: "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"},
			{Path: "/etc/group", Content: "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n"},
		},
		Binds: image,
	}
	for _, n := range []struct {
		name         string
		major, minor int64
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}} {
		cfg.Nodes = append(cfg.Nodes, Node{Path: "/dev/" + n.name, Major: n.major, Minor: n.minor, From: defaultFrom})
	}
	return cfg, nil
}

// mount makes m's file system at its target, made on the sandbox's own
// file system where missing. A tmpfs becomes the sandbox's own too: the
// nodes and mount points of /dev are made on /dev's.
func mount(root *rootDir, m Mount) error {
	if !slices.Contains(mountTypes, m.Type) {
		return fmt.Errorf("%w: file system type %q is none of %v", ErrRefused, m.Type, mountTypes)
	}
	var flags uintptr
	var data []string
	for _, o := range m.Options {
		if f, ok := mountFlags[o]; ok {
			flags |= f
		} else {
			data = append(data, o)
		}
	}
	target, err := root.open(m.Target, makeDir)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(target) }()
	if err := isDir(target, m.Target); err != nil {
		return err
	}
	if err := unix.Mount(m.Type, fdPath(target), m.Type, flags, strings.Join(data, ",")); err != nil {
		return err
	}
	if m.Type == "tmpfs" {
		return root.own(m.Target)
	}
	return nil
}
