// Package fifotest plants FIFOs where a program expects files, and bounds
// a call that may block reading one: a FIFO with no writer blocks its
// reader for ever, so a test of a program that must not read one cannot
// simply wait for it. It is for tests only; no binary links it
// (hack/deps-check.sh).
package fifotest

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// Make makes a FIFO at path, creating its directory.
func Make(tb testing.TB, path string) {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		tb.Fatal(err)
	}
}

// Returns runs fn and reports whether it returned within limit, a bound
// far beyond what fn takes when it reads no FIFO. When it has not
// returned, Returns lets every reader blocked on one of the FIFOs go
// (each is opened for writing and closed, over and over, so that a reader
// reads an empty file), and waits for fn to return before it returns,
// so that nothing of the test outlives it.
func Returns(tb testing.TB, limit time.Duration, fn func(), fifos ...string) bool {
	tb.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
		return true
	case <-time.After(limit):
	}
	deadline := time.After(2 * time.Minute)
	for {
		for _, p := range fifos {
			// Non-blocking: it fails at once while no reader has it open.
			if f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
				_ = f.Close()
			}
		}
		select {
		case <-done:
			return false
		case <-deadline:
			tb.Fatalf("blocked for %s, and still blocked 2m after its FIFOs %v were let go", limit, fifos)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Release lets a reader blocked on the FIFO at path go, should one be: it
// opens the FIFO for writing and closes it, trying for a while, as the
// reader may not have opened it yet.
func Release(tb testing.TB, path string) {
	tb.Helper()
	for range 100 {
		if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			_ = f.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
