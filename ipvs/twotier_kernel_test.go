//go:build kernel

package ipvs

import (
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipcast/vipcast/test/vm"
)

// TestKernelTwoTier checks what Dataplane does with Options.Tunnel on a
// node, in a network namespace of a real kernel (the traffic through the
// two tiers is TestECMPMove's):
//
//   - New readies the node: tunl0 up, the loop, the routes and the one rule
//     for the tunnel address, sloppy_tcp, and reverse-path filtering off on
//     tunl0 and the loop's peer with every other interface filtered as
//     before (a strict "all" to start with);
//   - Sync programs tier 1 (IPIP real servers) and tier 2 (the map reads
//     back as Tier2Of the desired state, a virtual server with client
//     affinity at its hashed slots);
//   - SyncService of one endpoint change touches the tier-2 map only;
//   - a full Sync repairs a tier-2 element deleted by hand, and the node's
//     side: the rule and a route deleted by hand, the IPv6 tunnel address
//     gone with its link set down and up;
//   - a restarted Dataplane finds everything in place and changes nothing;
//   - a new tunnel address replaces the old one's routes;
//   - New without Tunnel takes the two-tier chains and map away, and
//     refuses two-tier Services; with Tunnel, a Service with SNAT is
//     refused.
func TestKernelTwoTier(t *testing.T) {
	if !vm.InVM() {
		kernelSuite.Run(t)
		return
	}
	ns := newNS(t)
	h := nsHandle(t, ns)
	nsSysctls(t, ns, map[string]string{
		"net/ipv4/conf/all/rp_filter": "1", "net/ipv4/conf/default/rp_filter": "0", "net/ipv4/conf/lo/rp_filter": "2",
	})
	self, self6 := ip("10.52.0.9"), ip("fd00:52::9")
	open := func(opts Options) (*Dataplane, error) { return openIn(t, ns, opts) }
	tunnelOpts := Options{LinkName: "vip0", Tunnel: &Tunnel{Self: self, Self6: self6, MTU: 9000}}
	d, err := open(tunnelOpts)
	if err != nil {
		t.Fatalf("New with Tunnel: %v", err)
	}

	// The node.
	tunl, err := h.LinkByName(TunnelLink)
	must(t, err)
	if tunl.Attrs().Flags&(1<<0) == 0 { // net.FlagUp
		t.Errorf("%s is not up", TunnelLink)
	}
	loopOut, err := h.LinkByName(LoopLink)
	must(t, err)
	loopIn, err := h.LinkByName(LoopPeer)
	if err != nil {
		t.Fatalf("loop peer %s: %v", LoopPeer, err)
	}
	wantTunnelRoutes(t, h, loopOut, self)
	for name, want := range map[string]string{
		"net/ipv4/vs/sloppy_tcp":                      "1",
		"net/ipv4/vs/drop_entry":                      "1",
		"net/ipv4/conf/" + LoopPeer + "/accept_local": "1",
		"net/ipv4/conf/" + LoopPeer + "/rp_filter":    "0",
		"net/ipv4/conf/" + TunnelLink + "/rp_filter":  "0",
		"net/ipv4/conf/all/rp_filter":                 "0",
		"net/ipv4/conf/default/rp_filter":             "1", // raised to the old "all"
		"net/ipv4/conf/lo/rp_filter":                  "2", // already above it
		"net/ipv4/conf/" + LoopLink + "/rp_filter":    "1",
	} {
		if got := nsSysctl(t, ns, name); got != want {
			t.Errorf("sysctl %s = %s, want %s", name, got, want)
		}
	}

	pods := []Backend{{Addr: ip("10.61.1.2"), Port: 8080, Weight: 1}, {Addr: ip("10.61.2.2"), Port: 8080, Weight: 1}}
	nodes := []Backend{{Addr: self, Port: 80, Weight: 2, Tunnel: true}, {Addr: ip("10.52.0.2"), Port: 80, Weight: 1, Tunnel: true}}
	web := Service{VIP: ip("192.0.2.80"), Port: 80, Protocol: TCP, Backends: nodes, Local: pods}
	// dns has client affinity: its slots are the hashed ones.
	dns := Service{VIP: ip("192.0.2.80"), Port: 53, Protocol: UDP, Backends: nodes, Local: pods[:1], Scheduler: DefaultScheduler, Flags: FlagMHFallback, Affinity: true}
	// Enough other Services that the tier-2 map takes several
	// transactions (maxElemsPerBatch).
	const others = 200
	withOthers := func(svcs ...Service) State {
		st := state(svcs...)
		for i := range others {
			st.Add(Service{VIP: netip.AddrFrom4([4]byte{198, 18, 0, byte(i)}), Port: 80, Protocol: TCP, Backends: nodes, Local: pods})
		}
		return st
	}
	desired := withOthers(web, dns)
	p, err := d.Sync(desired)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if want := (2 + others) * Tier2Slots; p.Tier2.Len() != want {
		t.Errorf("Sync from empty: %d tier-2 changes, want %d (plan %v)", p.Tier2.Len(), want, p)
	}
	if d.nft.slowPaths != 0 {
		t.Errorf("%d nftables transactions failed and were redone element by element, want none", d.nft.slowPaths)
	}
	wantTier2(t, d, desired)
	st, err := d.Read()
	must(t, err)
	if got := st.Services[web.Key()].Backends; !reflect.DeepEqual(got, web.Normalize().Backends) {
		t.Errorf("tier 1 of %s reads back %v, want %v", web.Key(), got, web.Normalize().Backends)
	}

	// One endpoint replaced: tier 2 only.
	web.Local = []Backend{pods[0], {Addr: ip("10.61.3.2"), Port: 8080, Weight: 1}}
	desired = withOthers(web, dns)
	p, err = d.SyncService(web.Key(), &web)
	if err != nil {
		t.Fatalf("SyncService: %v", err)
	}
	if p.Tier2.Len() == 0 || p.Len() != p.Tier2.Len() {
		t.Errorf("SyncService of an endpoint change: plan %v, want tier-2 changes only", p)
	}
	wantTier2(t, d, desired)

	// Drift: an element deleted by hand comes back with a full Sync.
	must(t, inNS(t, ns, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		set, err := c.GetSetByName(&nftables.Table{Name: snatTable, Family: nftables.TableFamilyIPv4}, tier2Map)
		if err != nil {
			return err
		}
		gone := Tier2Slot{Key: dns.Key(), Slot: Tier2Slots + 5, To: pods[0].AddrPort()}
		if err := c.SetDeleteElements(set, []nftables.SetElement{{Key: tier2Elem(gone).Key}}); err != nil {
			return err
		}
		return c.Flush()
	}))
	if p, err = d.Sync(desired); err != nil || len(p.Tier2.Add) != 1 || p.Len() != 1 {
		t.Errorf("Sync after a tier-2 element was deleted by hand: plan %v, err %v; want the one element added back", p, err)
	}
	wantTier2(t, d, desired)
	wantTunnel6(t, h, self6)

	// Drift on the node: the rule and the local route of the tunnel
	// address deleted, the IPv6 tunnel link set down (its address goes)
	// and up. A full Sync puts them back.
	must(t, h.RuleDel(tunnelRule(unix.AF_INET)))
	must(t, h.RouteDel(&netlink.Route{Table: TunnelTable, Type: unix.RTN_LOCAL, Dst: prefixNet(netip.PrefixFrom(self, 32)),
		LinkIndex: loopIn.Attrs().Index, Scope: netlink.SCOPE_HOST}))
	tun6, err := h.LinkByName(IP6TunnelLink)
	must(t, err)
	must(t, h.LinkSetDown(tun6))
	must(t, h.LinkSetUp(tun6))
	if addrs, err := h.AddrList(tun6, unix.AF_INET6); err != nil || slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.Equal(self6.AsSlice()) }) {
		t.Errorf("%s set down and up still has %s (%v): the test does not test what it says", IP6TunnelLink, self6, err)
	}
	if _, err = d.Sync(desired); err != nil {
		t.Errorf("Sync after the node's tunnel setup was damaged: %v", err)
	}
	wantTunnelRoutes(t, h, loopOut, self)
	wantTunnel6(t, h, self6)

	// Upgrade from a release that typed the map's slot integer, which nft
	// 1.0.6 cannot list (it aborts `nft list ruleset`), its rules using
	// the map: New makes the map again, with the rules, and the first
	// Sync fills it.
	oldTier2Map(t, d, self)
	must(t, d.Close())
	if d, err = open(tunnelOpts); err != nil {
		t.Fatalf("New over the old map: %v", err)
	}
	if set, err := d.nft.conn.GetSetByName(d.nft.tables[0], tier2Map); err != nil || set.KeyType.Name != tier2Families[0].keyType().Name {
		t.Fatalf("map %s after New over the old one: %+v (%v), want key type %q", tier2Map, set, err, tier2Families[0].keyType().Name)
	}
	if _, err = d.Sync(desired); err != nil {
		t.Fatalf("Sync after New over the old map: %v", err)
	}
	wantTier2(t, d, desired)

	// Restart: nothing to do.
	must(t, d.Close())
	if d, err = open(tunnelOpts); err != nil {
		t.Fatalf("New again: %v", err)
	}
	if p, err = d.Sync(desired); err != nil || !p.Empty() {
		t.Errorf("Sync after a restart: plan %v, err %v; want no changes", p, err)
	}
	wantTunnelRoutes(t, h, loopOut, self)

	// Another tunnel address.
	must(t, d.Close())
	other := ip("10.52.0.10")
	if d, err = open(Options{LinkName: "vip0", Tunnel: &Tunnel{Self: other}}); err != nil {
		t.Fatalf("New with another tunnel address: %v", err)
	}
	wantTunnelRoutes(t, h, loopOut, other)
	if _, err := d.Sync(state(func() Service { s := web; s.SNAT = true; return s }())); err == nil || !strings.Contains(err.Error(), "two-tier") {
		t.Errorf("Sync of a Service with SNAT in two-tier mode: %v, want a refusal naming the two-tier dataplane", err)
	}

	testTunnelRoutes(t, d, h)

	// Back to one tier.
	must(t, d.Close())
	if d, err = open(Options{LinkName: "vip0"}); err != nil {
		t.Fatalf("New without Tunnel: %v", err)
	}
	must(t, inNS(t, ns, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		tbl := &nftables.Table{Name: snatTable, Family: nftables.TableFamilyIPv4}
		for _, ch := range tunnelChains {
			if got, err := c.ListChain(tbl, ch.Name); err == nil && got != nil {
				t.Errorf("chain %s still there without Tunnel", ch.Name)
			}
		}
		if set, err := c.GetSetByName(tbl, tier2Map); err == nil && set != nil {
			t.Errorf("map %s still there without Tunnel", tier2Map)
		}
		return nil
	}))
	if _, err := d.Sync(desired); err == nil || !strings.Contains(err.Error(), "Options.Tunnel") {
		t.Errorf("Sync of two-tier Services without Tunnel: %v, want a refusal naming Options.Tunnel", err)
	}
}

