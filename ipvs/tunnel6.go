package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// IPv6 VIPs through the two tiers in IPv6 (Tunnel.Self6): tier 1 sends an
// IPv6 VIP's packets to the chosen node's IPv6 tunnel address in IPv6
// (ip6ip6), which the kernel's IPVS sync protocol carries, unlike 6in4.
//
// The kernel's ip6ip6 receive path (ip6_tunnel, ip6_tnl_rcv_ctl) accepts
// a packet only when its outer destination is an address configured on
// the node, and, unless the tunnel allows it, its outer source is not:
// the ip6tnl fallback device ip6tnl0 takes neither a local address nor
// that flag. So each node has its own ip6tnl link, IP6TunnelLink, local to
// Self6 and open to any remote, with ip6ip6 only and "allow-localremote"
// (the loop's packets come from the node itself). Self6 is an address of
// that link (no duplicate address detection, no prefix route). An address
// brings a local route in the kernel's local table, and IPVS would deliver
// a tunnel-mode real server at a local address without encapsulating it:
// that route goes, and, as for IPv4, Self6 is local only in TunnelTable,
// for packets from an interface, and the node's own packets to it go round
// the loop (its IPv6 side: a route, a permanent neighbour entry, the same
// rule for IPv6).

const (
	// IP6TunnelLink is the ip6tnl link that decapsulates the ip6ip6
	// packets addressed to Tunnel.Self6.
	IP6TunnelLink = "vcip6tnl"
	// ip6TunnelFlags: IP6_TNL_F_IGN_ENCAP_LIMIT | IP6_TNL_F_ALLOW_LOCAL_REMOTE.
	ip6TunnelFlags = 0x1 | 0x40
	// localRouteWait bounds the wait for the kernel's local route of a
	// new address (added once the address leaves its tentative state).
	localRouteWait = 3 * time.Second
)

// ensureTunnel6 readies the node for IPv6 VIPs through the two tiers in
// IPv6, at the IPv6 tunnel address self; out and in are the loop, which
// prepareTunnel gave IPv6.
func ensureTunnel6(nh *netlink.Handle, self netip.Addr, out, in netlink.Link) error {
	if !hasIPv6() {
		return errors.New("the node has no IPv6 (/proc/sys/net/ipv6)")
	}
	tun, err := ensureIP6Tunnel(nh, self)
	if err != nil {
		return err
	}
	if err := ensureTunnel6Address(nh, tun, self); err != nil {
		return err
	}
	return ensureTunnelAddress(nh, self, out, in)
}

// ensureIP6Tunnel returns IP6TunnelLink, up, local to self: created when
// missing, replaced when it has other parameters (an earlier run's
// address). The kernel loads the ip6_tunnel module on request.
func ensureIP6Tunnel(nh *netlink.Handle, self netip.Addr) (netlink.Link, error) {
	want := &netlink.Ip6tnl{LinkAttrs: netlink.LinkAttrs{Name: IP6TunnelLink}, Local: self.AsSlice(),
		Proto: unix.IPPROTO_IPV6, Flags: ip6TunnelFlags}
	if l, err := nh.LinkByName(IP6TunnelLink); err == nil {
		if have, ok := l.(*netlink.Ip6tnl); ok && have.Local.Equal(want.Local) && (len(have.Remote) == 0 || have.Remote.IsUnspecified()) &&
			have.Proto == want.Proto && have.Flags&ip6TunnelFlags == ip6TunnelFlags {
			return l, setUp(nh, l)
		}
		if err := nh.LinkDel(l); err != nil {
			return nil, fmt.Errorf("delete link %s of other parameters: %w", IP6TunnelLink, err)
		}
	}
	if err := nh.LinkAdd(want); err != nil {
		return nil, fmt.Errorf("link %s (ip6tnl ip6ip6 local %s): %w (the kernel loads ip6_tunnel on request; without module autoloading put it in /etc/modules-load.d)", IP6TunnelLink, self, err)
	}
	l, err := nh.LinkByName(IP6TunnelLink)
	if err != nil {
		return nil, fmt.Errorf("link %s: %w", IP6TunnelLink, err)
	}
	return l, setUp(nh, l)
}

// ensureTunnel6Address makes self the only global address of tun, and
// takes the kernel's local route for it away.
func ensureTunnel6Address(nh *netlink.Handle, tun netlink.Link, self netip.Addr) error {
	addrs, err := dump("addresses of "+IP6TunnelLink, func() ([]netlink.Addr, error) {
		return nh.AddrList(tun, unix.AF_INET6)
	})
	if err != nil {
		return err
	}
	found := false
	for _, a := range addrs {
		got, _ := netip.AddrFromSlice(a.IP)
		switch {
		case got == self:
			found = true
		case !got.IsLinkLocalUnicast():
			if err := nh.AddrDel(tun, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
				return fmt.Errorf("delete stale address %s of %s: %w", got, IP6TunnelLink, err)
			}
		}
	}
	host := prefixNet(netip.PrefixFrom(self, 128))
	if !found {
		a := &netlink.Addr{IPNet: host, Flags: unix.IFA_F_NODAD | unix.IFA_F_NOPREFIXROUTE}
		if err := nh.AddrAdd(tun, a); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("address %s on %s: %w", self, IP6TunnelLink, err)
		}
	}
	// The kernel adds the local route once the address is no longer
	// tentative (a moment after it is added, even without duplicate
	// address detection): wait for it, bounded, when the address is new.
	deadline := time.Now().Add(localRouteWait)
	for {
		routes, err := dump(fmt.Sprintf("local routes of %s", self), func() ([]netlink.Route, error) {
			return nh.RouteListFiltered(unix.AF_INET6, &netlink.Route{Table: unix.RT_TABLE_LOCAL, Dst: host},
				netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST)
		})
		if err != nil {
			return err
		}
		for _, r := range routes {
			if err := nh.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("delete the local table's route to %s (the node's own packets must go round the loop): %w", self, err)
			}
		}
		if len(routes) > 0 || found || time.Now().After(deadline) {
			if len(routes) == 0 && !found {
				return fmt.Errorf("the kernel added no local route for %s on %s within %v (is the address tentative?)", self, IP6TunnelLink, localRouteWait)
			}
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dropTunnel6 takes away what ensureTunnel6 added: the rule and routes of
// IPv6 tunnel addresses (the loop's go with the loop), and IP6TunnelLink
// (its address with it). What is already gone is fine.
func dropTunnel6(nh *netlink.Handle) error {
	if !hasIPv6() {
		return nil
	}
	var errs []error
	if out, err := nh.LinkByName(LoopLink); err == nil {
		errs = append(errs, dropStaleTunnelRoutes(nh, out, unix.AF_INET6, netip.Addr{}))
	} else {
		errs = append(errs, dropStaleTunnelRoutes(nh, nil, unix.AF_INET6, netip.Addr{}))
	}
	errs = append(errs, dropTunnelRule(nh, unix.AF_INET6), deleteLink(nh, IP6TunnelLink, "ip6tnl"))
	return errors.Join(errs...)
}
