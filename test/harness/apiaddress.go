package harness

import (
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"

	certutil "k8s.io/client-go/util/cert"
)

// ServiceCIDR is the range of Service ClusterIPs; KubernetesServiceIP,
// its first address, is the ClusterIP of the "kubernetes" Service, the
// address pods find the API server at (KUBERNETES_SERVICE_HOST).
const (
	ServiceCIDR         = "10.0.0.0/16"
	KubernetesServiceIP = "10.0.0.1"
)

// apiServerCerts writes a serving certificate for the API server that
// covers the address pods reach it at, the "kubernetes" Service's
// ClusterIP and its names, and localhost, signed by a CA of its own, into
// dir. It returns the flags that make the API server serve it and the
// CA's file, which pods are to trust (kube-root-ca.crt). The upstream test
// server's own certificate covers 127.0.0.1 and 10.0.0.1 only, and comes
// from a fixture in the module cache for those addresses alone.
func apiServerCerts(dir, address string) (flags []string, ca string, err error) {
	ips := []net.IP{net.ParseIP(address), net.ParseIP(KubernetesServiceIP), net.ParseIP("127.0.0.1")}
	names := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}
	// The certificate, then the CA that signed it.
	bundle, key, err := certutil.GenerateSelfSignedCertKey(address, ips, names)
	if err != nil {
		return nil, "", fmt.Errorf("API server certificate for %s: %w", address, err)
	}
	leaf, rest := pem.Decode(bundle)
	root, _ := pem.Decode(rest)
	if leaf == nil || root == nil {
		return nil, "", errors.New("API server certificate: want a certificate and its CA")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", err
	}
	certFile, keyFile, ca := filepath.Join(dir, "apiserver.crt"), filepath.Join(dir, "apiserver.key"), filepath.Join(dir, "ca.crt")
	for f, data := range map[string][]byte{certFile: bundle, keyFile: key, ca: pem.EncodeToMemory(root)} {
		if err := os.WriteFile(f, data, 0o600); err != nil {
			return nil, "", err
		}
	}
	return []string{"--tls-cert-file=" + certFile, "--tls-private-key-file=" + keyFile}, ca, nil
}

// forwarder answers on the API server's advertised address what the API
// server answers on 127.0.0.1, byte for byte (TLS passes through). The
// upstream test server listens on 127.0.0.1 only, which a pod cannot
// reach; a cluster's API server listens where its nodes reach it.
type forwarder struct {
	l     net.Listener
	to    string
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// forward listens on address at the port of the loopback address to.
func forward(address, to string) (*forwarder, error) {
	_, port, err := net.SplitHostPort(to)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", net.JoinHostPort(address, port))
	if err != nil {
		return nil, fmt.Errorf("listen on the API server's address: %w", err)
	}
	f := &forwarder{l: l, to: to, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

func (f *forwarder) serve() {
	defer f.wg.Done()
	for {
		in, err := f.l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", f.to)
		if err != nil {
			_ = in.Close()
			continue
		}
		if !f.track(in, out) {
			return
		}
		f.wg.Add(2)
		go f.pipe(in, out)
		go f.pipe(out, in)
	}
}

// track records a connection pair, unless the forwarder is closed.
func (f *forwarder) track(conns ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		f.conns[c] = struct{}{}
	}
	return true
}

// pipe copies one direction; the end of either closes both.
func (f *forwarder) pipe(dst, src net.Conn) {
	defer f.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	f.mu.Lock()
	if f.conns != nil {
		delete(f.conns, dst)
		delete(f.conns, src)
	}
	f.mu.Unlock()
}

// close stops listening, ends every connection and waits for the copies.
func (f *forwarder) close() {
	_ = f.l.Close()
	f.mu.Lock()
	for c := range f.conns {
		_ = c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	f.wg.Wait()
}