// oldTier2Map replaces d's IPv4 tier-2 map with one whose key's slot is
// typed integer, and its chains' rules with rules that use it, as a
// release before the slot was typed mark left them.
func oldTier2Map(t *testing.T, d *Dataplane, self netip.Addr) {
	t.Helper()
	n, fam := d.nft, tier2Families[0]
	tbl := n.tables[0]
	var chains []*nftables.Chain
	for _, c := range tunnelChains {
		c.Table = tbl
		ch := n.conn.AddChain(&c)
		n.conn.FlushChain(ch)
		chains = append(chains, ch)
	}
	n.conn.DelSet(n.tier2[0])
	old := &nftables.Set{Table: tbl, Name: tier2Map, IsMap: true, Concatenation: true, DataType: fam.dataType(),
		KeyType: nftables.MustConcatSetType(fam.addrType, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInteger)}
	must(t, n.conn.AddSet(old, nil))
	for _, ch := range chains {
		for _, r := range tunnelRules(ch.Name, fam, TunnelLink, n.vips[0], old, 1400, self) {
			n.conn.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: r})
		}
	}
	must(t, n.conn.Flush())
	if set, err := n.conn.GetSetByName(tbl, tier2Map); err != nil || set.KeyType.Name == fam.keyType().Name {
		t.Fatalf("the old map %+v (%v): the test does not test what it says", set, err)
	}
}

