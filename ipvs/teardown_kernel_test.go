//go:build kernel

package ipvs

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/nftables"
	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipcast/vipcast/test/vm"
)

// TestKernelTeardown: Teardown (vipcast uninstalled from the node) takes
// everything of vipcast's out of the kernel, and nothing else. Each
// subtest runs in a network namespace of its own (the nftables tables are
// per namespace): a one-tier Dataplane with TCP and UDP virtual servers on
// an IPv4 and an IPv6 VIP, a two-tier one with its node side and tunnel
// routes, and one where some parts were already deleted by hand. In each,
// a foreign virtual server and a foreign route stay, and a second
// Teardown succeeds.
func TestKernelTeardown(t *testing.T) {
	if !vm.InVM() {
		kernelSuite.Run(t)
		return
	}
	t.Run("OneTier", testTeardownOneTier)
	t.Run("TwoTier", testTeardownTwoTier)
	t.Run("PartsMissing", testTeardownPartsMissing)
}

// teardownNode is a network namespace with a Dataplane and, from the
// start, a foreign virtual server and a foreign route.
type teardownNode struct {
	ns      netns.NsHandle
	h       *netlink.Handle
	ih      *libipvs.Handle // IPVS of ns
	d       *Dataplane
	link    string
	foreign *libipvs.Service
}

func newTeardownNode(t *testing.T, opts Options) *teardownNode {
	t.Helper()
	n := &teardownNode{ns: newNS(t), link: opts.LinkName}
	n.h = nsHandle(t, n.ns)
	must(t, inNS(t, n.ns, func() (err error) {
		n.ih, err = libipvs.New("")
		return err
	}))
	t.Cleanup(n.ih.Close)
	// Someone else's: a virtual server (kube-proxy's, say) and a route
	// to an address like a tunnel address, through the fabric.
	n.foreign = &libipvs.Service{Address: net.ParseIP("198.51.100.7"), Protocol: unix.IPPROTO_TCP, Port: 80,
		AddressFamily: unix.AF_INET, SchedName: "rr", Netmask: 0xffffffff}
	must(t, n.ih.NewService(n.foreign))
	must(t, n.ih.NewDestination(n.foreign, &libipvs.Destination{Address: net.ParseIP("10.70.0.9"), Port: 8080, Weight: 5,
		AddressFamily: unix.AF_INET, ConnectionFlags: libipvs.ConnectionFlagMasq}))
	fabric := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "fabric0"}}
	must(t, n.h.LinkAdd(fabric))
	must(t, n.h.LinkSetUp(fabric))
	must(t, n.h.AddrAdd(fabric, addr(t, "10.60.0.1/24")))
	must(t, n.h.AddrAdd(fabric, addr(t, "fd00:60::1/64")))
	must(t, n.h.RouteAdd(&netlink.Route{Dst: prefixNet(netip.MustParsePrefix("10.52.0.7/32")), Gw: ip("10.60.0.9").AsSlice(),
		Protocol: unix.RTPROT_STATIC}))
	d, err := openIn(t, n.ns, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	n.d = d
	return n
}

// openIn runs New in namespace ns; the Dataplane is closed with the test.
func openIn(t *testing.T, ns netns.NsHandle, opts Options) (*Dataplane, error) {
	t.Helper()
	var d *Dataplane
	err := inNS(t, ns, func() (err error) {
		d, err = New(opts)
		return err
	})
	if err == nil {
		t.Cleanup(func() { d.Close() })
	}
	return d, err
}

// leftovers lists what of vipcast's the namespace holds: the virtual
// servers of keys, the dummy link, the nftables tables and the tier-2 map,
// and the two-tier dataplane's loop, rule and routes.
func (n *teardownNode) leftovers(t *testing.T, keys []Key) []string {
	t.Helper()
	var out []string
	svcs, err := n.ih.GetServices()
	must(t, err)
	for _, ks := range svcs {
		if s, ok := serviceFrom(ks); ok && slices.Contains(keys, s.Key()) {
			out = append(out, "virtual server "+s.Key().String())
		}
	}
	for _, name := range []string{n.link, LoopLink, LoopPeer, IP6TunnelLink} {
		if _, err := n.h.LinkByName(name); err == nil {
			out = append(out, "link "+name)
		}
	}
	must(t, inNS(t, n.ns, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
			tables, err := c.ListTablesOfFamily(fam)
			if err != nil {
				return err
			}
			for _, tbl := range tables {
				if tbl.Name != snatTable {
					continue
				}
				out = append(out, "table "+familyName(fam)+" "+snatTable)
				if set, err := c.GetSetByName(tbl, tier2Map); err == nil && set != nil {
					out = append(out, "map "+familyName(fam)+" "+tier2Map)
				}
			}
		}
		return nil
	}))
	for fam, what := range map[int]string{unix.AF_INET: "rule", unix.AF_INET6: "rule6"} {
		rules, err := n.h.RuleList(fam)
		must(t, err)
		for _, r := range rules {
			if r.Priority == TunnelRulePriority || r.Table == TunnelTable {
				out = append(out, fmt.Sprintf("%s priority %d table %d", what, r.Priority, r.Table))
			}
		}
	}
	for _, f := range []struct {
		what   string
		filter netlink.Route
		mask   uint64
	}{
		{fmt.Sprintf("table %d", TunnelTable), netlink.Route{Table: TunnelTable}, netlink.RT_FILTER_TABLE},
		// Table unspecified: every table.
		{fmt.Sprintf("proto %d", TunnelRouteProtocol), netlink.Route{Protocol: TunnelRouteProtocol}, netlink.RT_FILTER_TABLE | netlink.RT_FILTER_PROTOCOL},
	} {
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			routes, err := n.h.RouteListFiltered(fam, &f.filter, f.mask)
			must(t, err)
			for _, r := range routes {
				out = append(out, fmt.Sprintf("route %v %s", r.Dst, f.what))
			}
		}
	}
	return out
}

