//go:build kernel

package ipvs

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipcast/vipcast/test/vm"
)

// TestKernelTunnelGuard: the ToR of the ECMP fabric, which is not a node,
// sends node A an IPIP packet whose inner packet, from a forged address,
// is a UDP datagram to one of node A's pods. Without tunnel sources (a new
// table), the kernel's tunl0 decapsulates it and the pod receives it (the
// guard lets everything in until the speaker gives the sources); once
// SetTunnelSources has the nodes' addresses, the same packet is dropped
// (the guard's counter) while one whose outer source is node B's address
// still reaches the pod; an empty list lets everything in again.
func TestKernelTunnelGuard(t *testing.T) {
	if !vm.InVM() {
		kernelSuite.Run(t)
		return
	}
	f := newMoveFabric(t)
	var d [2]*Dataplane
	for n := range f.nodes {
		d[n], _ = twoTierNode(t, f, n)
	}
	pod := f.pods[0][0].v4()
	tor, nodeA, nodeB := ip("10.51.0.2"), f.fabricAddr(0), f.fabricAddr(1)
	forged := ip("198.51.100.9")
	recv := podUDP(t, f.pods[0][0], 9999)

	if !sendIPIP(t, f, tor, nodeA, forged, pod, 9999, recv) {
		t.Fatalf("before the tunnel sources are set, IPIP from the ToR did not reach the pod: the test cannot tell the guard's effect")
	}
	sources := []netip.Addr{nodeA, nodeB, tunnelAddr(0), tunnelAddr(1)}
	must(t, d[0].SetTunnelSources(sources))
	if sendIPIP(t, f, tor, nodeA, forged, pod, 9999, recv) {
		t.Errorf("IPIP from the ToR (%s), not a node, reached pod %s through node A", tor, pod)
	}
	if !sendIPIP(t, f, nodeB, nodeA, forged, pod, 9999, recv) {
		t.Errorf("IPIP from node B's address (%s) did not reach pod %s through node A", nodeB, pod)
	}
	// Unchanged sources change nothing; an empty list lets everyone in.
	must(t, d[0].SetTunnelSources(sources))
	if sendIPIP(t, f, tor, nodeA, forged, pod, 9999, recv) {
		t.Errorf("after the same sources again, IPIP from the ToR reached the pod")
	}
	must(t, d[0].SetTunnelSources(nil))
	if !sendIPIP(t, f, tor, nodeA, forged, pod, 9999, recv) {
		t.Errorf("with no tunnel sources, IPIP from the ToR did not reach the pod")
	}
	// A restarted Dataplane keeps the guard with its sources.
	must(t, d[0].SetTunnelSources(sources))
	var again *Dataplane
	must(t, inNS(t, f.nodes[0], func() (err error) {
		again, err = New(Options{LinkName: "vip0", Tunnel: f.tunnel(0)})
		return err
	}))
	t.Cleanup(func() { again.Close() })
	if sendIPIP(t, f, tor, nodeA, forged, pod, 9999, recv) {
		t.Errorf("after a restart, IPIP from the ToR reached the pod")
	}
}

// podUDP listens on UDP port in pod b's namespace and returns the
// payloads it receives.
func podUDP(t *testing.T, b *backend, port int) <-chan string {
	t.Helper()
	return nsUDP(t, b.ns, netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(port))) //nolint:gosec // a test port
}

// sendIPIP sends, from the ToR (the client namespace, with a raw socket
// that writes the outer header itself), an IPIP packet from outer to
// node, holding a UDP datagram from inner to dst:port with a fresh marker,
// and reports whether the pod's listener got that marker within a second.
func sendIPIP(t *testing.T, f *moveFabric, outer, node, inner, dst netip.Addr, port int, recv <-chan string) bool {
	t.Helper()
	marker, udp := markedUDP("vipcast-guard", uint16(port)) //nolint:gosec // a test port
	sendRaw(t, f, node, ipv4Header(outer, node, unix.IPPROTO_IPIP, ipv4Header(inner, dst, unix.IPPROTO_UDP, udp)))
	return received(recv, marker)
}

// markedUDP returns a fresh marker (prefix and the time) and a UDP
// datagram from port 5353 to port carrying it, without a checksum.
func markedUDP(prefix string, port uint16) (string, []byte) {
	marker := fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
	udp := make([]byte, 8, 8+len(marker))
	binary.BigEndian.PutUint16(udp[0:], 5353)
	binary.BigEndian.PutUint16(udp[2:], port)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(marker))) //nolint:gosec // a short marker
	return marker, append(udp, marker...)
}

// sendRaw sends the IPv4 packet pkt (its header included) to to from the
// ToR, the client namespace of f, with a raw socket.
func sendRaw(t *testing.T, f *moveFabric, to netip.Addr, pkt []byte) {
	t.Helper()
	must(t, inNS(t, f.client, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: to.As4()})
	}))
}

// received reports whether recv gets marker within a second.
func received(recv <-chan string, marker string) bool {
	deadline := time.After(time.Second)
	for {
		select {
		case got, ok := <-recv:
			if !ok {
				return false
			}
			if got == marker {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// ipv4Header returns an IPv4 packet from src to dst of protocol proto
// around payload, with its header checksum.
func ipv4Header(src, dst netip.Addr, proto byte, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	h[0], h[8], h[9] = 0x45, 64, proto
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload))) //nolint:gosec // a small test packet
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	binary.BigEndian.PutUint16(h[10:], checksum(h))
	return append(h, payload...)
}
