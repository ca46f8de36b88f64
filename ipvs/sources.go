package ipvs

import (
	"net/netip"
	"slices"
)

// Source ranges: a virtual server that admits only some clients
// (spec.loadBalancerSourceRanges).
//
// With ipMode Proxy kube-proxy builds no rule for a VIP, its source-range
// firewall included, so the VIP filter (filter.go) enforces the ranges.
// vipcast's nftables tables hold two more sets:
//
//   - "restricted": VIP . protocol . port, the virtual servers that admit
//     only their ranges (Service.Restricted);
//   - "sources": VIP . protocol . port . source address, an interval set
//     (flags interval, a concatenation ending in a range: the kernel's
//     pipapo set type, Linux 5.6 or later), one element per range of each
//     restricted virtual server.
//
// and one rule, in the input chain before the rule that lets a virtual
// server's port through and before the one that lets established flows
// through:
//
//	ip daddr . meta l4proto . th dport @restricted
//	  ip daddr . meta l4proto . th dport . ip saddr != @sources counter drop
//
// plus the same rule in a chain "output" (type filter, hook output,
// priority -150), for the node's own connections to a VIP: IPVS takes
// those at LOCAL_OUT with priority -99, before they ever reach the input
// hook. Notes:
//
//   - Every packet is checked, not only a flow's first: a range taken out
//     cuts the flows it admitted at once, on every node alike, and a flow
//     that ECMP moves to another node is judged the same there.
//   - The node's own connections to a VIP leave from the VIP itself (the
//     kernel's source for a local destination): the caller lists the VIP
//     as a range when a range holds the node's address (kube-proxy lets
//     the node in on that same condition).
//   - A range change is one nftables transaction (the new ranges and the
//     removal of the old ones together), so no packet sees a half-changed
//     list. A virtual server becomes restricted, with its ranges, before
//     its port is let through, and stops being restricted after its port
//     is closed: it is never open to everyone in between.
//   - ICMP errors about a flow (path MTU discovery) carry no port and are
//     not checked.

// SourceRange is one element of the "sources" set: a client range that a
// restricted virtual server admits.
type SourceRange struct {
	Key   Key
	Range netip.Prefix
}

func (r SourceRange) String() string { return r.Key.String() + " from " + r.Range.String() }

func (r SourceRange) compare(o SourceRange) int {
	if c := r.Key.compare(o.Key); c != 0 {
		return c
	}
	return comparePrefix(r.Range, o.Range)
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// normalizeRanges returns the ranges a virtual server of vip admits,
// unmapped and masked, of vip's family only, sorted, with every range
// that another one holds left out (the kernel refuses overlapping
// elements in an interval set). Unrestricted, there are none.
func normalizeRanges(vip netip.Addr, restricted bool, ranges []netip.Prefix) []netip.Prefix {
	if !restricted || len(ranges) == 0 {
		return nil
	}
	v4 := vip.Unmap().Is4()
	out := make([]netip.Prefix, 0, len(ranges))
	for _, r := range ranges {
		if !r.IsValid() {
			continue
		}
		a := r.Addr()
		bits := r.Bits()
		if a.Is4In6() {
			if bits < 96 {
				continue
			}
			a, bits = a.Unmap(), bits-96
		}
		if a.Is4() != v4 {
			continue
		}
		out = append(out, netip.PrefixFrom(a, bits).Masked())
	}
	// Shorter prefixes first among those at one address, so that a range
	// is only ever held by one that sorts before it.
	slices.SortFunc(out, comparePrefix)
	kept := out[:0]
	for _, r := range out {
		if n := len(kept); n > 0 && kept[n-1].Overlaps(r) {
			// Sorted, the last kept range either holds r or ends
			// before it.
			continue
		}
		kept = append(kept, r)
	}
	if len(kept) == 0 {
		return nil
	}
	return kept
}

// sourceRanges returns the elements of the "sources" set for s
// (normalized): one per range, none unless s is restricted.
func sourceRanges(s Service) []SourceRange {
	if !s.Restricted {
		return nil
	}
	k := s.Key()
	out := make([]SourceRange, 0, len(s.SourceRanges))
	for _, r := range s.SourceRanges {
		out = append(out, SourceRange{Key: k, Range: r})
	}
	return out
}

// lastAddr returns the last address of p (masked).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// sourceElement encodes r as an element of the "sources" set: the key is
// VIP . protocol . port . first address of the range, the key end the same
// with the range's last address (the kernel's concatenated ranges end
// inclusively).
func sourceElement(r SourceRange) setElem {
	e := snatElement(r.Key)
	key := append(slices.Clone(e.key), r.Range.Masked().Addr().AsSlice()...)
	end := append(slices.Clone(e.key), lastAddr(r.Range).AsSlice()...)
	return setElem{v6: e.v6, key: key, keyEnd: end, name: "source range " + r.String()}
}

// parseSourceElement decodes an element of the "sources" set; ok is false
// for one vipcast would not have written (not a prefix).
func parseSourceElement(key, end []byte) (SourceRange, bool) {
	var addrLen int
	switch len(key) {
	case 16:
		addrLen = 4
	case 40:
		addrLen = 16
	default:
		return SourceRange{}, false
	}
	if len(end) != len(key) {
		return SourceRange{}, false
	}
	k, ok := parseSNATElement(key[:len(key)-addrLen])
	if !ok {
		return SourceRange{}, false
	}
	first, ok1 := netip.AddrFromSlice(key[len(key)-addrLen:])
	last, ok2 := netip.AddrFromSlice(end[len(end)-addrLen:])
	if !ok1 || !ok2 {
		return SourceRange{}, false
	}
	for bits := 0; bits <= addrLen*8; bits++ {
		p := netip.PrefixFrom(first, bits)
		if p.Masked().Addr() == first && lastAddr(p) == last {
			return SourceRange{Key: k, Range: p}, true
		}
	}
	return SourceRange{}, false
}

func sourceElems(rs []SourceRange) []setElem {
	out := make([]setElem, len(rs))
	for i, r := range rs {
		out[i] = sourceElement(r)
	}
	return out
}
