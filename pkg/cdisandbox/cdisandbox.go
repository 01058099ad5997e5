// Package cdisandbox runs a program as a container holding some CDI
// devices would run it, with no container runtime: a new mount namespace
// whose root holds only the program and the C library it links (the
// "image"), and what the devices' CDI edits give (device nodes, bind
// mounts, environment). The doctor runs the CUDA probe in it, to show what
// a container holding a seat sees.
//
// It is faithful to what runc does with a CDI spec in what the probe can
// observe: the same device nodes (bound from the host, or made from their
// numbers where the host has none), the same files at the same paths, the
// same environment. It does not run the spec's hooks (our specs have none;
// NVIDIA's have ldconfig and symlink hooks, which the report names), nor
// set up cgroups, namespaces other than mounts, or seccomp.
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
	"syscall"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
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
}

// Run runs the program in a sandbox and returns its standard output. It
// needs root (CAP_SYS_ADMIN) for the mount namespace.
func Run(ctx context.Context, opts Options) ([]byte, *Config, error) {
	cfg, err := plan(opts)
	if err != nil {
		return nil, nil, err
	}
	root, err := os.MkdirTemp("", "kyb-sandbox-")
	if err != nil {
		return nil, nil, fmt.Errorf("sandbox root: %w", err)
	}
	defer func() { _ = os.RemoveAll(root) }() // the mounts went with the namespace
	cfg.Root = root
	cfgFile := filepath.Join(root, "..", filepath.Base(root)+".json")
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, nil, err
	}
	if err := os.WriteFile(cfgFile, data, 0o600); err != nil {
		return nil, nil, fmt.Errorf("sandbox config: %w", err)
	}
	defer func() { _ = os.Remove(cfgFile) }()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, opts.Program, EnterArg, cfgFile)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	if err := cmd.Run(); err != nil {
		if errors.Is(err, syscall.EPERM) {
			return nil, cfg, errNoNamespace
		}
		return stdout.Bytes(), cfg, fmt.Errorf("sandbox: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), cfg, nil
}

// EnterArg is the program's first argument that makes it Enter the
// sandbox described by the second.
const EnterArg = "--enter-sandbox"

// plan turns the devices' edits into binds, nodes and environment.
func plan(opts Options) (*Config, error) {
	hostPath := opts.HostPath
	if hostPath == nil {
		hostPath = func(p string) string { return p }
	}
	base, err := imageFiles(opts.Program)
	if err != nil {
		return nil, err
	}
	cfg := &Config{Binds: base}
	env := slices.Clone(opts.BaseEnv)
	var edits []cdispec.ContainerEdits
	for _, id := range opts.Devices {
		e, err := deviceEdits(opts.Specs, id)
		if err != nil {
			return nil, err
		}
		edits = append(edits, e...)
	}
	for _, e := range edits {
		env = mergeEnv(env, e.Env)
		for _, d := range e.DeviceNodes {
			src := d.HostPath
			if src == "" {
				src = d.Path
			}
			src = hostPath(src)
			if _, err := os.Stat(src); err == nil {
				cfg.Binds = append(cfg.Binds, Bind{Source: src, Target: d.Path})
				continue
			}
			if d.Major == 0 && d.Minor == 0 {
				return nil, fmt.Errorf("device node %s: %s does not exist and the spec gives no numbers", d.Path, src)
			}
			cfg.Nodes = append(cfg.Nodes, Node{Path: d.Path, Major: d.Major, Minor: d.Minor})
		}
		for _, m := range e.Mounts {
			cfg.Binds = append(cfg.Binds, Bind{Source: hostPath(m.HostPath), Target: m.ContainerPath, ReadOnly: slices.Contains(m.Options, "ro")})
		}
		for _, h := range e.Hooks {
			cfg.Hooks = append(cfg.Hooks, h.HookName+": "+h.Path)
		}
	}
	cfg.Env = env
	return cfg, nil
}

// deviceEdits finds a device in the specs and returns its spec's edits and
// its own, in the order a runtime applies them.
func deviceEdits(specs []string, id string) ([]cdispec.ContainerEdits, error) {
	for _, path := range specs {
		spec, err := cdiapi.ReadSpec(path, 0)
		if err != nil {
			return nil, fmt.Errorf("read CDI spec %s: %w", path, err)
		}
		kind := spec.GetVendor() + "/" + spec.GetClass()
		for _, d := range spec.Devices {
			if kind+"="+d.Name == id {
				return []cdispec.ContainerEdits{spec.ContainerEdits, d.ContainerEdits}, nil
			}
		}
	}
	return nil, fmt.Errorf("CDI device %s is in none of %v", id, specs)
}

// mergeEnv sets each KEY=value of add in env, replacing an earlier value
// of the same key, as runtimes apply CDI environment edits.
func mergeEnv(env, add []string) []string {
	for _, kv := range add {
		key, _, _ := cutEnv(kv)
		env = slices.DeleteFunc(env, func(x string) bool { k, _, _ := cutEnv(x); return k == key })
		env = append(env, kv)
	}
	return env
}

func cutEnv(kv string) (string, string, bool) {
	for i := range len(kv) {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return kv, "", false
}

// errNoNamespace explains why the sandbox cannot be built.
var errNoNamespace = errors.New("the sandbox needs a mount namespace: run as root (CAP_SYS_ADMIN)")
