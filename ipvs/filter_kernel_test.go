//go:build kernel

package ipvs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// testFilter: a VIP answers only on its Services' ports, IPv4 and IPv6.
// The node listens on every address on ports 22, 7999 (no Service uses
// it), 80 and 81; through a VIP the client reaches the backend on 80, IPVS
// (no real server: it refuses or drops) on 81, and nothing on 22 and 7999, while
// the same listeners answer on the node's own address. A port gained or
// lost opens or closes that port alone; elements changed by hand are
// repaired by the next Sync; ICMP echo is dropped, the ICMP of path MTU
// discovery is let through.
func testFilter(t *testing.T) {
	d := newDataplane(t, "vipcast-f")
	cl := newClient(t)
	b := newBackend(t, "f1", true)
	node := map[int]*atomic.Int32{}
	for _, port := range []int{22, 7999, 80, 81} {
		node[port] = listenNode(t, port)
	}
	v4, v6 := ip("192.0.2.60"), ip("2001:db8::60")
	web4 := Service{VIP: v4, Port: 80, Protocol: TCP, Backends: backends(1, b)}
	web6 := Service{VIP: v6, Port: 80, Protocol: TCP, Backends: []Backend{{Addr: b.v6(), Port: backendPort, Weight: 1}}}
	empty4 := Service{VIP: v4, Port: 81, Protocol: TCP} // no endpoint on this node
	empty6 := Service{VIP: v6, Port: 81, Protocol: TCP}
	desired := state(web4, web6, empty4, empty6)
	p := syncOK(t, d, desired)
	if len(p.Filter.AddVIPs) != 2 || len(p.Filter.AddAllow) != 4 {
		t.Fatalf("first Sync: filter changes %+v, want 2 VIPs and 4 ports", p.Filter)
	}
	// 81 reaches IPVS, which answers a virtual server without real
	// servers with an ICMP port unreachable that the kernel rate-limits per
	// destination: refused, or dropped once limited. The node's listener
	// on 81 never sees it (counted below).
	want := map[uint16]string{80: "f1", 81: noServer, 22: "dropped", 7999: "dropped"}
	cl.expect(t, v4, want)
	cl.expect(t, v6, map[uint16]string{80: "f1", 81: noServer, 22: "dropped", 7999: "dropped"})
	// The same listeners answer on the node's own addresses: what keeps
	// the client out is the filter.
	for _, own := range []netip.Addr{cl.addrs[0].Prev(), cl.addrs[1].Prev()} {
		cl.expect(t, own, map[uint16]string{22: "node", 7999: "node", 80: "node", 81: "node"})
	}
	for _, port := range []int{22, 7999, 81} {
		if n := node[port].Load(); n != 2 {
			t.Errorf("node listener on %d accepted %d connections, want 2 (its own addresses only)", port, n)
		}
	}

	// A port gained opens that port; a port lost closes it (the node's own
	// listener on it is not reached); the others stay as they were.
	web8080 := Service{VIP: v4, Port: 8080, Protocol: TCP, Backends: backends(1, b)}
	if p, err := d.SyncService(web8080.Key(), &web8080); err != nil || len(p.Filter.AddAllow) != 1 || p.Filter.Len() != 1 {
		t.Fatalf("port 8080 gained: %v %+v, %v", p, p.Filter, err)
	}
	want[8080] = "f1"
	cl.expect(t, v4, want)
	if p, err := d.SyncService(web4.Key(), nil); err != nil || len(p.Filter.DelAllow) != 1 || p.Filter.Len() != 1 {
		t.Fatalf("port 80 lost: %v %+v, %v", p, p.Filter, err)
	}
	want[80] = "dropped"
	cl.expect(t, v4, want)
	if n := node[80].Load(); n != 2 {
		t.Errorf("node listener on 80 accepted %d connections, want 2 (its own addresses only)", n)
	}
	cl.expect(t, v6, map[uint16]string{80: "f1", 81: noServer, 22: "dropped"})
	delete(desired.Services, web4.Key())
	desired.Add(web8080)
	if p := syncOK(t, d, desired); !p.Empty() {
		t.Errorf("Sync after the incremental changes: %v", p)
	}

	testFilterDrift(t, d, cl, desired)
	testFilterICMP(t, cl, v4, v6)

	syncOK(t, d, NewState())
	if f, err := d.ReadFilter(); err != nil || len(f.VIPs) != 0 || len(f.Allow) != 0 {
		t.Errorf("filter after Sync(empty): %+v, %v; want empty", f, err)
	}
}

