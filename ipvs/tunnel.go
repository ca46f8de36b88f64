package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The two-tier dataplane (Options.Tunnel): established flows survive a
// change of the node the fabric's ECMP sends them to, and the endpoint
// sees the client's own address. The design record
// docs/dev/design/two-tier.md gives the design and its measurements; in
// short:
//
//   - Tier 1, on every node, for packets from the fabric: each virtual
//     server's real servers are the tunnel addresses of the nodes that
//     host its endpoints (Backend.Tunnel), weighted by their endpoint
//     counts, scheduled by mh, so every node picks the same node for a
//     flow; net.ipv4.vs.sloppy_tcp and sloppy_sctp make IPVS schedule the
//     middle of a flow like its first packet, so the node ECMP moves a
//     flow to sends it on to the same node. The fabric's packets to a VIP
//     are not tracked by conntrack (chain tunnel-raw).
//   - Tier 2, on the chosen node, for what the tunnel (tunl0) delivers: an
//     nftables DNAT to one of the node's own endpoints (Service.Local,
//     tier2.go). Replies leave that node with the VIP as source.
//   - A node that picks itself: IPVS delivers a tunnel-mode real server
//     that is a local address without encapsulating it, and the packet
//     would reach no socket. So a node's tunnel address is local only in a
//     routing table of its own (TunnelTable), which a rule consults for
//     packets that come in on an interface ("not iif lo"); the node's own
//     packets to it are routed out of the veth LoopLink and come back in on
//     its peer, to be decapsulated like any other node's.
//   - The tunnel adds 20 bytes to every packet from the fabric: the pod's
//     SYN-ACK to a client of a VIP offers at most MTU-60 (chain
//     tunnel-mss), MTU-80 for an IPv6 VIP, so that the client's segments
//     fit.
//   - IPv6 VIPs, with Tunnel.Self6, go to the nodes' IPv6 tunnel addresses
//     (ip6ip6), decapsulated by IP6TunnelLink, an ip6tnl link local to
//     Self6; the same loop, table and rule serve Self6 (tunnel6.go).
//     Without Self6 they go to the IPv4 tunnel addresses: IPVS sends an
//     IPv6 packet to an IPv4 tunnel-mode real server in IPv4 (protocol 41,
//     6in4), which the kernel's sit0 decapsulates on the chosen node. The
//     kernel syncs ip6ip6 connections, not 6in4 ones. Either way tier 2 is
//     the same DNAT in table ip6 vipcast. A node without IPv6 (no
//     /proc/sys/net/ipv6) runs the two tiers for IPv4 only.
//
// Reaching the other nodes' tunnel addresses is the network's job (routes
// through the fabric, or the speaker's); this package programs the node's
// own side only.

// Tunnel configures the two-tier dataplane.
type Tunnel struct {
	// Self is this node's tunnel address: an IPv4 address of no interface,
	// distinct per node, that the other nodes' tier 1 sends to by IPIP.
	Self netip.Addr
	// Self6, when valid, is this node's IPv6 tunnel address: an IPv6
	// address distinct per node, that the other nodes' tier 1 sends IPv6
	// VIPs' packets to in IPv6 (ip6ip6), which connection sync carries.
	// Invalid (the zero Addr): IPv6 VIPs go 6in4 to Self, with connection
	// sync off only.
	Self6 netip.Addr
	// OneTier6, when not empty, keeps IPv6 VIPs on one tier and says why
	// (TwoTierIPv6): a node without IPv6 tunnel address while the other
	// nodes have theirs, which 6in4 to this node's Self cannot reach.
	OneTier6 string
	// MTU is the fabric's MTU, for the MSS clamp; 0 is the MTU of the link
	// that holds the node's default route (1500 when there is none).
	MTU int
}

// Names and numbers the two-tier dataplane uses on the node.
const (
	// TunnelLink is the kernel's IPIP fallback device, which exists in
	// every network namespace once the ipip module is loaded and
	// decapsulates IPIP packets addressed to a local address.
	TunnelLink = "tunl0"
	// Tunnel6Link is the kernel's 6in4 fallback device (module sit): the
	// same for IPv6 packets in IPv4, those of IPv6 VIPs.
	Tunnel6Link = "sit0"
	// LoopLink and its peer LoopPeer are the veth pair a node's packets
	// to its own tunnel address go round.
	LoopLink = "vcloop0"
	LoopPeer = "vcloop1"
	// TunnelTable is the routing table where the node's tunnel address is
	// local; TunnelRulePriority the priority of the rule that looks it up
	// for packets from an interface.
	TunnelTable        = 5200
	TunnelRulePriority = 5200
	// tunnelOverhead is what IPIP adds to a packet: an IPv4 header;
	// tunnel6Overhead what ip6ip6 adds: an IPv6 header (IPVS adds no
	// encapsulation limit option).
	tunnelOverhead  = 20
	tunnel6Overhead = 40
)

