package doctor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// defaultCDISpecDirs are where containerd and CRI-O read CDI specs unless
// configured otherwise.
var defaultCDISpecDirs = []string{"/etc/cdi", "/var/run/cdi"}

// runtimeFinding is what one runtime's configuration says about CDI.
type runtimeFinding struct {
	status  Status
	summary string
	details []string
	fix     string
}

// runtimeConfigs are the container runtimes' configuration files, as the
// host sees them (read under hostRoot), and the plugin's CDI root, which
// the runtime must read specs from.
type runtimeConfigs struct {
	hostRoot, containerdConfig, crioConfig, cdiRoot string
}

// checkRuntime reads the node's containerd or CRI-O configuration and says
// whether the runtime injects CDI devices, and reads them from the
// plugin's CDI root. Without CDI the kubelet's device IDs reach the
// runtime and are dropped: pods start without their GPUs.
func (e *examination) checkRuntime() {
	e.add(runtimeConfigs{hostRoot: e.opts.HostRoot, containerdConfig: e.opts.ContainerdConfig, crioConfig: e.opts.CRIOConfig, cdiRoot: e.opts.CDIRoot}.check())
}

// check is the runtime-cdi check.
func (rc runtimeConfigs) check() Check {
	var found []runtimeFinding
	for _, read := range []func() (runtimeFinding, bool){rc.containerd, rc.crio} {
		if f, ok := read(); ok {
			found = append(found, f)
		}
	}
	c := Check{Name: "runtime-cdi", Status: OK}
	if len(found) == 0 {
		c.Status = Warn
		c.Summary = fmt.Sprintf("no containerd (%s) or CRI-O (%s) configuration found under %s", rc.containerdConfig, rc.crioConfig, rc.hostRoot)
		c.Fix = "check by hand that the runtime enables CDI (containerd 2.x does by default; 1.7 needs enable_cdi = true; CRI-O always does) and reads " + rc.cdiRoot + "; or mount /etc/containerd or /etc/crio into the doctor"
		return c
	}
	var summaries []string
	for _, f := range found {
		summaries = append(summaries, f.summary)
		c.Details = append(c.Details, f.details...)
		if rank(f.status) > rank(c.Status) {
			c.Status, c.Fix = f.status, f.fix
		}
	}
	c.Summary = strings.Join(summaries, "; ")
	return c
}

func rank(s Status) int { return slices.Index([]Status{OK, Warn, Fail}, s) }

// hostPath is where a host path is, as the doctor sees it.
func (rc runtimeConfigs) hostPath(p string) string {
	return filepath.Join(rc.hostRoot, p)
}

// readTOMLFiles reads a configuration and the drop-ins after it, later
// values winning, as the runtimes merge them. found is false when the main
// file does not exist.
func readTOMLFiles(main string, dropIns []string) (values tomlValues, read []string, found bool, err error) {
	values = tomlValues{}
	for i, p := range append([]string{main}, dropIns...) {
		data, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) && i == 0 {
			return nil, nil, false, nil
		}
		if err != nil {
			return nil, read, true, fmt.Errorf("read %s: %w", p, err)
		}
		v, err := parseTOML(string(data))
		if err != nil {
			return nil, read, true, fmt.Errorf("%s: %w", p, err)
		}
		for k, x := range v {
			values[k] = x
		}
		read = append(read, p)
	}
	return values, read, true, nil
}

