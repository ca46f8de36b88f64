//go:build kernel

package ipvs

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	tnetns "github.com/vipcast/vipcast/test/netns"
)

// Test topology helpers for the kernel tests (run inside the VM, as root):
// network namespaces wired to the root namespace (the director) with veth
// pairs, servers and clients inside them.

// inNS runs fn on a thread switched into ns. Sockets keep the namespace they
// were created in, so a listener or a dialled connection made in fn can be
// used from any goroutine afterwards.
func inNS(t testing.TB, ns netns.NsHandle, fn func() error) error {
	t.Helper()
	return tnetns.Do(int(ns), fn)
}

// newNS creates an unnamed network namespace without entering it.
func newNS(t testing.TB) netns.NsHandle {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // also switches this thread into it
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// wire connects ns to the root namespace with a veth pair: hostIP/24 on the
// root side (named name), nsIP/24 inside ns, default route in ns via hostIP
// unless noDefault.
func wire(t testing.TB, ns netns.NsHandle, name, hostIP, nsIP string) {
	t.Helper()
	wireOpts(t, ns, name, []string{hostIP + "/24"}, []string{nsIP + "/24"}, true)
}

// wireOpts is wire with any number of addresses (CIDRs, IPv4 and IPv6, in
// the same order on both sides); with defaultRoute, ns routes everything via
// the host side's addresses.
func wireOpts(t testing.TB, ns netns.NsHandle, name string, hostAddrs, nsAddrs []string, defaultRoute bool) {
	t.Helper()
	peer := name + "p"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
		t.Fatalf("veth %s: %v", name, err)
	}
	host, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range hostAddrs {
		must(t, netlink.AddrAdd(host, addr(t, a)))
	}
	must(t, netlink.LinkSetUp(host))
	p, err := netlink.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetNsFd(p, int(ns)); err != nil {
		t.Fatal(err)
	}
	// NETLINK_ROUTE only: the default set also opens XFRM and netfilter
	// sockets, which fail with "protocol not supported" in this kernel.
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	must(t, h.LinkSetUp(lo))
	in, err := h.LinkByName(peer)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range nsAddrs {
		must(t, h.AddrAdd(in, addr(t, a)))
	}
	must(t, h.LinkSetUp(in))
	if defaultRoute {
		for _, a := range hostAddrs {
			gw, _, _ := net.ParseCIDR(a)
			must(t, h.RouteAdd(&netlink.Route{LinkIndex: in.Attrs().Index, Gw: gw}))
		}
	}
}

// addr parses a CIDR; IPv6 addresses skip duplicate address detection (it
// would keep them tentative, unusable, for a second or more).
func addr(t testing.TB, cidr string) *netlink.Addr {
	t.Helper()
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if a.IP.To4() == nil {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func sysctl(t testing.TB, path, value string) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/"+path, []byte(value), 0o644); err != nil {
		t.Fatalf("sysctl %s=%s: %v", path, value, err)
	}
}

// serve starts a TCP server in ns on ip:port that answers every connection
// with name and closes it.
func serve(t testing.TB, ns netns.NsHandle, ip string, port int, name string) {
	t.Helper()
	var l net.Listener
	err := inNS(t, ns, func() (err error) {
		l, err = net.Listen("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
		return err
	})
	if err != nil {
		t.Fatalf("listen %s in %s: %v", ip, name, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = fmt.Fprintf(c, "%s\n", name) // the client checks what it got
			c.Close()
		}
	}()
}

// backend is a namespace with TCP and UDP servers on port backendPort of
// each of its addresses. The TCP server greets each connection with
// "<name> <client address>" and then answers each line with "<name>
// <line>" until the client closes; the UDP server answers each datagram
// with "<name> <client address>".
type backend struct {
	name  string
	ns    netns.NsHandle
	addrs []netip.Addr
}

const backendPort = 8080

// topo numbers veth pairs and subnets across one VM run.
var topoSeq = 0

// newBackend makes a namespace "name" wired to the root namespace with
// 10.200.<n>.2/24 and fd00:200:<n>::2/64 (root side .1 / ::1) and starts its
// servers. Without defaultRoute it can only reach its own subnet (replies
// to other clients need source NAT).
func newBackend(t testing.TB, name string, defaultRoute bool) *backend {
	t.Helper()
	topoSeq++
	n := topoSeq
	ns := newNS(t)
	v4, v6 := fmt.Sprintf("10.200.%d.", n), fmt.Sprintf("fd00:200:%d::", n)
	wireOpts(t, ns, fmt.Sprintf("vb%d", n), []string{v4 + "1/24", v6 + "1/64"}, []string{v4 + "2/24", v6 + "2/64"}, defaultRoute)
	b := &backend{name: name, ns: ns, addrs: []netip.Addr{ip(v4 + "2"), ip(v6 + "2")}}
	for _, a := range b.addrs {
		b.serveTCP(t, a)
		b.serveUDP(t, a)
	}
	return b
}

func (b *backend) v4() netip.Addr { return b.addrs[0] }
func (b *backend) v6() netip.Addr { return b.addrs[1] }

func (b *backend) serveTCP(t testing.TB, a netip.Addr) {
	var l net.Listener
	err := inNS(t, b.ns, func() (err error) {
		l, err = net.Listen("tcp", netip.AddrPortFrom(a, backendPort).String())
		return err
	})
	if err != nil {
		t.Fatalf("listen %s in %s: %v", a, b.name, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = fmt.Fprintf(c, "%s %s\n", b.name, c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap())
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					_, _ = fmt.Fprintf(c, "%s %s\n", b.name, sc.Text())
				}
			}()
		}
	}()
}