// clampFor is the largest TCP segment that fits a link of MTU mtu inside
// the tunnel, for IPv4 VIPs and for IPv6 VIPs: mtu less the outer header
// (IPv4; IPv6 for IPv6 VIPs with ip6ip6), the inner IPv4 or IPv6 header
// and the TCP header.
func clampFor(mtu int, ip6ip6 bool) ([2]uint16, error) {
	if mtu < 576 || mtu > 65535 {
		return [2]uint16{}, fmt.Errorf("MTU %d out of 576..65535", mtu)
	}
	outer6 := tunnelOverhead
	if ip6ip6 {
		outer6 = tunnel6Overhead
	}
	//nolint:gosec // checked above
	return [2]uint16{uint16(mtu - tunnelOverhead - 20 - 20), uint16(mtu - outer6 - 40 - 20)}, nil
}

// check validates t.
func (t Tunnel) check() error {
	if !t.Self.IsValid() || !t.Self.Unmap().Is4() || t.Self.IsUnspecified() || t.Self.IsLoopback() || t.Self.IsMulticast() {
		return fmt.Errorf("tunnel address %v: want a unicast IPv4 address", t.Self)
	}
	if s := t.Self6; s.IsValid() && (!s.Is6() || s.Is4In6() || s.IsUnspecified() || s.IsLoopback() || s.IsMulticast() || s.IsLinkLocalUnicast()) {
		return fmt.Errorf("IPv6 tunnel address %v: want a global or unique local IPv6 address", s)
	}
	if t.MTU != 0 {
		if _, err := clampFor(t.MTU, false); err != nil {
			return fmt.Errorf("fabric %w", err)
		}
	}
	return nil
}

// tunnelMTU is t.MTU, or the MTU of the default route's link.
func tunnelMTU(nh *netlink.Handle, t Tunnel) int {
	if t.MTU != 0 {
		return t.MTU
	}
	routes, err := dump("routes of the main table", func() ([]netlink.Route, error) {
		return nh.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	})
	if err == nil {
		for _, r := range routes {
			if r.Dst != nil && !isDefault(r.Dst) {
				continue
			}
			if l, err := nh.LinkByIndex(r.LinkIndex); err == nil && l.Attrs().MTU > 0 {
				return l.Attrs().MTU
			}
		}
	}
	return 1500
}

func isDefault(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0
}

// PrepareTunnel does the part of readying a node for the two-tier
// dataplane that needs privilege: it loads the ipip module (tunl0
// appears) and, on a node with IPv6, the sit and ip6_tunnel modules (sit0,
// ip6tnl0), creates the loop, and sets the sysctls (sloppy_tcp and
// sloppy_sctp, drop_entry, accept_local and IPv6 on the loop, reverse-path filtering
// off on tunl0 and the loop). It is the work of the chart's privileged init
// container (vipcast-speaker prepare-node --tunnel); a speaker without
// write access to /proc/sys then finds the sysctls set. New with
// Options.Tunnel does the same, skipping what is already so, and adds
// what depends on the node's tunnel address.
//
// An error err stops the two tiers; no6 only says why IPv6 VIPs will keep
// one tier (no IPv6 on the node, no sit module).
func PrepareTunnel() (no6, err error) {
	nh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("rtnetlink: %w", err)
	}
	defer nh.Close()
	p, err := prepareTunnel(nh)
	return p.no6, err
}

// prepared is what prepareTunnel readied: the loop's two ends, and why
// IPv6 VIPs cannot have the two tiers (nil: they can).
type prepared struct {
	out, in netlink.Link
	no6     error
}