// teardown checks that before holds every one of want, runs Teardown and
// checks that nothing is left but the foreign virtual server and route,
// then that a second Teardown and Close succeed.
func (n *teardownNode) teardown(t *testing.T, keys []Key, want []string) {
	t.Helper()
	before := n.leftovers(t, keys)
	t.Logf("before Teardown: %v", before)
	for _, w := range want {
		if !slices.Contains(before, w) {
			t.Errorf("before Teardown: no %s (the test would not see it left)", w)
		}
	}
	if err := n.d.Teardown(); err != nil {
		t.Errorf("Teardown: %v", err)
	}
	if left := n.leftovers(t, keys); len(left) > 0 {
		t.Errorf("after Teardown, still there: %v", left)
	}
	n.wantForeign(t)
	// ReadNode looks without putting anything back (New would create the
	// link): it sees the foreign virtual server and no VIP.
	var st State
	must(t, inNS(t, n.ns, func() (err error) {
		st, err = ReadNode(n.link)
		return err
	}))
	if _, ok := st.Services[Key{VIP: ip(n.foreign.Address.String()), Port: n.foreign.Port, Protocol: TCP}]; !ok || len(st.VIPs) != 0 {
		t.Errorf("ReadNode after Teardown: %d virtual servers, VIPs %v; want the foreign one and no VIP", len(st.Services), st.VIPs)
	}
	if left := n.leftovers(t, keys); len(left) > 0 {
		t.Errorf("after ReadNode, back again: %v", left)
	}
	if err := n.d.Teardown(); err != nil {
		t.Errorf("second Teardown: %v", err)
	}
	if err := n.d.Close(); err != nil {
		t.Errorf("Close after Teardown: %v", err)
	}
}

// wantForeign checks the foreign virtual server, with its real server,
// and the foreign route.
func (n *teardownNode) wantForeign(t *testing.T) {
	t.Helper()
	if dests, err := n.ih.GetDestinations(n.foreign); err != nil || len(dests) != 1 || dests[0].Weight != 5 {
		t.Errorf("foreign virtual server %s:%d: real servers %v, %v; want it untouched", n.foreign.Address, n.foreign.Port, dests, err)
	}
	routes, err := n.h.RouteListFiltered(unix.AF_INET, &netlink.Route{Protocol: unix.RTPROT_STATIC}, netlink.RT_FILTER_PROTOCOL)
	must(t, err)
	if len(routes) != 1 || routes[0].Dst.String() != "10.52.0.7/32" {
		t.Errorf("foreign routes (proto static): %v, want 10.52.0.7/32", routes)
	}
}

// teardownServices are TCP and UDP virtual servers on an IPv4 and an IPv6
// VIP, with source NAT on some.
func teardownServices() State {
	v4 := []Backend{{Addr: ip("10.70.0.2"), Port: 8080, Weight: 1}, {Addr: ip("10.70.0.3"), Port: 8080, Weight: 1}}
	v6 := []Backend{{Addr: ip("fd00:70::2"), Port: 8080, Weight: 1}}
	return state(
		Service{VIP: ip("192.0.2.60"), Port: 80, Protocol: TCP, SNAT: true, Backends: v4},
		Service{VIP: ip("192.0.2.60"), Port: 53, Protocol: UDP, Backends: v4},
		Service{VIP: ip("2001:db8::60"), Port: 80, Protocol: TCP, SNAT: true, Backends: v6},
		Service{VIP: ip("2001:db8::60"), Port: 53, Protocol: UDP, Backends: v6},
	)
}

// wantOneTier lists what a one-tier Dataplane on link with desired has
// in the kernel.
func wantOneTier(link string, desired State) []string {
	want := []string{"link " + link, "table ip " + snatTable, "table ip6 " + snatTable}
	for _, k := range desired.keys() {
		want = append(want, "virtual server "+k.String())
	}
	return want
}

func testTeardownOneTier(t *testing.T) {
	n := newTeardownNode(t, Options{LinkName: "vip-t1"})
	desired := teardownServices()
	syncOK(t, n.d, desired)
	n.teardown(t, desired.keys(), wantOneTier(n.link, desired))
}

