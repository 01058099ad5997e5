package harness

import (
	"fmt"
	"io"
	"os"
	"sync"
)

// ProcessTB lets a program that is not a test (the demo) start a cluster:
// it implements what the harness and the API server's test helper need of
// a testing.TB. Fatal errors panic with a FatalError, which the program
// recovers; Close runs the cleanups in reverse order.
type ProcessTB struct {
	// Out receives log lines.
	Out io.Writer

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	dir      string
}

// FatalError is what ProcessTB's Fatal panics with.
type FatalError struct{ Msg string }

func (e FatalError) Error() string { return e.Msg }

// NewProcessTB returns a TB logging to out.
func NewProcessTB(out io.Writer) *ProcessTB { return &ProcessTB{Out: out} }

// Close runs every cleanup, last registered first.
func (p *ProcessTB) Close() {
	for {
		p.mu.Lock()
		if len(p.cleanups) == 0 {
			p.mu.Unlock()
			break
		}
		f := p.cleanups[len(p.cleanups)-1]
		p.cleanups = p.cleanups[:len(p.cleanups)-1]
		p.mu.Unlock()
		f()
	}
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
}

func (p *ProcessTB) Attr(key, value string) {}
func (p *ProcessTB) Chdir(dir string) {
	if err := os.Chdir(dir); err != nil {
		p.Fatal(err)
	}
}
func (p *ProcessTB) Cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}
func (p *ProcessTB) Error(args ...any) { p.Log(args...); p.Fail() }
func (p *ProcessTB) Errorf(format string, args ...any) {
	p.Logf(format, args...)
	p.Fail()
}
func (p *ProcessTB) Fail() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failed = true
}
func (p *ProcessTB) FailNow() { p.Fail(); panic(FatalError{Msg: "failed"}) }
func (p *ProcessTB) Failed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}
func (p *ProcessTB) Fatal(args ...any) { p.Fail(); panic(FatalError{Msg: fmt.Sprint(args...)}) }
func (p *ProcessTB) Fatalf(format string, args ...any) {
	p.Fail()
	panic(FatalError{Msg: fmt.Sprintf(format, args...)})
}
func (p *ProcessTB) Helper()         {}
func (p *ProcessTB) Log(args ...any) { fmt.Fprintln(p.Out, args...) }
func (p *ProcessTB) Logf(f string, a ...any) {
	fmt.Fprintf(p.Out, f+"\n", a...)
}
func (p *ProcessTB) Name() string { return "kyb-demo" }
func (p *ProcessTB) Setenv(key, value string) {
	if err := os.Setenv(key, value); err != nil {
		p.Fatal(err)
	}
}
func (p *ProcessTB) Skip(args ...any)                 { p.Fatal(args...) }
func (p *ProcessTB) Skipf(format string, args ...any) { p.Fatalf(format, args...) }
func (p *ProcessTB) SkipNow()                         { p.Fatal("skipped") }
func (p *ProcessTB) Skipped() bool                    { return false }
func (p *ProcessTB) TempDir() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dir == "" {
		dir, err := os.MkdirTemp("", "kyb-demo-")
		if err != nil {
			panic(FatalError{Msg: err.Error()})
		}
		p.dir = dir
	}
	dir, err := os.MkdirTemp(p.dir, "t")
	if err != nil {
		panic(FatalError{Msg: err.Error()})
	}
	return dir
}
