package speaker

import "net/netip"

// vipRanges returns the ranges of vip's family among ranges, plus vip
// itself when one of them holds the node's address of that family: the
// node's own connections to a VIP leave from the VIP (the kernel's source
// for a local destination), and kube-proxy lets the node in on that same
// condition.
func vipRanges(vip netip.Addr, ranges []netip.Prefix, node *Node) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ranges)+1)
	self, hasSelf := node.NextHop(vip)
	admitsNode := false
	for _, r := range ranges {
		if r.Addr().Is4() != vip.Is4() {
			continue
		}
		out = append(out, r)
		admitsNode = admitsNode || (hasSelf && r.Contains(self))
	}
	if admitsNode {
		out = append(out, netip.PrefixFrom(vip, vip.BitLen()))
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