// twoTierTeardownNode is a two-tier Dataplane with IPv4 and IPv6 tunnel
// addresses, desired synced and tunnel routes set (to 10.52.0.2 via
// 10.60.0.2 and to fd00:52::2 via fd00:60::2, on fabric0).
func twoTierTeardownNode(t *testing.T) (*teardownNode, State, []string) {
	t.Helper()
	self, self6 := ip("10.52.0.9"), ip("fd00:52::9")
	n := newTeardownNode(t, Options{LinkName: "vip-t2", Tunnel: &Tunnel{Self: self, Self6: self6, MTU: 9000}})
	pods := []Backend{{Addr: ip("10.61.1.2"), Port: 8080, Weight: 1}, {Addr: ip("10.61.2.2"), Port: 8080, Weight: 1}}
	nodes := []Backend{{Addr: self, Port: 80, Weight: 2, Tunnel: true}, {Addr: ip("10.52.0.2"), Port: 80, Weight: 1, Tunnel: true}}
	nodes6 := []Backend{{Addr: self6, Port: 80, Weight: 1, Tunnel: true}, {Addr: ip("fd00:52::2"), Port: 80, Weight: 1, Tunnel: true}}
	desired := state(
		Service{VIP: ip("192.0.2.80"), Port: 80, Protocol: TCP, Backends: nodes, Local: pods},
		Service{VIP: ip("192.0.2.80"), Port: 53, Protocol: UDP, Backends: nodes, Local: pods[:1]},
		// IPv6: tier 1 to the IPv6 tunnel addresses (ip6ip6).
		Service{VIP: ip("2001:db8::80"), Port: 80, Protocol: TCP, Backends: nodes6, Local: []Backend{{Addr: ip("fd00:70::2"), Port: 8080, Weight: 1}}},
	)
	syncOK(t, n.d, desired)
	must(t, n.d.SetTunnelRoutes(map[netip.Addr]netip.Addr{ip("10.52.0.2"): ip("10.60.0.2"), ip("fd00:52::2"): ip("fd00:60::2")}))
	want := append(wantOneTier(n.link, desired), "map ip "+tier2Map, "map ip6 "+tier2Map, "link "+LoopLink, "link "+LoopPeer,
		"link "+IP6TunnelLink,
		fmt.Sprintf("rule priority %d table %d", TunnelRulePriority, TunnelTable),
		fmt.Sprintf("rule6 priority %d table %d", TunnelRulePriority, TunnelTable),
		fmt.Sprintf("route %s/32 table %d", self, TunnelTable), fmt.Sprintf("route 10.52.0.2/32 proto %d", TunnelRouteProtocol),
		fmt.Sprintf("route %s/128 table %d", self6, TunnelTable), fmt.Sprintf("route fd00:52::2/128 proto %d", TunnelRouteProtocol))
	return n, desired, want
}

// testTeardownTwoTier: also the node side of the two-tier dataplane goes;
// tunl0 and the sysctls stay.
func testTeardownTwoTier(t *testing.T) {
	n, desired, want := twoTierTeardownNode(t)
	n.teardown(t, desired.keys(), want)
	if _, err := n.h.LinkByName(TunnelLink); err != nil {
		t.Errorf("%s: %v, want it left alone", TunnelLink, err)
	}
	if got := nsSysctl(t, n.ns, "net/ipv4/vs/sloppy_tcp"); got != "1" {
		t.Errorf("sloppy_tcp = %s, want it left alone (1)", got)
	}
}

// testTeardownPartsMissing: a node where the nftables table ip vipcast
// (with the source NAT set and the tier-2 map), the loop and the rule were
// deleted by hand: Teardown removes the rest (the virtual servers too,
// although a Sync would fail there) and succeeds.
func testTeardownPartsMissing(t *testing.T) {
	n, desired, want := twoTierTeardownNode(t)
	must(t, inNS(t, n.ns, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		c.DelTable(&nftables.Table{Name: snatTable, Family: nftables.TableFamilyIPv4})
		return c.Flush()
	}))
	loop, err := n.h.LinkByName(LoopLink)
	must(t, err)
	must(t, n.h.LinkDel(loop))
	rule := netlink.NewRule()
	rule.IifName, rule.Invert, rule.Table, rule.Priority, rule.Family = "lo", true, TunnelTable, TunnelRulePriority, unix.AF_INET
	must(t, n.h.RuleDel(rule))
	if _, err := n.d.Sync(desired); err == nil {
		t.Errorf("Sync without the table ip %s succeeded: the test does not test what it says", snatTable)
	}
	gone := []string{"table ip " + snatTable, "map ip " + tier2Map, "link " + LoopLink, "link " + LoopPeer,
		fmt.Sprintf("rule priority %d table %d", TunnelRulePriority, TunnelTable),
		// The loop's peer held the local routes of the tunnel addresses.
		fmt.Sprintf("route 10.52.0.9/32 table %d", TunnelTable), fmt.Sprintf("route fd00:52::9/128 table %d", TunnelTable)}
	want = slices.DeleteFunc(want, func(s string) bool { return slices.Contains(gone, s) })
	n.teardown(t, desired.keys(), want)
}
