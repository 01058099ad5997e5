// Package cdisandbox runs a program as a container holding some CDI
// devices would run it, with no container runtime: new mount and PID
// namespaces whose root holds what runc gives every container (its own
// /proc, a read-only /sys, /dev with the standard nodes, /dev/pts,
// /dev/shm), a glibc base image with the program (sandbox.Container),
// and what the devices' CDI edits give (device nodes, bind mounts,
// environment). The doctor runs the CUDA probe in it, to show what a
// container holding a seat sees.
//
// It is faithful to what runc does with a CDI spec in what the probe can
// observe: the same device nodes (bound from the host, or made from their
// numbers where the host has none), the same files at the same paths, the
// same environment. It does not run the spec's hooks (our specs have none;
// NVIDIA's have ldconfig and symlink hooks, which the report names), nor
// set up cgroups, namespaces other than mounts and PIDs, or seccomp.
package cdisandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/sandbox"
)

// Options say what to run with which devices.
type Options struct {
	// Specs are CDI spec files; Devices are qualified device names
	// (kyb.ai/gpu=<name>) found in them.
	Specs   []string
	Devices []string
	// Program is the program to run, and BaseEnv its environment before
	// the devices' edits (an image's environment).
	Program string
	BaseEnv []string
	// HostPath maps a host path named in a spec to where this process sees
	// it (a driver root or /dev mounted elsewhere); nil: the same path.
	HostPath func(string) string
	// Unset are variables removed from the environment after the edits,
	// as a process in the container may remove them.
	Unset []string
}

// killGrace is how long Run waits for the program's processes to go once
// killed: a process stuck in the kernel (a wedged GPU's driver call) does
// not die of SIGKILL, and the caller must not wait on it for ever.
const killGrace = 5 * time.Second

// Run runs the program in a sandbox and returns its standard output. It
// needs root (CAP_SYS_ADMIN) for the mount and PID namespaces. The program
// runs in its own process group, killed whole when ctx is done (the error
// then wraps ctx's) and when the program exits, so that nothing it forked
// outlives it. A path of the specs the sandbox will not build is an error
// that wraps sandbox.ErrRefused.
func Run(ctx context.Context, opts Options) ([]byte, *sandbox.Config, error) {
	cfg, err := Plan(opts)
	if err != nil {
		return nil, nil, err
	}
	out, err := RunConfig(ctx, opts.Program, cfg)
	return out, cfg, err
}

// RunConfig runs program in the sandbox cfg describes (its Root is set
// here), as Run does.
func RunConfig(ctx context.Context, program string, cfg *sandbox.Config) ([]byte, error) {
	root, err := os.MkdirTemp("", "kyb-sandbox-")
	if err != nil {
		return nil, fmt.Errorf("sandbox root: %w", err)
	}
	defer func() { _ = os.RemoveAll(root) }() // the mounts went with the namespace
	cfg.Root = root
	cfgFile := filepath.Join(root, "..", filepath.Base(root)+".json")
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(cfgFile, data, 0o600); err != nil {
		return nil, fmt.Errorf("sandbox config: %w", err)
	}
	defer func() { _ = os.Remove(cfgFile) }()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(program, sandbox.EnterArg, cfgFile)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = []string{}
	// Its own process group, killed whole; and its own PID namespace, of
	// which it is the init: when it dies the kernel kills and reaps every
	// process left in it, a process that left the group included, before
	// its parent sees it exit. So no process of the program outlives Run.
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID, Setpgid: true}
	// A process that left the group may hold the output pipes open.
	cmd.WaitDelay = killGrace
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) {
			return nil, sandbox.ErrNoNamespace
		}
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	err = waitGroup(ctx, cmd)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return stdout.Bytes(), nil
	case ctx.Err() != nil:
		return stdout.Bytes(), fmt.Errorf("sandbox: %s did not finish: %w", program, err)
	case errors.As(err, &exit) && exit.ExitCode() == sandbox.ExitRefused:
		return stdout.Bytes(), refused(bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), fmt.Errorf("sandbox: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
}

// refused is the first stage's refusal of a path, in its words.
type refused string

func (r refused) Error() string { return string(r) }
func (r refused) Unwrap() error { return sandbox.ErrRefused }

