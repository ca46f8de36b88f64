//go:build kernel

package ipvs

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testSyncKeys are the relays' keys in the kernel tests.
func testSyncKeys(t testing.TB) SyncKeys {
	t.Helper()
	k, err := NewSyncKeys(map[int][]byte{1: []byte("kernel-test-key-0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// tunnelSources are the nodes' addresses, as the speaker gives them to
// SetTunnelSources: their addresses on the shared link and the fabric, and
// their tunnel addresses.
func (f *moveFabric) tunnelSources() []netip.Addr {
	out := []netip.Addr{ip("10.53.0.1"), ip("10.53.0.2")}
	for n := range f.nodes {
		out = append(out, f.fabricAddr(n), tunnelAddr(n), tunnelAddr6(n))
		if f.v6 {
			out = append(out, ip(fmt.Sprintf("fd00:51:%d::1", n)))
		}
	}
	return out
}

// forgedConn is a sync connection of a client of the fabric's VIP on port
// movePort, tunnelled to daddr: what node B's backup would enter.
func (f *moveFabric) forgedConn(client netip.Addr, daddr netip.Addr) syncConnSpec {
	return syncConnSpec{proto: TCP, flags: syncFwdTunnel, cport: 4000, vport: movePort, dport: movePort, timeout: 900,
		caddr: client, vaddr: f.vip, daddr: daddr}
}

// hasConn reports whether ns's IPVS connection table holds a connection
// from client.
func hasConn(t testing.TB, f *moveFabric, n int, client netip.Addr) bool {
	t.Helper()
	var table []byte
	must(t, inNS(t, f.nodes[n], func() (err error) {
		table, err = os.ReadFile("/proc/thread-self/net/ip_vs_conn")
		return err
	}))
	c := client.As4()
	return strings.Contains(string(table), fmt.Sprintf(" %02X%02X%02X%02X ", c[0], c[1], c[2], c[3]))
}

// waitConn waits up to 5 s for node n's connection table to hold a
// connection from client.
func waitConn(t testing.TB, f *moveFabric, n int, client netip.Addr, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !hasConn(t, f, n, client) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: node %d has no connection from %s after 5s", what, n, client)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sendFrom sends b from node n's namespace, from address src, to dst; a
// multicast dst goes out of link ifname with TTL 1.
func sendFrom(t testing.TB, f *moveFabric, n int, src netip.Addr, dst netip.AddrPort, ifname string, b []byte) {
	t.Helper()
	must(t, inNS(t, f.nodes[n], func() error {
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
		if err != nil {
			return err
		}
		defer c.Close()
		if dst.Addr().IsMulticast() {
			ifi, err := net.InterfaceByName(ifname)
			if err != nil {
				return err
			}
			if err := control(c, func(s int) error {
				return unix.SetsockoptIPMreqn(s, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, &unix.IPMreqn{Ifindex: int32(ifi.Index)}) //nolint:gosec // an interface index
			}); err != nil {
				return err
			}
		}
		_, err = c.WriteToUDPAddrPort(b, dst)
		return err
	}))
}

// forgedSyncRefused is the attack on node B's connection sync from the
// fabric (IPv4 fabrics): a datagram that names a client's flow and where
// to tunnel it. The kernel's backup enters what reaches it (each control
// below shows it does); what must not reach it is a datagram from an
// address that is no node's (multicast: the tunnel guard), one not signed
// with the relays' key although from a node's address (the relay), and,
// signed, a connection to anything but a tier-1 real server (the relay's
// filter: a man in the middle).
func forgedSyncRefused(t *testing.T, f *moveFabric, dps [2]*Dataplane, mode string) {
	t.Helper()
	attacker := ip("203.0.113.66")
	client := func(i byte) netip.Addr { return netip.AddrFrom4([4]byte{192, 0, 2, i}) }
	switch mode {
	case "relay":
		b := dps[1]
		to := netip.AddrPortFrom(f.fabricAddr(1), DefaultSyncRelayPort)
		before, _ := b.RelayStats()
		// From node A's own address, not signed: what anyone who forges
		// that address sends.
		sendFrom(t, f, 0, f.fabricAddr(0), to, "", syncMessage(96, f.forgedConn(client(91), f.tunnelAddr(0))))
		// Signed with the relays' key (a node's own, or a leaked key):
		// a connection tunnelled to the attacker beside a true one.
		signed := testSyncKeys(t).seal(syncMessage(96, f.forgedConn(client(92), attacker), f.forgedConn(client(93), f.tunnelAddr(0))), time.Now())
		sendFrom(t, f, 0, f.fabricAddr(0), to, "", signed)
		waitConn(t, f, 1, client(93), "the true connection of a signed message (the control)")
		for _, c := range []byte{91, 92} {
			if hasConn(t, f, 1, client(c)) {
				t.Errorf("node B's backup holds the forged connection from %s", client(c))
			}
		}
		after, _ := b.RelayStats()
		if after.DroppedBy[SyncDropUnsigned] != before.DroppedBy[SyncDropUnsigned]+1 ||
			after.DroppedConns[SyncDropUnknownTarget] != before.DroppedConns[SyncDropUnknownTarget]+1 {
			t.Errorf("node B's relay: dropped %v, connections %v; before %v, %v: want one more unsigned and one more unknown-target",
				after.DroppedBy, after.DroppedConns, before.DroppedBy, before.DroppedConns)
		}
	case "true":
		// A host on the nodes' link with an address of its own (node A's
		// namespace, a second address), then node A itself.
		addAddr(t, f.hNode[0], "peer", "10.53.0.99/24")
		group := netip.AddrPortFrom(ip(syncMcastGroup), syncMcastPort)
		sendFrom(t, f, 0, ip("10.53.0.99"), group, "peer", syncMessage(96, f.forgedConn(client(94), attacker)))
		sendFrom(t, f, 0, ip("10.53.0.1"), group, "peer", syncMessage(96, f.forgedConn(client(95), f.tunnelAddr(0))))
		// From a node's address the kernel takes it: multicast sync
		// trusts the link (docs/threat-model.md).
		waitConn(t, f, 1, client(95), "a sync message from node A's address (the control)")
		if hasConn(t, f, 1, client(94)) {
			t.Errorf("node B's backup holds a connection from a host that is no node (10.53.0.99), tunnelled to %s", attacker)
		}
	}
}
