//go:build kernel

package ipvs

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// testSourceRanges: a restricted virtual server admits only the clients in
// its ranges, IPv4 and IPv6, and the node's own connections only when the
// VIP is among them. The client namespace has two addresses per family,
// "in" and "out". A range change takes effect when SyncService returns,
// and cuts an established connection from a client it no longer admits; a
// restricted virtual server without ranges admits no one; a range added by
// hand is taken out by the next Sync; lifting the restriction admits
// everyone again.
func testSourceRanges(t *testing.T) {
	d := newDataplane(t, "vipcast-sr")
	cl := newClient(t)
	b := newBackend(t, "sr1", true)
	in4, in6 := cl.addrs[0], cl.addrs[1]
	out4, out6 := in4.Next(), in6.Next()
	addClientAddrs(t, cl, out4, out6)

	v4, v6 := ip("192.0.2.70"), ip("2001:db8::70")
	host := func(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }
	web4 := Service{VIP: v4, Port: 80, Protocol: TCP, Backends: backends(1, b), Restricted: true, SourceRanges: []netip.Prefix{host(in4)}}
	web6 := Service{VIP: v6, Port: 80, Protocol: TCP, Backends: []Backend{{Addr: b.v6(), Port: backendPort, Weight: 1}},
		Restricted: true, SourceRanges: []netip.Prefix{netip.MustParsePrefix(in6.String() + "/127")}}
	open4 := Service{VIP: v4, Port: 81, Protocol: TCP, Backends: []Backend{{Addr: b.v4(), Port: backendPort, Weight: 1}}}
	desired := state(web4, web6, open4)
	p := syncOK(t, d, desired)
	if len(p.Filter.AddRestricted) != 2 || len(p.Filter.AddSources) != 2 {
		t.Fatalf("first Sync: filter changes %+v, want 2 restricted virtual servers and 2 ranges", p.Filter)
	}
	expectFrom(t, cl, map[netip.Addr]string{in4: "sr1", out4: "dropped"}, netip.AddrPortFrom(v4, 80))
	expectFrom(t, cl, map[netip.Addr]string{in6: "sr1", out6: "sr1"}, netip.AddrPortFrom(v6, 80)) // a /127 holds both
	// Another port of the same VIP is not restricted.
	expectFrom(t, cl, map[netip.Addr]string{in4: "sr1", out4: "sr1"}, netip.AddrPortFrom(v4, 81))
	// The node's own connections leave from the VIP: not admitted.
	if got := reachFrom(netip.Addr{}, netip.AddrPortFrom(v4, 80)); got != "dropped" {
		t.Errorf("node to %s without the VIP in its ranges: %s, want dropped", netip.AddrPortFrom(v4, 80), got)
	}
	if got := reachFrom(netip.Addr{}, netip.AddrPortFrom(v4, 81)); got != "sr1" {
		t.Errorf("node to the unrestricted %s: %s, want sr1", netip.AddrPortFrom(v4, 81), got)
	}

	// An established connection from in4, then the ranges swapped to
	// out4: from the return of SyncService, out4 is admitted, in4 is not,
	// and the established connection's next exchange gets no answer.
	held, err := dialFrom(t, cl, in4, netip.AddrPortFrom(v4, 80))
	if err != nil {
		t.Fatalf("connection from %s: %v", in4, err)
	}
	defer held.Close()
	if _, err := held.ask("before"); err != nil {
		t.Fatalf("exchange before the change: %v", err)
	}
	web4.SourceRanges = []netip.Prefix{host(out4), host(v4)} // and the node
	if p, err := d.SyncService(web4.Key(), &web4); err != nil || len(p.Filter.AddSources) != 2 || len(p.Filter.DelSources) != 1 || p.Filter.Len() != 3 {
		t.Fatalf("ranges swapped: %+v, %v", p.Filter, err)
	}
	expectFrom(t, cl, map[netip.Addr]string{in4: "dropped", out4: "sr1"}, netip.AddrPortFrom(v4, 80))
	_ = held.c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := fmt.Fprintln(held.c, "after"); err == nil {
		if reply, err := held.r.ReadString('\n'); err == nil {
			t.Errorf("established connection from %s, no longer admitted, still answered %q", in4, reply)
		}
	}
	if got := reachFrom(netip.Addr{}, netip.AddrPortFrom(v4, 80)); got != "sr1" {
		t.Errorf("node to %s with the VIP in its ranges: %s, want sr1", netip.AddrPortFrom(v4, 80), got)
	}

	// Restricted without a range: no one.
	web6.SourceRanges = nil
	if _, err := d.SyncService(web6.Key(), &web6); err != nil {
		t.Fatal(err)
	}
	expectFrom(t, cl, map[netip.Addr]string{in6: "dropped", out6: "dropped"}, netip.AddrPortFrom(v6, 80))

	// A range added by hand opens the port to everyone until the next
	// Sync takes it out.
	desired.Add(web4)
	desired.Add(web6)
	stray := SourceRange{Key: web6.Key(), Range: netip.MustParsePrefix("::/0")}
	must(t, d.nft.update(d.nft.sources, sourceElems([]SourceRange{stray}), nil))
	expectFrom(t, cl, map[netip.Addr]string{in6: "sr1"}, netip.AddrPortFrom(v6, 80))
	if p := syncOK(t, d, desired); len(p.Filter.DelSources) != 1 || p.Filter.DelSources[0] != stray || p.Filter.Len() != 1 {
		t.Errorf("repair of a range added by hand: %+v", p.Filter)
	}
	expectFrom(t, cl, map[netip.Addr]string{in6: "dropped"}, netip.AddrPortFrom(v6, 80))

	// Lifted: everyone.
	web4.Restricted, web4.SourceRanges = false, nil
	if p, err := d.SyncService(web4.Key(), &web4); err != nil || len(p.Filter.DelRestricted) != 1 || len(p.Filter.DelSources) != 2 {
		t.Fatalf("restriction lifted: %+v, %v", p.Filter, err)
	}
	expectFrom(t, cl, map[netip.Addr]string{in4: "sr1", out4: "sr1"}, netip.AddrPortFrom(v4, 80))

	syncOK(t, d, NewState())
	if f, err := d.ReadFilter(); err != nil || len(f.Restricted) != 0 || len(f.Sources) != 0 {
		t.Errorf("filter after Sync(empty): %+v, %v; want empty", f, err)
	}
}