// waitGroup waits for the program to exit or ctx to be done, kills the
// program's process group (the program too, when ctx is done) and reaps
// the program. It waits at most killGrace after the kill.
func waitGroup(ctx context.Context, cmd *exec.Cmd) error {
	pgid := cmd.Process.Pid
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		// WNOWAIT leaves the program a zombie until cmd.Wait reaps it: its
		// pid, which is the group's id, cannot be reused by another
		// process before the group is killed.
		var info unix.Siginfo
		for {
			if err := unix.Waitid(unix.P_PID, pgid, &info, unix.WEXITED|unix.WNOWAIT, nil); !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	var cause error
	select {
	case <-exited:
	case <-ctx.Done():
		cause = context.Cause(ctx)
	}
	_ = unix.Kill(-pgid, unix.SIGKILL) // ESRCH: the group is gone already
	reaped := make(chan error, 1)
	go func() { reaped <- cmd.Wait() }()
	timer := time.NewTimer(killGrace)
	defer timer.Stop()
	select {
	case err := <-reaped:
		if cause != nil {
			return fmt.Errorf("killed process group %d: %w", pgid, cause)
		}
		return err
	case <-timer.C:
		if cause == nil {
			cause = errors.New("it exited, but not all of its process group")
		}
		return fmt.Errorf("killed process group %d, which has not gone after %s (a process stuck in the kernel does not die): %w", pgid, killGrace, cause)
	}
}

// Plan is the sandbox Run builds: the program's container, and the
// devices' edits turned into binds, nodes and environment. It refuses,
// naming the spec entry, a container path that is not clean and
// absolute: a path the sandbox would not resolve inside its root as the
// spec writes it. Enter checks again where it builds, in the namespace.
func Plan(opts Options) (*sandbox.Config, error) {
	hostPath := opts.HostPath
	if hostPath == nil {
		hostPath = func(p string) string { return p }
	}
	cfg, err := sandbox.Container(opts.Program)
	if err != nil {
		return nil, err
	}
	ownNodes := len(cfg.Nodes)
	env := slices.Clone(opts.BaseEnv)
	edits, err := DeviceEdits(opts.Specs, opts.Devices)
	if err != nil {
		return nil, err
	}
	for _, e := range edits {
		env = mergeEnv(env, e.Env)
		for _, d := range e.DeviceNodes {
			if err := checkPaths(d.Path, d.HostPath); err != nil {
				return nil, fmt.Errorf("%s: device node %q: %w", e.From, d.Path, err)
			}
			src := d.HostPath
			if src == "" {
				src = d.Path
			}
			src = hostPath(src)
			if _, err := os.Stat(src); err == nil {
				cfg.Binds = append(cfg.Binds, sandbox.Bind{Source: src, Target: d.Path, From: e.From})
				continue
			}
			if d.Major == 0 && d.Minor == 0 {
				return nil, fmt.Errorf("%s: device node %s: %s does not exist and the spec gives no numbers", e.From, d.Path, src)
			}
			cfg.Nodes = append(cfg.Nodes, sandbox.Node{Path: d.Path, Major: d.Major, Minor: d.Minor, From: e.From})
		}
		for _, m := range e.Mounts {
			if err := checkPaths(m.ContainerPath, m.HostPath); err != nil {
				return nil, fmt.Errorf("%s: mount of %q at %q: %w", e.From, m.HostPath, m.ContainerPath, err)
			}
			if err := checkProcMount(m.ContainerPath, hostPath(m.HostPath)); err != nil {
				return nil, fmt.Errorf("%s: mount of %q at %q: %w", e.From, m.HostPath, m.ContainerPath, err)
			}
			cfg.Binds = append(cfg.Binds, sandbox.Bind{Source: hostPath(m.HostPath), Target: m.ContainerPath, ReadOnly: slices.Contains(m.Options, "ro"), From: e.From})
		}
		for _, h := range e.Hooks {
			cfg.Hooks = append(cfg.Hooks, h.HookName+": "+h.Path)
		}
	}
	if slices.ContainsFunc(cfg.Binds, func(b sandbox.Bind) bool { return b.Target == "/dev" }) {
		// A directory bound at /dev is the container's /dev, and runc
		// makes none of a container's own nodes in it.
		cfg.Nodes = cfg.Nodes[ownNodes:]
	}
	cfg.Env = slices.DeleteFunc(env, func(kv string) bool { k, _, _ := strings.Cut(kv, "="); return slices.Contains(opts.Unset, k) })
	return cfg, nil
}

// checkPaths checks a spec entry's container path, and its host path when
// it has one.
func checkPaths(target, source string) error {
	if err := sandbox.CheckPath(target); err != nil {
		return err
	}
	if target == sandbox.ProgramPath {
		return fmt.Errorf("%w: %s is where the sandbox has the program it runs", sandbox.ErrRefused, target)
	}
	if source != "" && !filepath.IsAbs(source) {
		return fmt.Errorf("%w: host path %q is not absolute", sandbox.ErrRefused, source)
	}
	return nil
}

// lxcfsProcFiles are the files inside /proc that runc lets a mount cover:
// those lxcfs emulates (libcontainer's checkProcMount).
var lxcfsProcFiles = []string{
	"/proc/cpuinfo", "/proc/diskstats", "/proc/meminfo", "/proc/stat", "/proc/swaps", "/proc/uptime",
	"/proc/loadavg", "/proc/slabinfo", "/proc/net/dev", "/proc/sys/kernel/ns_last_pid",
}

// checkProcMount refuses a mount runc refuses to start a container with:
// one inside /proc, where a bind could cover a sysctl or a process's
// files, but over lxcfs's files, and one at /proc itself whose source is
// no procfs. The sandbox would make either, and the probe would pass for
// a container that never starts. target is clean and absolute.
func checkProcMount(target, source string) error {
	rest, under := strings.CutPrefix(target, "/proc")
	switch {
	case !under || rest != "" && !strings.HasPrefix(rest, "/"):
		return nil
	case rest == "":
		var st unix.Statfs_t
		if err := unix.Statfs(source, &st); err == nil && st.Type == unix.PROC_SUPER_MAGIC {
			return nil
		}
		return fmt.Errorf("%w: %s is not a procfs, and runc mounts nothing else at /proc", sandbox.ErrRefused, source)
	case slices.Contains(lxcfsProcFiles, target):
		return nil
	}
	return fmt.Errorf("%w: %s is inside /proc, where runc mounts nothing but the files lxcfs emulates (%s)", sandbox.ErrRefused, target, strings.Join(lxcfsProcFiles, ", "))
}

// Edits are a device's or its spec's container edits, with where they
// come from for errors.
type Edits struct {
	cdispec.ContainerEdits
	From string
}

// DeviceEdits are the container edits of devices (qualified names) found
// in specs, in the order a runtime applies them: for each device, its
// spec's edits and then its own. Each spec is read as package cdi reads
// spec files: a regular file of bounded size, validated as the CDI
// library validates it.
func DeviceEdits(specs, devices []string) ([]Edits, error) {
	var out []Edits
	for _, id := range devices {
		e, err := deviceEdits(specs, id)
		if err != nil {
			return nil, err
		}
		out = append(out, e...)
	}
	return out, nil
}

func deviceEdits(specs []string, id string) ([]Edits, error) {
	for _, path := range specs {
		spec, err := cdi.ReadSpecFile(path)
		if err != nil {
			return nil, err
		}
		for _, d := range spec.Devices {
			if spec.Kind()+"="+d.Name == id {
				return []Edits{
					{spec.ContainerEdits, fmt.Sprintf("CDI spec %s (edits for every device)", path)},
					{d.ContainerEdits, fmt.Sprintf("CDI device %s in %s", id, path)},
				}, nil
			}
		}
	}
	return nil, fmt.Errorf("CDI device %s is in none of %v", id, specs)
}

// mergeEnv sets each KEY=value of add in env, replacing an earlier value
// of the same key, as runtimes apply CDI environment edits.
func mergeEnv(env, add []string) []string {
	for _, kv := range add {
		key, _, _ := strings.Cut(kv, "=")
		env = slices.DeleteFunc(env, func(x string) bool { k, _, _ := strings.Cut(x, "="); return k == key })
		env = append(env, kv)
	}
	return env
}
