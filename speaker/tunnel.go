package speaker

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
)

// Tunnel addresses of the two-tier dataplane (ipvs.Tunnel).
//
// Every node needs one, and every speaker must know every node's, with
// nothing to allocate or store: a node's tunnel address is the tunnel
// prefix (--tunnel-prefix) with the host bits of the node's IPv4 address
// (the first InternalIP, as announced next hops are chosen). With prefix
// 100.127.0.0/16, node 10.0.0.11 gets 100.127.0.11. Nodes whose IPv4
// addresses differ only outside those bits would get the same address:
// neither gets one, and the speakers say so. A prefix at least as long as
// the nodes' subnet avoids that. An IPv6 tunnel prefix (the second of
// --tunnel-prefix, for IPv6 VIPs) gives IPv6 tunnel addresses the same way
// from the nodes' IPv6 addresses: fd00:7f::/64 and node fd00:10::11 give
// fd00:7f::11.

// TunnelAddress returns the tunnel address of a node whose address of
// prefix's family is node: prefix's address with node's host bits below
// prefix's length.
func TunnelAddress(prefix netip.Prefix, node netip.Addr) (netip.Addr, error) {
	if !prefix.IsValid() || prefix.Addr().Is4In6() {
		return netip.Addr{}, fmt.Errorf("tunnel prefix %v: want an IPv4 or IPv6 prefix", prefix)
	}
	node = node.Unmap()
	if !node.IsValid() || node.Is4() != prefix.Addr().Is4() {
		return netip.Addr{}, fmt.Errorf("node address %v: want %s", node, familyName(prefix.Addr()))
	}
	p, n := prefix.Masked().Addr().As16(), node.As16()
	bits := prefix.Bits()
	if prefix.Addr().Is4() {
		bits += 96 // in As16's IPv4-mapped form
	}
	var out [16]byte
	for i := range out {
		// The mask of byte i's bits that belong to the prefix.
		keep := byte(0)
		if b := bits - 8*i; b >= 8 {
			keep = 0xff
		} else if b > 0 {
			keep = byte(0xff << (8 - b))
		}
		out[i] = p[i]&keep | n[i]&^keep
	}
	a := netip.AddrFrom16(out).Unmap()
	if a == prefix.Masked().Addr() {
		return netip.Addr{}, fmt.Errorf("node address %s: its host bits below /%d are all zero, which gives the prefix's own address", node, prefix.Bits())
	}
	return a, nil
}

// Tunnels returns every node's tunnel address by node name, from the
// nodes' addresses of prefix's family by name. A node without one, or whose
// tunnel address another node would have too, gets none; problems say
// which and why, in node order.
func Tunnels(prefix netip.Prefix, nodes map[string]netip.Addr) (map[string]netip.Addr, []string) {
	out := make(map[string]netip.Addr, len(nodes))
	byAddr := map[netip.Addr][]string{}
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(nodes)) {
		a, err := TunnelAddress(prefix, nodes[name])
		if err != nil {
			problems = append(problems, fmt.Sprintf("node %s has no tunnel address: %v", name, err))
			continue
		}
		byAddr[a] = append(byAddr[a], name)
		out[name] = a
	}
	for _, a := range slices.SortedFunc(maps.Keys(byAddr), netip.Addr.Compare) {
		if names := byAddr[a]; len(names) > 1 {
			for _, name := range names {
				delete(out, name)
			}
			problems = append(problems, fmt.Sprintf("nodes %v would share tunnel address %s under prefix %s: none of them gets one (use a prefix at least as long as the nodes' subnet)", names, a, prefix))
		}
	}
	return out, problems
}