// wantTier2 checks that d's tier-2 map reads back as desired's.
func wantTier2(t *testing.T, d *Dataplane, desired State) {
	t.Helper()
	got, err := d.ReadTier2()
	if err != nil {
		t.Fatalf("ReadTier2: %v", err)
	}
	if want := Tier2Of(desired); !reflect.DeepEqual(got, want) {
		t.Errorf("tier-2 map reads back %v, want %v", got, want)
	}
}

// wantTunnelRoutes checks the routes and the rule for the tunnel address
// self, and that no other tunnel address has any.
func wantTunnelRoutes(t *testing.T, h *netlink.Handle, loopOut netlink.Link, self netip.Addr) {
	t.Helper()
	dsts := func(rs []netlink.Route) []string {
		var out []string
		for _, r := range rs {
			if r.Dst != nil {
				out = append(out, r.Dst.String())
			}
		}
		return out
	}
	viaLoop, err := h.RouteList(loopOut, unix.AF_INET)
	must(t, err)
	inTable, err := h.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: TunnelTable}, netlink.RT_FILTER_TABLE)
	must(t, err)
	want := []string{self.String() + "/32"}
	if got := dsts(viaLoop); !reflect.DeepEqual(got, want) {
		t.Errorf("routes via %s: %v, want %v", LoopLink, got, want)
	}
	if got := dsts(inTable); !reflect.DeepEqual(got, want) {
		t.Errorf("routes in table %d: %v, want %v", TunnelTable, got, want)
	}
	rules, err := h.RuleList(unix.AF_INET)
	must(t, err)
	n := 0
	for _, r := range rules {
		if r.Table == TunnelTable {
			n++
			if r.IifName != "lo" || !r.Invert || r.Priority != TunnelRulePriority {
				t.Errorf("rule to table %d: iif %q invert %v priority %d, want not iif lo, priority %d", TunnelTable, r.IifName, r.Invert, r.Priority, TunnelRulePriority)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d rules to table %d, want 1", n, TunnelTable)
	}
}

// nsSysctl reads a sysctl in namespace ns.
func nsSysctl(t *testing.T, ns netns.NsHandle, name string) string {
	t.Helper()
	var v []byte
	must(t, inNS(t, ns, func() (err error) {
		v, err = os.ReadFile("/proc/sys/" + name)
		return err
	}))
	return strings.TrimSpace(string(v))
}

// testTunnelRoutes: SetTunnelRoutes programs the routes to the other
// nodes' tunnel addresses, replaces a changed gateway, removes a route no
// longer wanted, leaves a route of someone else alone, and reports a
// gateway it cannot reach while setting the others.
func testTunnelRoutes(t *testing.T, d *Dataplane, h *netlink.Handle) {
	t.Helper()
	fabric := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "fabric0"}}
	must(t, h.LinkAdd(fabric))
	must(t, h.LinkSetUp(fabric))
	must(t, h.AddrAdd(fabric, addr(t, "10.60.0.1/24")))
	foreign := &netlink.Route{Dst: prefixNet(netip.MustParsePrefix("10.52.0.7/32")), Gw: ip("10.60.0.9").AsSlice(), Protocol: unix.RTPROT_STATIC}
	must(t, h.RouteAdd(foreign))
	ours := func() map[string]string {
		rs, err := h.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		must(t, err)
		m := map[string]string{}
		for _, r := range rs {
			// (The node's own tunnel address is routed out of the loop,
			// without gateway.)
			if r.Dst != nil && r.Gw != nil && strings.HasPrefix(r.Dst.String(), "10.52.") {
				m[r.Dst.String()] = fmt.Sprintf("via %s proto %d", r.Gw, r.Protocol)
			}
		}
		return m
	}
	if err := d.SetTunnelRoutes(map[netip.Addr]netip.Addr{ip("10.52.0.2"): ip("10.60.0.2"), ip("10.52.0.3"): ip("10.60.0.3")}); err != nil {
		t.Fatalf("SetTunnelRoutes: %v", err)
	}
	want := map[string]string{"10.52.0.2/32": "via 10.60.0.2 proto 96", "10.52.0.3/32": "via 10.60.0.3 proto 96", "10.52.0.7/32": "via 10.60.0.9 proto 4"}
	if got := ours(); !reflect.DeepEqual(got, want) {
		t.Errorf("routes after SetTunnelRoutes: %v, want %v", got, want)
	}
	err := d.SetTunnelRoutes(map[netip.Addr]netip.Addr{ip("10.52.0.3"): ip("10.60.0.4"), ip("10.52.0.5"): ip("10.99.0.1")})
	if err == nil || !strings.Contains(err.Error(), "10.52.0.5 via 10.99.0.1") {
		t.Errorf("SetTunnelRoutes with an unreachable gateway: %v, want an error naming that route", err)
	}
	want = map[string]string{"10.52.0.3/32": "via 10.60.0.4 proto 96", "10.52.0.7/32": "via 10.60.0.9 proto 4"}
	if got := ours(); !reflect.DeepEqual(got, want) {
		t.Errorf("routes after a change: %v, want %v", got, want)
	}
	must(t, d.SetTunnelRoutes(nil))
	want = map[string]string{"10.52.0.7/32": "via 10.60.0.9 proto 4"}
	if got := ours(); !reflect.DeepEqual(got, want) {
		t.Errorf("routes after SetTunnelRoutes(nil): %v, want %v", got, want)
	}
}

