// Package sockettest makes unix sockets for tests: live ones that accept,
// stale ones that nobody listens on (what a crashed process leaves),
// gRPC servers on them, and directories short enough to hold them. It is for tests only; no binary
// links it (hack/deps-check.sh).
package sockettest

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
)

// Dir returns a new directory, removed when the test ends, whose paths
// stay well inside the 108 bytes a unix socket path may have (t.TempDir,
// named after the test, does not promise that).
func Dir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "kyb-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Listen serves a unix socket at path, creating its directory, that
// accepts and closes connections until the test ends.
func Listen(tb testing.TB, path string) {
	tb.Helper()
	lis := listen(tb, path)
	tb.Cleanup(func() { _ = lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err == nil {
				_ = c.Close()
			}
		}
	}()
}

// Stale leaves a socket file at path that nobody listens on.
func Stale(tb testing.TB, path string) {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		tb.Fatal(err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		tb.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := lis.Close(); err != nil {
		tb.Fatal(err)
	}
}

// TB is what ServeGRPC needs of a test: testing.TB, or a harness's.
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// ServeGRPC serves a gRPC server at a unix socket path, creating its
// directory, until the test ends; register adds its services.
func ServeGRPC(tb TB, path string, register func(*grpc.Server)) {
	tb.Helper()
	lis := listen(tb, path)
	srv := grpc.NewServer()
	register(srv)
	go func() { _ = srv.Serve(lis) }()
	tb.Cleanup(srv.Stop)
}

// listen listens on a unix socket at path, creating its directory.
func listen(tb TB, path string) net.Listener {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		tb.Fatal(err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		tb.Fatal(err)
	}
	return lis
}
