package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
)

// A Dataplane forwards with one tier or with two. One tier: IPVS sends a
// flow to an endpoint. Two (Options.Tunnel, tunnel.go): tier 1, IPVS on
// every node, sends it to a node by a tunnel, and tier 2 there, the
// tier-2 slot map, to one of that node's endpoints. New picks one; Sync,
// SyncService and Apply call it without asking which.

// tiers is what differs between one tier and two: the node's side of the
// tunnels, what a virtual server may ask for, and the socket for the
// real-server commands that only the two tiers send.
type tiers interface {
	// setup readies the node and vipcast's nftables tables.
	setup(nh *netlink.Handle, nft *nftTables) error
	// families reports which address families (IPv4, IPv6) go through
	// the two tiers; setup may have turned IPv6 off.
	families() [2]bool
	// check refuses a virtual server these tiers cannot program.
	check(svc Service) error
	// repair puts back the node's side of the tiers that something took
	// away since setup: a full Sync's drift repair.
	repair(nh *netlink.Handle) error
	// ipv6 is TwoTierIPv6.
	ipv6() (on bool, why error)
	// connSyncFailed records that the sync daemons asked for did not
	// start.
	connSyncFailed()
	// setRoutes is SetTunnelRoutes, setSources SetTunnelSources.
	setRoutes(nh *netlink.Handle, routes map[netip.Addr]netip.Addr) error
	setSources(nft *nftTables, addrs []netip.Addr) error
	// genl is the generic netlink socket for the real servers moby/ipvs
	// cannot program (mixeddest.go, again.go): nil with one tier, which
	// has none.
	genl() *genlConn
	// close releases what the tiers opened.
	close()
}

// newTiers returns the tiers of opts: two with Options.Tunnel, else one.
func newTiers(opts Options) (tiers, error) {
	if opts.Tunnel == nil {
		return oneTier{}, nil
	}
	t, err := newTwoTiers(*opts.Tunnel, opts.ConnSync.on())
	if err != nil {
		return nil, fmt.Errorf("two-tier dataplane: %w", err)
	}
	return t, nil
}

// oneTier is the one-tier dataplane: IPVS forwards to the endpoints, and
// the node has no tunnel.
type oneTier struct{}

// setup takes away the two-tier chains a previous run with two tiers
// left.
func (oneTier) setup(_ *netlink.Handle, nft *nftTables) error { return nft.removeTunnel() }

func (oneTier) families() [2]bool { return [2]bool{} }

func (oneTier) check(svc Service) error {
	switch {
	case len(svc.Local) > 0:
		return fmt.Errorf("virtual server %s: local endpoints are for the two-tier dataplane, which is off (Options.Tunnel)", svc.Key())
	case tunnelled(svc.Backends):
		return fmt.Errorf("virtual server %s: tunnel real servers are for the two-tier dataplane, which is off (Options.Tunnel)", svc.Key())
	}
	return nil
}

func (oneTier) repair(*netlink.Handle) error { return nil }

func (oneTier) ipv6() (bool, error) { return false, nil }

func (oneTier) connSyncFailed() {}

func (oneTier) setRoutes(_ *netlink.Handle, routes map[netip.Addr]netip.Addr) error {
	if len(routes) == 0 {
		return nil
	}
	return errors.New("tunnel routes: the two-tier dataplane is off (Options.Tunnel)")
}

func (oneTier) setSources(_ *nftTables, addrs []netip.Addr) error {
	if len(addrs) == 0 {
		return nil
	}
	return errors.New("tunnel sources: the two-tier dataplane is off (Options.Tunnel)")
}

func (oneTier) genl() *genlConn { return nil }

func (oneTier) close() {}

// twoTiers is the two-tier dataplane of Options.Tunnel.
type twoTiers struct {
	cfg Tunnel
	// v6 is on when the two tiers also serve IPv6 VIPs: ip6ip6 to IPv6
	// tunnel addresses (Tunnel.Self6, tunnel6.go), or 6in4 to the IPv4
	// ones without connection sync (on a node with IPv6 and sit0); ip6ip6
	// when they go to IPv6 tunnel addresses. no6 says why IPv6 VIPs keep
	// one tier.
	v6, ip6ip6 bool
	no6        error
	// conn is the generic netlink socket of genl.
	conn *genlConn
}

// newTwoTiers decides how IPv6 VIPs go with t: ip6ip6 to IPv6 tunnel
// addresses with Tunnel.Self6. Without, they go 6in4 to the IPv4 ones,
// and the kernel refuses real servers of another family than their
// virtual server while a sync daemon runs (its sync protocol cannot carry
// their connections): then they get the two tiers only with connection
// sync off (connSync false). setup may still turn them off (no IPv6 on
// the node). It opens the generic netlink socket.
func newTwoTiers(t Tunnel, connSync bool) (*twoTiers, error) {
	tt := &twoTiers{cfg: t, ip6ip6: t.Self6.IsValid()}
	tt.v6 = tt.ip6ip6 || !connSync
	switch {
	case t.OneTier6 != "":
		tt.v6, tt.ip6ip6, tt.no6 = false, false, errors.New(t.OneTier6)
	case !tt.v6:
		tt.no6 = errors.New("connection sync is on, and the kernel does not sync the connections of an IPv6 VIP tunnelled to IPv4 tunnel addresses (give the nodes IPv6 tunnel addresses)")
	}
	var err error
	if tt.conn, err = openGenl(); err != nil {
		return nil, err
	}
	return tt, nil
}