// wantTunnel6 checks the node's side of IPv6 tunnel address self6: the
// address on IP6TunnelLink, no route to it in the kernel's local table,
// a local route in TunnelTable, and the IPv6 rule.
func wantTunnel6(t *testing.T, h *netlink.Handle, self6 netip.Addr) {
	t.Helper()
	tun, err := h.LinkByName(IP6TunnelLink)
	if err != nil {
		t.Errorf("link %s: %v", IP6TunnelLink, err)
		return
	}
	addrs, err := h.AddrList(tun, unix.AF_INET6)
	must(t, err)
	if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.Equal(self6.AsSlice()) }) {
		t.Errorf("%s addresses %v, want %s", IP6TunnelLink, addrs, self6)
	}
	host := prefixNet(netip.PrefixFrom(self6, 128))
	for table, want := range map[int]int{unix.RT_TABLE_LOCAL: 0, TunnelTable: 1} {
		rs, err := h.RouteListFiltered(unix.AF_INET6, &netlink.Route{Table: table, Dst: host}, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST)
		must(t, err)
		if len(rs) != want {
			t.Errorf("routes to %s in table %d: %v, want %d", self6, table, rs, want)
		}
	}
	rules, err := h.RuleList(unix.AF_INET6)
	must(t, err)
	if !slices.ContainsFunc(rules, isTunnelRule) {
		t.Errorf("no IPv6 rule \"not iif lo lookup %d\"", TunnelTable)
	}
}
