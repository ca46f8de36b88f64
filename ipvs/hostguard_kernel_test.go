//go:build kernel

package ipvs

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/vipcast/vipcast/test/vm"
)

// TestKernelHostGuard: node A runs a BFD listener (UDP 3784 and 4784) and
// the metrics listener (TCP 7473) on its fabric address, with the host
// guard allowing the metrics port from the client's address 10.50.0.2.
// Before the speaker names BFD peers, the ToR's other address (10.51.0.2)
// reaches the BFD ports (no session, no rule); once SetBFDPeers names
// 10.50.0.2, that stranger's datagrams are dropped and counted while the
// peer's arrive; an empty list lets everyone in again, and a restarted
// Dataplane keeps the set and the rule. The metrics port answers the
// allowed address and the node itself and drops the stranger (counted).
func TestKernelHostGuard(t *testing.T) {
	if !vm.InVM() {
		kernelSuite.Run(t)
		return
	}
	f := newMoveFabric(t)
	nodeA := f.fabricAddr(0)
	peer, stranger := ip("10.50.0.2"), ip("10.51.0.2")
	metrics := netip.AddrPortFrom(nodeA, 7473)
	opts := Options{LinkName: "vip0", HostGuard: HostGuard{Metrics: metrics, MetricsSources: []netip.Prefix{netip.PrefixFrom(peer, 32)}}}
	var d *Dataplane
	must(t, inNS(t, f.nodes[0], func() (err error) {
		d, err = New(opts)
		return err
	}))
	t.Cleanup(func() { d.Close() })

	// The listeners, in node A.
	var bfd [2]<-chan string
	for i, port := range []int{bfdSingleHopPort, bfdMultihopPort} {
		bfd[i] = nsUDP(t, f.nodes[0], netip.AddrPortFrom(nodeA, uint16(port))) //nolint:gosec // BFD's ports
	}
	serve(t, f.nodes[0], metrics.Addr().String(), int(metrics.Port()), "metrics")

	reaches := func(from netip.Addr, port int, recv <-chan string) bool {
		return sendUDPFrom(t, f.client, from, netip.AddrPortFrom(nodeA, uint16(port)), recv) //nolint:gosec // BFD's ports
	}
	if !reaches(stranger, bfdSingleHopPort, bfd[0]) {
		t.Fatalf("before any BFD peer, %s did not reach node A's BFD port: the test cannot tell the guard's effect", stranger)
	}
	must(t, d.SetBFDPeers([]netip.Addr{peer}))
	for i, port := range []int{bfdSingleHopPort, bfdMultihopPort} {
		if reaches(stranger, port, bfd[i]) {
			t.Errorf("with BFD peer %s only, %s reached node A's UDP port %d", peer, stranger, port)
		}
		if !reaches(peer, port, bfd[i]) {
			t.Errorf("BFD peer %s did not reach node A's UDP port %d", peer, port)
		}
	}
	// Metrics: the allowed address and the node itself, not the stranger.
	dial := func(ns netns.NsHandle, from netip.Addr) error {
		var err error
		must(t, inNS(t, ns, func() error {
			dl := net.Dialer{Timeout: time.Second}
			if from.IsValid() {
				dl.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var c net.Conn
			if c, err = dl.DialContext(ctx, "tcp4", metrics.String()); err == nil {
				c.Close()
			}
			return nil
		}))
		return err
	}
	if err := dial(f.client, peer); err != nil {
		t.Errorf("the allowed source %s could not reach the metrics port: %v", peer, err)
	}
	if err := dial(f.nodes[0], netip.Addr{}); err != nil {
		t.Errorf("node A could not reach its own metrics port: %v", err)
	}
	if err := dial(f.client, stranger); err == nil {
		t.Errorf("%s, not an allowed source, reached the metrics port", stranger)
	}
	drops, err := d.GuardDrops()
	must(t, err)
	if drops[dropBFD] < 2 || drops[dropMetrics] < 1 {
		t.Errorf("guard drops %v, want at least 2 bfd (one per port) and 1 metrics", drops)
	}
	t.Logf("guard drops: %v", drops)

	// An empty list lets everyone in; a restart keeps the peers and rule.
	must(t, d.SetBFDPeers(nil))
	if !reaches(stranger, bfdSingleHopPort, bfd[0]) {
		t.Errorf("with no BFD peers, %s did not reach node A's BFD port", stranger)
	}
	must(t, d.SetBFDPeers([]netip.Addr{peer}))
	var again *Dataplane
	must(t, inNS(t, f.nodes[0], func() (err error) {
		again, err = New(opts)
		return err
	}))
	t.Cleanup(func() { again.Close() })
	if reaches(stranger, bfdSingleHopPort, bfd[0]) {
		t.Errorf("after a restart, %s reached node A's BFD port", stranger)
	}
	if err := dial(f.client, stranger); err == nil {
		t.Errorf("after a restart, %s reached the metrics port", stranger)
	}
}

// nsUDP listens on UDP at in namespace ns and returns the payloads it
// receives.
func nsUDP(t *testing.T, ns netns.NsHandle, at netip.AddrPort) <-chan string {
	t.Helper()
	var pc net.PacketConn
	must(t, inNS(t, ns, func() (err error) {
		pc, err = net.ListenPacket("udp4", at.String())
		return err
	}))
	t.Cleanup(func() { pc.Close() })
	ch := make(chan string, 16)
	go func() {
		defer close(ch)
		buf := make([]byte, 2048)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			ch <- string(buf[:n])
		}
	}()
	return ch
}

// sendUDPFrom sends, in namespace ns, a datagram with a fresh marker from
// the local address from to to, and reports whether recv got that marker
// within a second.
func sendUDPFrom(t *testing.T, ns netns.NsHandle, from netip.Addr, to netip.AddrPort, recv <-chan string) bool {
	t.Helper()
	marker := fmt.Sprintf("vipcast-host-guard-%d", time.Now().UnixNano())
	must(t, inNS(t, ns, func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: from.AsSlice()}, net.UDPAddrFromAddrPort(to))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(marker))
		return err
	}))
	return received(recv, marker)
}
