package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The node's side of the two tiers, as New readies it after
// PrepareTunnel: the node's tunnel addresses, local only in TunnelTable
// for the packets that come in on an interface, with the rule that looks
// that table up; the loop for the node's own packets; the routes to the
// other nodes' tunnel addresses (SetTunnelRoutes); and their removal
// (Teardown).

// ensureTunnel readies this node for the two-tier dataplane:
// prepareTunnel, then the routes and the rule for the node's tunnel
// address, and with t.Self6 those of its IPv6 tunnel address. Each step is
// skipped when it is already so, and a tunnel address of an earlier run is
// replaced. no6 says why IPv6 VIPs cannot have the two tiers (ip6ip6 with
// t.Self6, 6in4 without); it fails nothing.
func ensureTunnel(nh *netlink.Handle, t Tunnel) (no6, err error) {
	p, err := prepareTunnel(nh)
	if err != nil {
		return nil, err
	}
	if err := ensureTunnelAddress(nh, t.Self, p.out, p.in); err != nil {
		return nil, err
	}
	if !t.Self6.IsValid() {
		return errors.Join(p.no6, dropTunnel6(nh)), nil
	}
	if err := ensureTunnel6(nh, t.Self6, p.out, p.in); err != nil {
		return fmt.Errorf("IPv6 tunnel address %s: %w", t.Self6, err), nil
	}
	return nil, nil
}

// ensureTunnelAddress routes the node's tunnel address self (IPv4, or
// IPv6: Tunnel.Self6): out of the loop out for the node's own packets,
// local in TunnelTable for those that come in on an interface (in, the
// fabric's), and replaces an earlier run's of the same family.
func ensureTunnelAddress(nh *netlink.Handle, self netip.Addr, out, in netlink.Link) error {
	self = self.Unmap()
	fam := int(family(self))
	host := prefixNet(netip.PrefixFrom(self, self.BitLen()))
	// The node's own packets to its tunnel address leave by the loop, to
	// its peer's address (a permanent neighbour entry: nothing answers
	// ARP or neighbour solicitations for it).
	if err := nh.RouteReplace(&netlink.Route{LinkIndex: out.Attrs().Index, Dst: host, Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("route %s dev %s: %w", self, LoopLink, err)
	}
	if err := nh.NeighSet(&netlink.Neigh{LinkIndex: out.Attrs().Index, IP: self.AsSlice(), HardwareAddr: in.Attrs().HardwareAddr,
		State: netlink.NUD_PERMANENT, Family: fam}); err != nil {
		return fmt.Errorf("neighbour %s dev %s: %w", self, LoopLink, err)
	}
	// Packets from an interface (the loop's peer, the fabric) find it
	// local.
	if err := nh.RouteReplace(&netlink.Route{Table: TunnelTable, Type: unix.RTN_LOCAL, Dst: host,
		LinkIndex: in.Attrs().Index, Scope: netlink.SCOPE_HOST}); err != nil {
		return fmt.Errorf("local route %s in table %d: %w", self, TunnelTable, err)
	}
	if err := dropStaleTunnelRoutes(nh, out, fam, self); err != nil {
		return err
	}
	return ensureTunnelRule(nh, fam)
}

// dropStaleTunnelRoutes deletes the routes of family fam to another
// tunnel address than self (invalid: every one) out of the loop and in
// TunnelTable: those of an earlier run with another address. out nil: the
// routes in TunnelTable only (the loop's go with it).
func dropStaleTunnelRoutes(nh *netlink.Handle, out netlink.Link, fam int, self netip.Addr) error {
	var stale, viaLoop []netlink.Route
	if out != nil {
		var err error
		if viaLoop, err = dump("routes of "+LoopLink, func() ([]netlink.Route, error) {
			return nh.RouteList(out, fam)
		}); err != nil {
			return err
		}
	}
	inTable, err := dump(fmt.Sprintf("routes of table %d", TunnelTable), func() ([]netlink.Route, error) {
		return nh.RouteListFiltered(fam, &netlink.Route{Table: TunnelTable}, netlink.RT_FILTER_TABLE)
	})
	if err != nil {
		return err
	}
	for _, r := range append(viaLoop, inTable...) {
		if r.Dst == nil {
			continue
		}
		a, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok || a.Unmap() == self.Unmap() || a.IsLinkLocalUnicast() || a.IsMulticast() {
			continue // the loop's own IPv6 link-local and multicast routes stay
		}
		stale = append(stale, r)
	}
	for _, r := range stale {
		if err := nh.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("delete stale tunnel route %s: %w", r.Dst, err)
		}
	}
	return nil
}