func (b *backend) serveUDP(t testing.TB, a netip.Addr) {
	var pc net.PacketConn
	err := inNS(t, b.ns, func() (err error) {
		pc, err = net.ListenPacket("udp", netip.AddrPortFrom(a, backendPort).String())
		return err
	})
	if err != nil {
		t.Fatalf("listen udp %s in %s: %v", a, b.name, err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			src := from.(*net.UDPAddr).AddrPort().Addr().Unmap()
			_, _ = pc.WriteTo([]byte(fmt.Sprintf("%s %s\n", b.name, src)), from)
		}
	}()
}

// client is a namespace routed through the root namespace (the director):
// 10.100.<n>.2/24 and fd00:100:<n>::2/64.
type client struct {
	ns    netns.NsHandle
	addrs []netip.Addr
}

func newClient(t testing.TB) *client {
	t.Helper()
	topoSeq++
	n := topoSeq
	ns := newNS(t)
	v4, v6 := fmt.Sprintf("10.100.%d.", n), fmt.Sprintf("fd00:100:%d::", n)
	wireOpts(t, ns, fmt.Sprintf("vc%d", n), []string{v4 + "1/24", v6 + "1/64"}, []string{v4 + "2/24", v6 + "2/64"}, true)
	return &client{ns: ns, addrs: []netip.Addr{ip(v4 + "2"), ip(v6 + "2")}}
}

// conn is an open TCP connection through which lines are exchanged.
type conn struct {
	c       net.Conn
	r       *bufio.Reader
	backend string // from the greeting
	source  string // the client address the backend saw
}

// dial connects to to from the client's namespace and reads the greeting.
func (c *client) dial(t testing.TB, to netip.AddrPort) (*conn, error) {
	t.Helper()
	var nc net.Conn
	err := inNS(t, c.ns, func() (err error) {
		nc, err = net.DialTimeout("tcp", to.String(), 5*time.Second)
		return err
	})
	if err != nil {
		return nil, err
	}
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	cn := &conn{c: nc, r: bufio.NewReader(nc)}
	line, err := cn.r.ReadString('\n')
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("greeting from %s: %w", to, err)
	}
	f := strings.Fields(line)
	if len(f) != 2 {
		nc.Close()
		return nil, fmt.Errorf("greeting from %s: %q", to, line)
	}
	cn.backend, cn.source = f[0], f[1]
	return cn, nil
}

// ask sends a line and returns the backend's answer.
func (cn *conn) ask(msg string) (string, error) {
	_ = cn.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(cn.c, "%s\n", msg); err != nil {
		return "", err
	}
	line, err := cn.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

func (cn *conn) Close() error { return cn.c.Close() }

// spread opens n connections to to, one after another, and counts the
// backends that answered.
func (c *client) spread(t testing.TB, to netip.AddrPort, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := 0; i < n; i++ {
		cn, err := c.dial(t, to)
		if err != nil {
			t.Fatalf("connection %d to %s: %v", i, to, err)
		}
		got[cn.backend]++
		cn.Close()
	}
	return got
}

// udp sends one datagram to to from a fresh socket and returns the
// answering backend's name and the source address it saw.
func (c *client) udp(t testing.TB, to netip.AddrPort) (name, source string, err error) {
	t.Helper()
	var pc net.Conn
	err = inNS(t, c.ns, func() (err error) {
		pc, err = net.Dial("udp", to.String())
		return err
	})
	if err != nil {
		return "", "", err
	}
	defer pc.Close()
	buf := make([]byte, 1500)
	for try := 0; try < 3; try++ {
		if _, err := pc.Write([]byte("hello\n")); err != nil {
			return "", "", err
		}
		_ = pc.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := pc.Read(buf)
		if err != nil {
			continue
		}
		f := strings.Fields(string(buf[:n]))
		if len(f) == 2 {
			return f[0], f[1], nil
		}
	}
	return "", "", fmt.Errorf("no UDP answer from %s", to)
}
