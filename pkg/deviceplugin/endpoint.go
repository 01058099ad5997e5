package deviceplugin

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

// maxSocketPath is the longest path a unix socket may have on Linux
// (sun_path is 108 bytes, NUL included).
const maxSocketPath = 107

// SocketName is the file name of a resource's socket in the device-plugin
// directory: kyb.ai/gpu-1x-seat -> kyb-gpu-1x-seat.sock.
func SocketName(resource string) string {
	return "kyb-" + v1alpha1.ResourceBaseName(resource) + ".sock"
}

// endpoint is one resource's socket and the gRPC server on it. A server
// cannot serve again once stopped, so every (re-)serve makes a new one;
// the resource behind it, with its generation counters, stays.
//
// The registration loop owns the endpoint; nothing else touches it while
// the loop runs.
type endpoint struct {
	res  *resource
	path string

	srv  *grpc.Server
	file os.FileInfo   // the socket file this server listens on
	done chan struct{} // closed when Serve returns

	// registered says the kubelet behind the current kubelet.sock knows
	// this endpoint, since registeredAt.
	registered   bool
	registeredAt time.Time
}

func newEndpoint(res *resource, dir string) (*endpoint, error) {
	path := filepath.Join(dir, SocketName(res.name))
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("socket %s of %s is %d bytes long; unix sockets allow %d: choose a shorter --device-plugin-directory-path", path, res.name, len(path), maxSocketPath)
	}
	return &endpoint{res: res, path: path}, nil
}

// serve listens on the socket, replacing a file left there, and serves.
func (e *endpoint) serve(logger klog.Logger) error {
	if err := os.Remove(e.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove old socket %s: %w", e.path, err)
	}
	lis, err := net.Listen("unix", e.path)
	if err != nil {
		return fmt.Errorf("listen on %s for %s: %w", e.path, e.res.name, err)
	}
	// Closing a listener would unlink its path, which by then may be a
	// newer socket (ours, served again after the kubelet removed the old
	// one); stop removes the file itself, only if it is still this one.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	file, err := os.Stat(e.path)
	if err != nil {
		lis.Close()
		return fmt.Errorf("stat socket %s: %w", e.path, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, e.res)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(lis); err != nil {
			logger.Error(err, "Socket stopped serving; it is served again at the next check", "socket", e.path, "resource", e.res.name)
		}
	}()
	e.srv, e.file, e.done, e.registered = srv, file, done, false
	return nil
}

// serving reports whether the server runs.
func (e *endpoint) serving() bool {
	if e.srv == nil {
		return false
	}
	select {
	case <-e.done:
		return false
	default:
		return true
	}
}

// intact reports whether the server runs and its socket file is still in
// place. The kubelet removes every socket in the directory when it starts.
func (e *endpoint) intact() bool {
	if !e.serving() {
		return false
	}
	st, err := os.Stat(e.path)
	return err == nil && os.SameFile(st, e.file)
}

// stop stops the server, ending its streams, and removes its socket.
func (e *endpoint) stop() {
	if e.srv == nil {
		return
	}
	e.srv.Stop()
	<-e.done
	if st, err := os.Stat(e.path); err == nil && os.SameFile(st, e.file) {
		os.Remove(e.path)
	}
	e.srv, e.file, e.done, e.registered = nil, nil, nil, false
}