// testFilterDrift: a port let through by hand, and a VIP taken out of the
// filter by hand, open the node's port 22; the next Sync closes it again.
func testFilterDrift(t *testing.T, d *Dataplane, cl *client, desired State) {
	v4, v6 := ip("192.0.2.60"), ip("2001:db8::60")
	ssh := Key{VIP: v4, Port: 22, Protocol: TCP}
	must(t, d.nft.update(d.nft.allow, keyElems([]Key{ssh}), nil))
	must(t, d.nft.update(d.nft.vips, nil, vipElems([]netip.Addr{v6})))
	cl.expect(t, v4, map[uint16]string{22: "node"})
	cl.expect(t, v6, map[uint16]string{22: "node", 7999: "node"})
	// IPVS itself answers for a virtual server without real servers,
	// filter or not.
	cl.expect(t, v6, map[uint16]string{81: noServer})
	p := syncOK(t, d, desired)
	if p.Len() != 2 || len(p.Filter.DelAllow) != 1 || p.Filter.DelAllow[0] != ssh || len(p.Filter.AddVIPs) != 1 || p.Filter.AddVIPs[0] != v6 {
		t.Errorf("repair: %v %+v", p, p.Filter)
	}
	for _, vip := range []netip.Addr{v4, v6} {
		cl.expect(t, vip, map[uint16]string{22: "dropped", 7999: "dropped"})
	}
}

// testFilterICMP: ICMP echo to a VIP gets no answer and does not reach the
// node's kernel; "fragmentation needed" (IPv4) and "packet too big"
// (ICMPv6) to a VIP reach it.
func testFilterICMP(t *testing.T, cl *client, v4, v6 netip.Addr) {
	own4 := cl.addrs[0].Prev()
	cases := []struct {
		name              string
		to                netip.Addr
		typ, code         byte
		delivered, answer bool
	}{
		{"echo to the node", own4, 8, 0, true, true},
		{"echo to an IPv4 VIP", v4, 8, 0, false, false},
		{"echo to an IPv6 VIP", v6, 128, 0, false, false},
		{"fragmentation needed to an IPv4 VIP", v4, 3, 4, true, false},
		{"port unreachable to an IPv4 VIP", v4, 3, 3, false, false},
		{"packet too big to an IPv6 VIP", v6, 2, 0, true, false},
	}
	for i, tc := range cases {
		marker := []byte(fmt.Sprintf("vipcast-filter-%d-%d", time.Now().UnixNano(), i))
		delivered, answered := cl.icmp(t, tc.to, tc.typ, tc.code, marker)
		if delivered != tc.delivered || answered != tc.answer {
			t.Errorf("%s: reached the node %v, answered %v; want %v, %v", tc.name, delivered, answered, tc.delivered, tc.answer)
		}
	}
}

// listenNode listens on port of every address of the root namespace (the
// node) and greets each connection with "node"; it counts connections.
func listenNode(t *testing.T, port int) *atomic.Int32 {
	t.Helper()
	l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatalf("node listener on %d: %v", port, err)
	}
	t.Cleanup(func() { l.Close() })
	n := &atomic.Int32{}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_, _ = fmt.Fprintln(c, "node")
			c.Close()
		}
	}()
	return n
}

// reach dials to from the client with a short timeout and says who
// answered: a backend's name, "node", "refused" (ICMP or RST) or "dropped"
// (no answer at all).
func (c *client) reach(t *testing.T, to netip.AddrPort) string {
	t.Helper()
	var got string
	must(t, inNS(t, c.ns, func() error { got = reachFrom(netip.Addr{}, to); return nil }))
	return got
}

