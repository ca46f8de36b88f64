package controlplane

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// DialFunc opens a TCP connection to addr (host:port) from wherever the
// cluster's nodes are reachable.
type DialFunc func(ctx context.Context, addr string) (net.Conn, error)

// egressConfig is kube-apiserver's EgressSelectorConfiguration sending
// its "cluster" traffic (to kubelets for logs, exec and port-forward, and
// to pods and Services through its proxy subresources) through an HTTP
// CONNECT proxy on the Unix socket sock, as konnectivity's proxy server
// would; its control-plane and etcd traffic stays direct.
func egressConfig(sock string) string {
	return fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
- name: controlplane
  connection:
    proxyProtocol: Direct
- name: etcd
  connection:
    proxyProtocol: Direct
`, sock)
}

// egressProxy serves HTTP CONNECT on a Unix socket, dialing each target
// with dial: kube-apiserver, on the host, reaches the nodes' kubelets
// through it when they sit in a network namespace the host has no route
// into.
type egressProxy struct {
	ln   net.Listener
	dir  string
	dial DialFunc
	wg   sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{} // both ends of every relay in flight
}

// startEgressProxy listens on a socket in a new directory of its own
// under the system's temporary directory (a Unix socket's path must fit
// in 108 bytes, which a test's directory may not) and serves until close.
func startEgressProxy(dial DialFunc) (*egressProxy, string, error) {
	dir, err := os.MkdirTemp("", "vipcast-egress-")
	if err != nil {
		return nil, "", fmt.Errorf("egress proxy: %w", err)
	}
	sock := filepath.Join(dir, "egress.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, "", fmt.Errorf("egress proxy: %w", err)
	}
	p := &egressProxy{ln: ln, dir: dir, dial: dial, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(c)
			}()
		}
	}()
	return p, sock, nil
}

// serve answers one CONNECT request on c and relays bytes both ways
// until either side closes.
func (p *egressProxy) serve(c net.Conn) {
	if !p.track(c) {
		return
	}
	defer p.untrack(c)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	if req.Method != http.MethodConnect {
		_, _ = io.WriteString(c, "HTTP/1.1 405 Method Not Allowed\r\n\r\n")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	up, err := p.dial(ctx, req.Host)
	cancel()
	if err != nil {
		_, _ = fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n%v", err)
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	_ = c.SetReadDeadline(time.Time{})
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// The API server speaks TLS to kubelets, which never half-closes:
	// the relay ends when either side ends.
	done := make(chan struct{}, 2)
	go func() {
		// What the API server sent after its request, then the rest.
		_, _ = br.WriteTo(up)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(c, up)
		done <- struct{}{}
	}()
	<-done
	_ = c.Close()
	_ = up.Close()
	<-done
}

// track records c as in flight, or closes it and says false once the
// proxy is closing.
func (p *egressProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

// untrack closes c and forgets it.
func (p *egressProxy) untrack(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// close stops accepting, ends every relay in flight (an exec stream can
// last as long as its caller keeps it) and removes the socket.
func (p *egressProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
	_ = os.RemoveAll(p.dir)
}
