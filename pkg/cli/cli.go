// Package cli is what the driver's commands share on their command line:
// flags that an environment variable may set as well (a DaemonSet sets
// most of them from its env), flags restricted to a set of values, and the
// life of a command from its arguments to its exit code, so that each
// command is a function that tests call like any other.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"
)

// Exit codes of a command.
const (
	// ExitOK: done, or the help was asked for.
	ExitOK = 0
	// ExitFailed: it failed while running.
	ExitFailed = 1
	// ExitUsage: bad flags, environment or values.
	ExitUsage = 2
)

// FlagSet is a flag set whose flags may also be set from the environment.
// A flag given on the command line wins over its variable.
type FlagSet struct {
	*flag.FlagSet
	name   string
	env    map[string]string // flag name -> variable
	stderr io.Writer
}

// NewFlagSet returns an empty flag set for the command name.
func NewFlagSet(name string, stderr io.Writer) *FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The flag package prints the whole usage on every mistake; the
	// commands print one line saying what is wrong instead, and the usage
	// only when asked for (-h).
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &FlagSet{FlagSet: fs, name: name, env: map[string]string{}, stderr: stderr}
}

// StringVar defines a string flag that environment variable env may set;
// env "" means none.
func (f *FlagSet) StringVar(p *string, name, env, value, usage string) {
	f.FlagSet.StringVar(p, name, value, usage)
	f.bind(name, env)
}

// IntVar defines an int flag that environment variable env may set.
func (f *FlagSet) IntVar(p *int, name, env string, value int, usage string) {
	f.FlagSet.IntVar(p, name, value, usage)
	f.bind(name, env)
}

// BoolVar defines a bool flag that environment variable env may set
// ("true", "false", "1", "0").
func (f *FlagSet) BoolVar(p *bool, name, env string, value bool, usage string) {
	f.FlagSet.BoolVar(p, name, value, usage)
	f.bind(name, env)
}

// DurationVar defines a duration flag ("10s", "1m") that environment
// variable env may set.
func (f *FlagSet) DurationVar(p *time.Duration, name, env string, value time.Duration, usage string) {
	f.FlagSet.DurationVar(p, name, value, usage)
	f.bind(name, env)
}

// Float64Var defines a float64 flag that environment variable env may set.
func (f *FlagSet) Float64Var(p *float64, name, env string, value float64, usage string) {
	f.FlagSet.Float64Var(p, name, value, usage)
	f.bind(name, env)
}

// Var defines a flag of any value that environment variable env may set.
func (f *FlagSet) Var(value flag.Value, name, env, usage string) {
	f.FlagSet.Var(value, name, usage)
	f.bind(name, env)
}

// bind marks a flag as settable from variable env and says so in its usage.
func (f *FlagSet) bind(name, env string) {
	if env == "" {
		return
	}
	f.env[name] = env
	if fl := f.Lookup(name); fl != nil {
		fl.Usage += " (env " + env + ")"
	}
}

// Usage prints the command's help: its text, then every flag.
func (f *FlagSet) Usage(text string) {
	_, _ = fmt.Fprint(f.stderr, text)
	f.SetOutput(f.stderr)
	f.PrintDefaults()
	f.SetOutput(io.Discard)
}

// Parse parses args, then fills the flags not given from the environment.
// Positional arguments are refused: no command takes any.
func (f *FlagSet) Parse(args []string, getenv func(string) string) error {
	if err := f.FlagSet.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	// In flag order, so that of two bad variables the same one is named
	// every time.
	for _, name := range slices.Sorted(maps.Keys(f.env)) {
		if given[name] {
			continue
		}
		env := f.env[name]
		if v := getenv(env); v != "" {
			if err := f.Set(name, v); err != nil {
				return fmt.Errorf("environment variable %s=%q: %w", env, v, err)
			}
		}
	}
	if f.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", f.Arg(0))
	}
	return nil
}

// ParseOrExit parses like Parse and handles what ends the command there:
// the help (printed from usage) and bad flags (one line saying what is
// wrong). ok is false when the command should exit with code.
func (f *FlagSet) ParseOrExit(args []string, getenv func(string) string, usage string) (code int, ok bool) {
	err := f.Parse(args, getenv)
	switch {
	case err == nil:
		return ExitOK, true
	case errors.Is(err, flag.ErrHelp):
		f.Usage(usage)
		return ExitOK, false
	default:
		_, _ = fmt.Fprintf(f.stderr, "%s: %v\nRun '%s -h' for the flags.\n", f.name, err, f.name)
		return ExitUsage, false
	}
}

// Fail prints why the command failed and returns code.
func (f *FlagSet) Fail(code int, err error) int {
	_, _ = fmt.Fprintf(f.stderr, "%s: %v\n", f.name, err)
	return code
}

// AddKlogFlags adds klog's flags (-v, -vmodule and the rest) to f.
func (f *FlagSet) AddKlogFlags() {
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(fl *flag.Flag) { f.FlagSet.Var(fl.Value, fl.Name, fl.Usage) })
}

// RunDaemon is the life of a daemon command: parse the flags (klog's
// included) and the environment, print the usage on -h, check the values,
// run. It returns the exit code: ExitOK when run returned nil, ExitFailed
// when it failed, ExitUsage for bad flags or values.
func RunDaemon(f *FlagSet, usage string, args []string, getenv func(string) string, check, run func() error) int {
	f.AddKlogFlags()
	if code, ok := f.ParseOrExit(args, getenv, usage); !ok {
		return code
	}
	if err := check(); err != nil {
		return f.Fail(ExitUsage, err)
	}
	if err := run(); err != nil {
		return f.Fail(ExitFailed, err)
	}
	return ExitOK
}

// OneOf is a string flag restricted to a set of values.
type OneOf struct {
	value   string
	allowed []string
}

// NewOneOf returns a OneOf set to value, which must be one of allowed.
func NewOneOf(value string, allowed ...string) *OneOf {
	return &OneOf{value: value, allowed: allowed}
}

// String is the value.
func (o *OneOf) String() string {
	if o == nil {
		return ""
	}
	return o.value
}

// Set sets the value, refusing one that is not allowed.
func (o *OneOf) Set(v string) error {
	if !slices.Contains(o.allowed, v) {
		return fmt.Errorf("must be one of %s", strings.Join(o.allowed, ", "))
	}
	o.value = v
	return nil
}

// Value is the value.
func (o *OneOf) Value() string { return o.value }