// addClientAddrs gives the client's interface more addresses.
func addClientAddrs(t *testing.T, cl *client, addrs ...netip.Addr) {
	t.Helper()
	h, err := netlink.NewHandleAt(cl.ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if l.Type() != "veth" {
			continue
		}
		for _, a := range addrs {
			bits := 24
			if a.Is6() {
				bits = 64
			}
			must(t, h.AddrAdd(l, addr(t, netip.PrefixFrom(a, bits).String())))
		}
		return
	}
	t.Fatal("client has no veth")
}

// expectFrom dials to from each source address of the client and checks
// who answered (see reach). An answer that is expected gets three tries:
// the first IPv6 packets of a new link wait for neighbour discovery.
func expectFrom(t *testing.T, cl *client, want map[netip.Addr]string, to netip.AddrPort) {
	t.Helper()
	for src, w := range want {
		var got string
		for try := 0; try < 3; try++ {
			must(t, inNS(t, cl.ns, func() error { got = reachFrom(src, to); return nil }))
			if got == w || w == "dropped" {
				break
			}
		}
		if got != w {
			t.Errorf("%s from %s: %s, want %s", to, src, got, w)
		}
	}
}

// reachFrom dials to from src (the zero Addr: the kernel's choice) in the
// caller's namespace and says who answered: the backend's name, "refused"
// or "dropped".
func reachFrom(src netip.Addr, to netip.AddrPort) string {
	dl := net.Dialer{Timeout: time.Second}
	if src.IsValid() {
		dl.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	nc, err := dl.Dial("tcp", to.String())
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.As(err, &ne) && ne.Timeout():
		return "dropped"
	case err != nil:
		return "error: " + err.Error()
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(nc).ReadString('\n')
	if f := strings.Fields(line); len(f) > 0 {
		return f[0]
	}
	return fmt.Sprintf("no greeting: %v", err)
}

// dialFrom opens a connection to to from the client's address src.
func dialFrom(t *testing.T, cl *client, src netip.Addr, to netip.AddrPort) (*conn, error) {
	t.Helper()
	var nc net.Conn
	err := inNS(t, cl.ns, func() (err error) {
		dl := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
		nc, err = dl.Dial("tcp", to.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	cn := &conn{c: nc, r: bufio.NewReader(nc)}
	if _, err := cn.r.ReadString('\n'); err != nil {
		nc.Close()
		return nil, fmt.Errorf("greeting from %s: %w", to, err)
	}
	return cn, nil
}