// containerd reads containerd's configuration and its imports. The CRI
// plugin's table and the default of enable_cdi depend on the file's
// version: 3 (containerd 2.x) enables CDI unless told not to; 2 is
// containerd 1.7's format, where CDI is off unless enabled (containerd 2.x
// reading a version 2 file enables it, but the file does not say which
// containerd reads it).
func (rc runtimeConfigs) containerd() (runtimeFinding, bool) {
	main := rc.hostPath(rc.containerdConfig)
	values, _, found, err := readTOMLFiles(main, nil)
	if !found {
		return runtimeFinding{}, false
	}
	if err != nil {
		return runtimeFinding{status: Warn, summary: "containerd: " + err.Error(), fix: "fix the configuration's syntax: containerd cannot read it either"}, true
	}
	imports, _ := values.strings("imports")
	var dropIns []string
	for _, pattern := range imports {
		if !filepath.IsAbs(pattern) {
			pattern = filepath.Join(filepath.Dir(rc.containerdConfig), pattern)
		}
		matches, _ := filepath.Glob(rc.hostPath(pattern))
		dropIns = append(dropIns, matches...)
	}
	values, read, _, err := readTOMLFiles(main, dropIns)
	if err != nil {
		return runtimeFinding{status: Warn, summary: "containerd: " + err.Error(), fix: "fix the configuration's syntax: containerd cannot read it either"}, true
	}
	version := values.int("version", 1)
	table := map[int]string{3: "plugins.io.containerd.cri.v1.runtime", 2: "plugins.io.containerd.grpc.v1.cri"}[version]
	if table == "" {
		table = "plugins.cri"
	}
	f := runtimeFinding{details: []string{"containerd configuration: " + strings.Join(read, ", ")}}
	enabled, set, err := values.bool(table + ".enable_cdi")
	switch {
	case err != nil:
		f.status, f.summary, f.fix = Fail, "containerd: "+err.Error(), "set enable_cdi = true"
		return f, true
	case set && !enabled:
		f.status, f.summary = Fail, fmt.Sprintf("containerd: CDI is off (enable_cdi = false in [%s])", table)
		f.fix = "set enable_cdi = true there and restart containerd: without it pods start without their GPUs"
		return f, true
	case !set && version < 3:
		f.status, f.summary = Warn, fmt.Sprintf("containerd: configuration version %d does not set enable_cdi: CDI is off in containerd 1.7, on in 2.x", version)
		f.fix = fmt.Sprintf("set enable_cdi = true in [%s] and restart containerd", table)
	case set:
		f.status, f.summary = OK, "containerd: CDI enabled"
	default:
		f.status, f.summary = OK, "containerd: CDI enabled (the default of configuration version 3)"
	}
	dirs, set := values.strings(table + ".cdi_spec_dirs")
	if !set {
		dirs = defaultCDISpecDirs
	}
	rc.checkSpecDirs(&f, "containerd", table, dirs)
	return f, true
}

// crio reads CRI-O's configuration and its drop-ins. CRI-O injects CDI
// devices always (since 1.23); only the directories are configurable.
func (rc runtimeConfigs) crio() (runtimeFinding, bool) {
	main := rc.hostPath(rc.crioConfig)
	dropIns, _ := filepath.Glob(main + ".d/*.conf")
	if _, err := os.Stat(main); errors.Is(err, os.ErrNotExist) && len(dropIns) > 0 {
		// CRI-O runs on drop-ins alone as well.
		main, dropIns = dropIns[0], dropIns[1:]
	}
	values, read, found, err := readTOMLFiles(main, dropIns)
	if !found {
		return runtimeFinding{}, false
	}
	if err != nil {
		return runtimeFinding{status: Warn, summary: "CRI-O: " + err.Error(), fix: "fix the configuration's syntax: CRI-O cannot read it either"}, true
	}
	f := runtimeFinding{status: OK, summary: "CRI-O: CDI enabled (always, since CRI-O 1.23)", details: []string{"CRI-O configuration: " + strings.Join(read, ", ")}}
	dirs, set := values.strings("crio.runtime.cdi_spec_dirs")
	if !set {
		dirs = defaultCDISpecDirs
	}
	rc.checkSpecDirs(&f, "CRI-O", "crio.runtime", dirs)
	return f, true
}

// checkSpecDirs fails a finding whose runtime does not read the plugin's
// CDI root.
func (rc runtimeConfigs) checkSpecDirs(f *runtimeFinding, runtime, table string, dirs []string) {
	f.details = append(f.details, fmt.Sprintf("%s reads CDI specs from %s", runtime, strings.Join(dirs, ", ")))
	if slices.ContainsFunc(dirs, func(d string) bool { return samePath(d, rc.cdiRoot) }) {
		return
	}
	f.status = Fail
	f.summary += fmt.Sprintf(", but not from %s", rc.cdiRoot)
	f.fix = fmt.Sprintf("add %s to cdi_spec_dirs in [%s], or set the plugin's --cdi-root to one of %s", rc.cdiRoot, table, strings.Join(dirs, ", "))
}

// samePath compares directories, /var/run being /run on every current
// distribution.
func samePath(a, b string) bool {
	norm := func(p string) string {
		p = filepath.Clean(p)
		if rest, ok := strings.CutPrefix(p, "/var/run"); ok && (rest == "" || rest[0] == '/') {
			p = "/run" + rest
		}
		return p
	}
	return norm(a) == norm(b)
}