// setup readies the node and the nftables chains for the two tiers.
func (t *twoTiers) setup(nh *netlink.Handle, nft *nftTables) error {
	no6, err := ensureTunnel(nh, t.cfg)
	if err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	if no6 != nil && t.v6 {
		t.v6, t.ip6ip6, t.no6 = false, false, no6
	}
	mss, err := clampFor(tunnelMTU(nh, t.cfg), t.ip6ip6)
	if err != nil {
		return fmt.Errorf("two-tier dataplane: fabric %w", err)
	}
	links := [2]string{TunnelLink}
	switch {
	case t.ip6ip6:
		links[1] = IP6TunnelLink
	case t.v6:
		links[1] = Tunnel6Link
	}
	self := [2]netip.Addr{t.cfg.Self.Unmap(), t.cfg.Self6}
	if err := nft.setupTunnel(mss, links, self); err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	return nil
}

func (t *twoTiers) families() [2]bool { return [2]bool{true, t.v6} }

func (t *twoTiers) check(svc Service) error {
	v4 := svc.VIP.Unmap().Is4()
	switch {
	case svc.SNAT && (v4 || t.v6):
		return fmt.Errorf("virtual server %s: source NAT wanted, but the two-tier dataplane keeps the client's address and does not use it", svc.Key())
	case !v4 && !t.v6 && (len(svc.Local) > 0 || tunnelled(svc.Backends)):
		return fmt.Errorf("virtual server %s: IPv6 VIPs keep one tier on this node: %w", svc.Key(), t.no6)
	case t.v6 && !v4 && slices.ContainsFunc(svc.Backends, func(b Backend) bool { return b.Tunnel && b.Addr.Unmap().Is4() == t.ip6ip6 }):
		want := "IPv4 tunnel addresses (6in4): this node has no IPv6 tunnel address"
		if t.ip6ip6 {
			want = "IPv6 tunnel addresses (ip6ip6), as this node's is"
		}
		return fmt.Errorf("virtual server %s: an IPv6 VIP's tunnel real servers must be %s", svc.Key(), want)
	}
	return nil
}

// repair puts back the node's side of the two tiers that something took
// away since New (a rule or route deleted by hand; the IPv6 tunnel
// address gone with its link set down, or its route in the kernel's local
// table back): a full Sync's drift repair, as for the virtual servers. It
// works through the Dataplane's rtnetlink handle only, in whatever
// namespace it is called: a loop that is gone needs New again (its
// sysctls are the init container's). Each step reads before it writes, so
// a node as New left it costs reads only.
func (t *twoTiers) repair(nh *netlink.Handle) error {
	out, err := nh.LinkByName(LoopLink)
	if err != nil {
		return fmt.Errorf("the loop %s is gone (%w): restart the speaker to make it again", LoopLink, err)
	}
	in, err := nh.LinkByName(LoopPeer)
	if err != nil {
		return fmt.Errorf("the loop's peer %s is gone (%w): restart the speaker to make it again", LoopPeer, err)
	}
	for _, l := range []netlink.Link{out, in} {
		if err := setUp(nh, l); err != nil {
			return err
		}
	}
	if err := ensureTunnelAddress(nh, t.cfg.Self, out, in); err != nil {
		return err
	}
	if t.ip6ip6 {
		return ensureTunnel6(nh, t.cfg.Self6, out, in)
	}
	return nil
}

func (t *twoTiers) ipv6() (bool, error) { return t.v6, t.no6 }

// connSyncFailed says why IPv6 VIPs stay on one tier when they go 6in4:
// the chains were set up for connection sync.
func (t *twoTiers) connSyncFailed() {
	if !t.ip6ip6 {
		t.no6 = errors.New("connection sync was asked for (its daemons did not start: see the sync problem), and the kernel does not sync the connections of an IPv6 VIP tunnelled to IPv4 tunnel addresses")
	}
}

func (t *twoTiers) setRoutes(nh *netlink.Handle, routes map[netip.Addr]netip.Addr) error {
	return setTunnelRoutes(nh, routes)
}

func (t *twoTiers) setSources(nft *nftTables, addrs []netip.Addr) error {
	return nft.setTunnelSources(addrs)
}

func (t *twoTiers) genl() *genlConn { return t.conn }

func (t *twoTiers) close() { t.conn.close() }

// TwoTierIPv6 reports whether IPv6 VIPs go through the two tiers:
// Options.Tunnel with Tunnel.Self6 on a node with IPv6 (ip6ip6 to the
// nodes' IPv6 tunnel addresses), or without Self6 on a node with IPv6 and
// the sit module, connection sync off (6in4 to the IPv4 tunnel addresses).
// Otherwise they keep one tier, and with Options.Tunnel why says why.
func (d *Dataplane) TwoTierIPv6() (on bool, why error) { return d.tiers.ipv6() }

// SetTunnelRoutes makes the main table's routes to the other nodes'
// tunnel addresses (IPv4, and IPv6 ones: Tunnel.Self6) exactly routes:
// tunnel address to the node address of its family it is reached through (an on-link gateway, such as the node's InternalIP on
// a shared subnet). Routes it programmed before to addresses no longer in
// routes are deleted; any other route is left alone. One route the kernel
// refuses (a gateway not on a connected subnet) does not stop the others:
// the errors name each. With one tier it takes no route.
func (d *Dataplane) SetTunnelRoutes(routes map[netip.Addr]netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tiers.setRoutes(d.nl, routes)
}

// SetTunnelSources makes the addresses the node takes tunnelled packets
// from (IPIP, 6in4, IPv6 tunnels; tunnelguard.go) exactly addrs: every
// node's addresses and tunnel addresses. Until the first call, and while
// addrs is empty, the guard lets every source in. With one tier it takes
// no address.
func (d *Dataplane) SetTunnelSources(addrs []netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tiers.setSources(d.nft, addrs)
}
