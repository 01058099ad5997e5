package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

type testFlags struct {
	name  string
	count int
	mode  *OneOf
}

func newTestFlags(stderr *bytes.Buffer) (*FlagSet, *testFlags) {
	f := NewFlagSet("kyb-test", stderr)
	v := &testFlags{mode: NewOneOf("auto", "auto", "on", "off")}
	f.StringVar(&v.name, "node-name", "NODE_NAME", "", "the node")
	f.IntVar(&v.count, "count", "", 1, "how many (no variable)")
	f.Var(v.mode, "mode", "KYB_MODE", "auto, on or off")
	return f, v
}

func TestParseTakesFlagsThenEnvironment(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		wantName string
		wantMode string
		wantErr  string
	}{
		{name: "defaults", wantMode: "auto"},
		{name: "environment fills what no flag gives", env: map[string]string{"NODE_NAME": "n1", "KYB_MODE": "on"}, wantName: "n1", wantMode: "on"},
		{name: "a flag wins over its variable", args: []string{"--node-name", "n2"}, env: map[string]string{"NODE_NAME": "n1"}, wantName: "n2", wantMode: "auto"},
		{name: "a bad variable is named", env: map[string]string{"KYB_MODE": "sideways"}, wantErr: `environment variable KYB_MODE="sideways": must be one of auto, on, off`},
		{name: "a bad flag value is named", args: []string{"--mode", "up"}, wantErr: `invalid value "up" for flag -mode: must be one of auto, on, off`},
		{name: "a positional argument is refused", args: []string{"serve"}, wantErr: `unexpected argument "serve"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			f, v := newTestFlags(&stderr)
			err := f.Parse(tt.args, func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("Parse: %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v.name != tt.wantName || v.mode.Value() != tt.wantMode {
				t.Errorf("node-name %q mode %q, want %q %q", v.name, v.mode.Value(), tt.wantName, tt.wantMode)
			}
		})
	}
}

func TestUsageNamesTheVariables(t *testing.T) {
	var stderr bytes.Buffer
	f, _ := newTestFlags(&stderr)
	f.Usage("Usage: kyb-test\n")
	out := stderr.String()
	for _, want := range []string{"Usage: kyb-test", "the node (env NODE_NAME)", "auto, on or off (env KYB_MODE)"} {
		if !strings.Contains(out, want) {
			t.Errorf("usage lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "how many (no variable) (env") {
		t.Errorf("a flag without a variable names one:\n%s", out)
	}
}

func TestRunDaemonExitCodes(t *testing.T) {
	failed := errors.New("the GPU is on fire")
	tests := []struct {
		name       string
		args       []string
		check, run error
		wantCode   int
		wantStderr string
	}{
		{name: "runs", wantCode: ExitOK},
		{name: "help", args: []string{"-h"}, wantCode: ExitOK, wantStderr: "Usage: kyb-test"},
		{name: "klog's flags are there", args: []string{"-v", "4"}, wantCode: ExitOK},
		{name: "bad flag", args: []string{"--nope"}, wantCode: ExitUsage, wantStderr: "kyb-test: flag provided but not defined: -nope\nRun 'kyb-test -h' for the flags.\n"},
		{name: "bad value", check: errors.New("--count 0 is not a count"), wantCode: ExitUsage, wantStderr: "kyb-test: --count 0 is not a count\n"},
		{name: "fails while running", run: failed, wantCode: ExitFailed, wantStderr: "kyb-test: the GPU is on fire\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			f, _ := newTestFlags(&stderr)
			ran := false
			code := RunDaemon(f, "Usage: kyb-test\n", tt.args, func(string) string { return "" },
				func() error { return tt.check },
				func() error { ran = true; return tt.run })
			if code != tt.wantCode {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.wantCode, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr %q, want it to contain %q", stderr.String(), tt.wantStderr)
			}
			if wantRan := tt.wantCode == ExitOK && tt.name != "help" || tt.run != nil; ran != wantRan {
				t.Errorf("run called: %v, want %v", ran, wantRan)
			}
		})
	}
}