// prepareTunnel is PrepareTunnel with a handle.
func prepareTunnel(nh *netlink.Handle) (p prepared, err error) {
	tunl, err := tunnelLink(nh)
	if err != nil {
		return p, err
	}
	if err := setUp(nh, tunl); err != nil {
		return p, err
	}
	p.no6 = prepareSit(nh)
	if p.out, p.in, err = ensureLoop(nh); err != nil {
		return p, err
	}
	if hasIPv6() {
		// For IPv6 tunnel addresses (Tunnel.Self6, tunnel6.go): IPv6 on
		// the loop, and the ip6_tunnel module. Without it a Dataplane
		// with Self6 fails to make its link and says so; 6in4 and IPv4 do
		// not need it.
		for _, l := range []string{LoopLink, LoopPeer} {
			if err := setSysctl("net/ipv6/conf/"+l+"/disable_ipv6", "0"); err != nil {
				return p, err
			}
		}
		_, _ = fallbackLink(nh, &netlink.Ip6tnl{LinkAttrs: netlink.LinkAttrs{Name: "vcip6-probe"}}, "ip6tnl0", "ip6_tunnel")
	}
	for _, s := range []struct{ name, value string }{
		{"net/ipv4/vs/sloppy_tcp", "1"},
		{"net/ipv4/vs/sloppy_sctp", "1"},
		// sloppy_tcp lets a lone ACK, spoofed or not, create an entry in
		// state ESTABLISHED (15 minutes), which connection sync copies to
		// every node. drop_entry in its automatic mode: while the node's
		// available memory is below net.ipv4.vs.amemthresh (1,024 pages
		// unless set), IPVS drops, a thirty-second of the table each
		// second, the entries older than a minute that carried few
		// packets, a lone ACK's first.
		{"net/ipv4/vs/drop_entry", "1"},
		// The loop's packets come from one of the node's own addresses.
		{"net/ipv4/conf/" + LoopPeer + "/accept_local", "1"},
		// So do the answers another node's tier 2 sends a pod of this
		// node, which reached a VIP through this node's tier 1: they come
		// from the VIP, which is this node's too, on whichever link the
		// pod network uses. The two-tier raw chains (nfttunnel.go) drop
		// every other packet from outside with a source of this node's.
		{"net/ipv4/conf/all/accept_local", "1"},
	} {
		if err := setSysctl(s.name, s.value); err != nil {
			return p, err
		}
	}
	if err := exemptFromRPFilter(LoopPeer, TunnelLink); err != nil {
		return p, err
	}
	return p, nil
}

// prepareSit readies sit0 for IPv6 VIPs, and returns why it cannot: no
// IPv6 on the node, or no sit module.
func prepareSit(nh *netlink.Handle) error {
	if !hasIPv6() {
		return errors.New("the node has no IPv6 (/proc/sys/net/ipv6)")
	}
	sit, err := fallbackLink(nh, &netlink.Sittun{LinkAttrs: netlink.LinkAttrs{Name: "vcsit-probe"}}, Tunnel6Link, "sit")
	if err != nil {
		return err
	}
	return setUp(nh, sit)
}

// tunnelLink returns tunl0, loading the ipip module when it is missing.
func tunnelLink(nh *netlink.Handle) (netlink.Link, error) {
	return fallbackLink(nh, &netlink.Iptun{LinkAttrs: netlink.LinkAttrs{Name: "vcipip-probe"}}, TunnelLink, "ipip")
}

// fallbackLink returns the tunnel module's fallback device name, loading
// module when it is missing: the kernel loads it itself (request_module
// of rtnl-link-<kind>, run by the host's modprobe) when asked for a link
// of that kind, such as probe, so neither modprobe nor /lib/modules is
// needed in the container. The probe link is deleted at once.
func fallbackLink(nh *netlink.Handle, probe netlink.Link, name, module string) (netlink.Link, error) {
	if l, err := nh.LinkByName(name); err == nil {
		return l, nil
	}
	if err := nh.LinkAdd(probe); err == nil {
		if l, err := nh.LinkByName(probe.Attrs().Name); err == nil {
			_ = nh.LinkDel(l)
		}
	}
	l, err := nh.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("link %s: %w (it appears when the %s module is loaded: run vipcast-speaker %s --tunnel privileged, or put %s in /etc/modules-load.d)", name, err, module, PrepareNodeCommand, module)
	}
	return l, nil
}

// hasIPv6 reports whether the kernel runs IPv6 (it has no /proc/sys/net/ipv6
// when booted with ipv6.disable=1).
func hasIPv6() bool {
	_, err := os.Stat("/proc/sys/net/ipv6")
	return err == nil
}

// ensureLoop creates the veth pair LoopLink/LoopPeer when missing and sets
// its peer end up.
func ensureLoop(nh *netlink.Handle) (out, in netlink.Link, err error) {
	out, in, err = ensureVethPair(nh, LoopLink, LoopPeer)
	if err != nil {
		return nil, nil, fmt.Errorf("loop: %w", err)
	}
	return out, in, nil
}
