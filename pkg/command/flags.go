// Package command is the command line of the driver's binaries: flags,
// their environment equivalents, and the subcommands, each a function of
// its arguments that returns an exit code, so the command line is tested
// like any other code. cmd/ holds only the main functions that call it.
package command

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"k8s.io/klog/v2"
)

// flags is a flag set whose flags may also be set from the environment.
// A flag given on the command line wins over its variable.
type flags struct {
	*flag.FlagSet
	env    map[string]string // flag name -> variable
	stderr io.Writer
}

func newFlags(name string, stderr io.Writer) *flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	// The flag package prints the whole usage on every mistake; the
	// commands print one line saying what is wrong instead, and the usage
	// only when asked for (-h).
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flags{FlagSet: fs, env: map[string]string{}, stderr: stderr}
}

// usage prints the command's help: its text, then every flag.
func (f *flags) usage(text string) {
	fmt.Fprint(f.stderr, text)
	f.SetOutput(f.stderr)
	f.PrintDefaults()
	f.SetOutput(io.Discard)
}

// bind marks a flag as settable from variable env and says so in its usage.
func (f *flags) bind(name, env string) {
	f.env[name] = env
	if fl := f.Lookup(name); fl != nil {
		fl.Usage += " (env " + env + ")"
	}
}

// parse parses args, then fills the flags not given from the environment.
func (f *flags) parse(args []string, getenv func(string) string) error {
	if err := f.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	names := make([]string, 0, len(f.env))
	for n := range f.env {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
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

// oneOf is a string flag restricted to a set of values.
type oneOf struct {
	value   string
	allowed []string
}

func (o *oneOf) String() string { return o.value }

func (o *oneOf) Set(v string) error {
	if !slices.Contains(o.allowed, v) {
		return fmt.Errorf("must be one of %s", strings.Join(o.allowed, ", "))
	}
	o.value = v
	return nil
}

// execute is the life of a daemon command: parse the flags (klog's
// included) and the environment, print the usage on -h, check the values,
// run. Exit codes: 0 done, 1 failed while running, 2 bad flags.
func execute(name, usage string, f *flags, args []string, getenv func(string) string, check, run func() error) int {
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(fl *flag.Flag) { f.Var(fl.Value, fl.Name, fl.Usage) })
	if err := f.parse(args, getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.usage(usage)
			return 0
		}
		fmt.Fprintf(f.stderr, "%s: %v\nRun '%s -h' for the flags.\n", name, err, name)
		return 2
	}
	if err := check(); err != nil {
		fmt.Fprintf(f.stderr, "%s: %v\n", name, err)
		return 2
	}
	if err := run(); err != nil {
		fmt.Fprintf(f.stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}