// noServer is what a client sees of a virtual server without real
// servers: IPVS's ICMP port unreachable (refused), or nothing once the
// kernel rate-limits those (dropped).
const noServer = "refused|dropped"

// expect dials each port of want on addr and checks the outcome: one of
// the "|"-separated alternatives of its value.
func (c *client) expect(t *testing.T, addr netip.Addr, want map[uint16]string) {
	t.Helper()
	for port, w := range want {
		if got := c.reach(t, netip.AddrPortFrom(addr, port)); !slices.Contains(strings.Split(w, "|"), got) {
			t.Errorf("%s: %s, want %s", netip.AddrPortFrom(addr, port), got, w)
		}
	}
}

// icmp sends an ICMP (ICMPv6 for an IPv6 address) message of type and code
// carrying marker from the client to to; it reports whether the node's
// kernel received it (a raw socket of the root namespace saw it) and
// whether the client got an echo reply carrying marker.
func (c *client) icmp(t *testing.T, to netip.Addr, typ, code byte, marker []byte) (delivered, answered bool) {
	t.Helper()
	network, reply := "ip4:icmp", byte(0)
	if to.Is6() {
		network, reply = "ip6:ipv6-icmp", 129
	}
	nodeConn, err := net.ListenPacket(network, "")
	if err != nil {
		t.Fatalf("node raw socket: %v", err)
	}
	defer nodeConn.Close()
	var cc net.PacketConn
	must(t, inNS(t, c.ns, func() (err error) {
		cc, err = net.ListenPacket(network, "")
		return err
	}))
	defer cc.Close()
	msg := icmpMessage(to, typ, code, marker)
	if _, err := cc.WriteTo(msg, &net.IPAddr{IP: to.AsSlice()}); err != nil {
		t.Fatalf("send ICMP to %s: %v", to, err)
	}
	saw := func(pc net.PacketConn, d time.Duration, ok func([]byte) bool) bool {
		_ = pc.SetReadDeadline(time.Now().Add(d))
		buf := make([]byte, 2048)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return false
			}
			if bytes.Contains(buf[:n], marker) && ok(buf[:n]) {
				return true
			}
		}
	}
	delivered = saw(nodeConn, time.Second, func(b []byte) bool { return b[0] == typ && b[1] == code })
	answered = saw(cc, 500*time.Millisecond, func(b []byte) bool { return b[0] == reply })
	return delivered, answered
}

// icmpMessage builds an ICMP message: echo requests carry an identifier,
// sequence and marker; errors carry (as the quoted packet) an IPv4 or IPv6
// header of a TCP segment from to to 192.0.2.200 / 2001:db8::200, MTU 1280,
// and marker. The kernel fills the checksum of ICMPv6.
func icmpMessage(to netip.Addr, typ, code byte, marker []byte) []byte {
	m := []byte{typ, code, 0, 0}
	switch {
	case typ == 8 || typ == 128:
		m = append(m, 0x12, 0x34, 0, 1)
	case to.Is4():
		m = append(m, 0, 0, 0x05, 0x00) // unused, next-hop MTU 1280
		h := []byte{0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 6, 0, 0}
		h = append(append(h, to.AsSlice()...), 192, 0, 2, 200)
		m = append(m, h...)
	default:
		m = binary.BigEndian.AppendUint32(m, 1280)
		h := []byte{0x60, 0, 0, 0, 0, 40, 6, 64}
		h = append(append(h, to.AsSlice()...), netip.MustParseAddr("2001:db8::200").AsSlice()...)
		m = append(m, h...)
	}
	m = append(m, 0, 80, 0x9c, 0x40, 0, 0, 0, 1) // ports and sequence of the quoted segment
	m = append(m, marker...)
	if to.Is4() {
		binary.BigEndian.PutUint16(m[2:], checksum(m))
	}
	return m
}

func checksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