// tunnelRule is the rule "not iif lo lookup TunnelTable" of family fam.
func tunnelRule(fam int) *netlink.Rule {
	rule := netlink.NewRule()
	rule.IifName, rule.Invert, rule.Table, rule.Priority = "lo", true, TunnelTable, TunnelRulePriority
	rule.Family = fam
	return rule
}

func isTunnelRule(r netlink.Rule) bool {
	return r.Table == TunnelTable && r.Priority == TunnelRulePriority && r.IifName == "lo" && r.Invert
}

// ensureTunnelRule adds the rule "not iif lo lookup TunnelTable" of family
// fam unless it is there.
func ensureTunnelRule(nh *netlink.Handle, fam int) error {
	rules, err := dump("routing rules", func() ([]netlink.Rule, error) { return nh.RuleList(fam) })
	if err != nil {
		return err
	}
	if slices.ContainsFunc(rules, isTunnelRule) {
		return nil
	}
	if err := nh.RuleAdd(tunnelRule(fam)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("rule \"not iif lo lookup %d\": %w", TunnelTable, err)
	}
	return nil
}

// dropTunnelRule deletes the rule ensureTunnelRule adds for family fam,
// every copy of it.
func dropTunnelRule(nh *netlink.Handle, fam int) error {
	rules, err := dump("routing rules", func() ([]netlink.Rule, error) { return nh.RuleList(fam) })
	if err != nil {
		return err
	}
	for _, r := range rules {
		if !isTunnelRule(r) {
			continue
		}
		if err := nh.RuleDel(tunnelRule(fam)); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete rule \"not iif lo lookup %d\": %w", TunnelTable, err)
		}
	}
	return nil
}

// removeTunnelNode takes away what ensureTunnel and SetTunnelRoutes put
// on the node (Teardown): the rule, the routes of TunnelTable, the routes
// SetTunnelRoutes programmed and the loop (its routes and neighbour entry
// go with it), for both families, and IP6TunnelLink. It goes on past a
// failure and returns them all; what is already gone is fine. tunl0, sit0
// and the sysctls stay.
func removeTunnelNode(nh *netlink.Handle) error {
	return errors.Join(
		dropTunnelRule(nh, unix.AF_INET),
		dropStaleTunnelRoutes(nh, nil, unix.AF_INET, netip.Addr{}),
		dropTunnel6(nh),
		setTunnelRoutes(nh, nil),
		deleteLink(nh, LoopLink, "veth"), // LoopPeer goes with it
	)
}

// prefixNet converts p for netlink.
func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// TunnelRouteProtocol marks the routes SetTunnelRoutes programs (the
// rtnetlink protocol field, "proto 96" in ip route), so that it finds and
// removes its own and no other.
const TunnelRouteProtocol = 96

// setTunnelRoutes is SetTunnelRoutes through nh, also with the two-tier
// dataplane off (Teardown: routes nil deletes every route it programmed).
func setTunnelRoutes(nh *netlink.Handle, routes map[netip.Addr]netip.Addr) error {
	var errs []error
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		have, err := dump("tunnel routes", func() ([]netlink.Route, error) {
			return nh.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: TunnelRouteProtocol},
				netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, r := range have {
			if r.Dst == nil {
				continue
			}
			dst, ok := netip.AddrFromSlice(r.Dst.IP)
			gw, gwOK := netip.AddrFromSlice(r.Gw)
			if want, keep := routes[dst.Unmap()]; ok && keep && gwOK && gw.Unmap() == want.Unmap() {
				continue
			}
			if err := nh.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("delete tunnel route %s: %w", r.Dst, err))
			}
		}
	}
	for _, dst := range slices.SortedFunc(maps.Keys(routes), netip.Addr.Compare) {
		gw := routes[dst]
		dst, gw = dst.Unmap(), gw.Unmap()
		if !dst.IsValid() || !gw.IsValid() || dst.Is4() != gw.Is4() {
			errs = append(errs, fmt.Errorf("tunnel route %s via %s: want both of one family", dst, gw))
			continue
		}
		r := &netlink.Route{Dst: prefixNet(netip.PrefixFrom(dst, dst.BitLen())), Gw: gw.AsSlice(), Protocol: TunnelRouteProtocol}
		if err := nh.RouteReplace(r); err != nil {
			errs = append(errs, fmt.Errorf("tunnel route %s via %s: %w", dst, gw, err))
		}
	}
	return errors.Join(errs...)
}
