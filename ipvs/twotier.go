package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// chooseIPv6 decides how IPv6 VIPs go with opts: ip6ip6 to IPv6 tunnel
// addresses with Tunnel.Self6. Without, they go 6in4 to the IPv4 ones, and
// the kernel refuses real servers of another family than their virtual
// server while a sync daemon runs (its sync protocol cannot carry their
// connections): then they get the two tiers only with connection sync off.
// setupTunnel may still turn them off (no IPv6 on the node).
func (d *Dataplane) chooseIPv6(opts Options) {
	if !d.tunnel {
		return
	}
	d.ip6ip6 = opts.Tunnel.Self6.IsValid()
	d.tunnel6 = d.ip6ip6 || !opts.ConnSync.on()
	switch {
	case opts.Tunnel.OneTier6 != "":
		d.tunnel6, d.ip6ip6, d.no6 = false, false, errors.New(opts.Tunnel.OneTier6)
	case !d.tunnel6:
		d.no6 = errors.New("connection sync is on, and the kernel does not sync the connections of an IPv6 VIP tunnelled to IPv4 tunnel addresses (give the nodes IPv6 tunnel addresses)")
	}
}

// setupTunnel readies the node and the nftables chains for the two-tier
// dataplane (t nil: takes the chains away).
func (d *Dataplane) setupTunnel(t *Tunnel) error {
	if t == nil {
		return d.nft.removeTunnel()
	}
	no6, err := ensureTunnel(d.nl, *t)
	if err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	if no6 != nil && d.tunnel6 {
		d.tunnel6, d.ip6ip6, d.no6 = false, false, no6
	}
	mss, err := clampFor(tunnelMTU(d.nl, *t), d.ip6ip6)
	if err != nil {
		return fmt.Errorf("two-tier dataplane: fabric %w", err)
	}
	links := [2]string{TunnelLink}
	switch {
	case d.ip6ip6:
		links[1] = IP6TunnelLink
	case d.tunnel6:
		links[1] = Tunnel6Link
	}
	self := [2]netip.Addr{t.Self.Unmap(), t.Self6}
	if err := d.nft.setupTunnel(mss, links, self); err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	return nil
}

// TwoTierIPv6 reports whether IPv6 VIPs go through the two tiers:
// Options.Tunnel with Tunnel.Self6 on a node with IPv6 (ip6ip6 to the
// nodes' IPv6 tunnel addresses), or without Self6 on a node with IPv6 and
// the sit module, connection sync off (6in4 to the IPv4 tunnel addresses).
// Otherwise they keep one tier, and with Options.Tunnel why says why.
func (d *Dataplane) TwoTierIPv6() (on bool, why error) { return d.tunnel6, d.no6 }

// repairTunnelNode puts back the node's side of the two tiers that
// something took away since New (a rule or route deleted by hand; the
// IPv6 tunnel address gone with its link set down, or its route in the
// kernel's local table back): a full Sync's drift repair, as for the
// virtual servers. It works through the Dataplane's rtnetlink handle only,
// in whatever namespace it is called: a loop that is gone needs New again
// (its sysctls are the init container's). Each step reads before it
// writes, so a node as New left it costs reads only.
func (d *Dataplane) repairTunnelNode() error {
	out, err := d.nl.LinkByName(LoopLink)
	if err != nil {
		return fmt.Errorf("the loop %s is gone (%w): restart the speaker to make it again", LoopLink, err)
	}
	in, err := d.nl.LinkByName(LoopPeer)
	if err != nil {
		return fmt.Errorf("the loop's peer %s is gone (%w): restart the speaker to make it again", LoopPeer, err)
	}
	for _, l := range []netlink.Link{out, in} {
		if err := setUp(d.nl, l); err != nil {
			return err
		}
	}
	if err := ensureTunnelAddress(d.nl, d.tunnelCfg.Self, out, in); err != nil {
		return err
	}
	if d.ip6ip6 {
		return ensureTunnel6(d.nl, d.tunnelCfg.Self6, out, in)
	}
	return nil
}

// TunnelRouteProtocol marks the routes SetTunnelRoutes programs (the
// rtnetlink protocol field, "proto 96" in ip route), so that it finds and
// removes its own and no other.
const TunnelRouteProtocol = 96

// SetTunnelRoutes makes the main table's routes to the other nodes'
// tunnel addresses (IPv4, and IPv6 ones: Tunnel.Self6) exactly routes:
// tunnel address to the node address of its family it is reached through (an on-link gateway, such as the node's InternalIP on
// a shared subnet). Routes it programmed before to addresses no longer in
// routes are deleted; any other route is left alone. One route the kernel
// refuses (a gateway not on a connected subnet) does not stop the others:
// the errors name each.
func (d *Dataplane) SetTunnelRoutes(routes map[netip.Addr]netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.tunnel {
		if len(routes) == 0 {
			return nil
		}
		return errors.New("tunnel routes: the two-tier dataplane is off (Options.Tunnel)")
	}
	return d.setTunnelRoutes(routes)
}

// SetTunnelSources makes the addresses the node takes tunnelled packets
// from (IPIP, 6in4, IPv6 tunnels; tunnelguard.go) exactly addrs: every
// node's addresses and tunnel addresses. Until the first call, and while
// addrs is empty, the guard lets every source in.
func (d *Dataplane) SetTunnelSources(addrs []netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.tunnel {
		if len(addrs) == 0 {
			return nil
		}
		return errors.New("tunnel sources: the two-tier dataplane is off (Options.Tunnel)")
	}
	return d.nft.setTunnelSources(addrs)
}

// setTunnelRoutes is SetTunnelRoutes, also with the two-tier dataplane off
// (Teardown: routes nil deletes every route it programmed).
func (d *Dataplane) setTunnelRoutes(routes map[netip.Addr]netip.Addr) error {
	var errs []error
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		have, err := dump("tunnel routes", func() ([]netlink.Route, error) {
			return d.nl.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: TunnelRouteProtocol},
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
			if err := d.nl.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
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
		if err := d.nl.RouteReplace(r); err != nil {
			errs = append(errs, fmt.Errorf("tunnel route %s via %s: %w", dst, gw, err))
		}
	}
	return errors.Join(errs...)
}
