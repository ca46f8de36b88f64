package ipam

import (
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strings"
)

// Range is an inclusive span of addresses of one family.
type Range struct {
	First, Last netip.Addr
}

// Family returns the family of the range.
func (r Range) Family() Family { return FamilyOf(r.First) }

// Contains reports whether ip lies in r.
func (r Range) Contains(ip netip.Addr) bool {
	return ip.IsValid() && r.First.Compare(ip) <= 0 && ip.Compare(r.Last) <= 0
}

// Overlaps reports whether r and o share an address.
func (r Range) Overlaps(o Range) bool {
	return r.First.Compare(o.Last) <= 0 && o.First.Compare(r.Last) <= 0
}

// Size returns the number of addresses in r (up to 2^128).
func (r Range) Size() *big.Int {
	n := addrValue(r.Last).sub(addrValue(r.First)).big()
	return n.Add(n, big.NewInt(1))
}

// String returns "first-last", or the CIDR when the range is exactly one.
func (r Range) String() string {
	if p, ok := r.Prefix(); ok {
		return p.String()
	}
	return r.First.String() + "-" + r.Last.String()
}

// Prefix returns the CIDR equal to r, if there is one.
func (r Range) Prefix() (netip.Prefix, bool) {
	for bits := 0; bits <= r.First.BitLen(); bits++ {
		p := netip.PrefixFrom(r.First, bits).Masked()
		if p.Addr() != r.First {
			continue
		}
		if lastOf(p) == r.Last {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// lastOf returns the last address of a masked prefix.
func lastOf(p netip.Prefix) netip.Addr {
	f := FamilyOf(p.Addr())
	hostBits := p.Addr().BitLen() - p.Bits()
	v := addrValue(p.Addr())
	var mask u128
	switch {
	case hostBits >= 128:
		mask = maxU128()
	case hostBits >= 64:
		mask = u128{hi: 1<<(hostBits-64) - 1, lo: ^uint64(0)}
	default:
		mask = u128{lo: 1<<hostBits - 1}
	}
	return valueAddr(u128{hi: v.hi | mask.hi, lo: v.lo | mask.lo}, f)
}

// ParseAddresses validates and parses a pool's address list: CIDRs
// ("192.168.10.0/24", "2001:db8::/64") and inclusive ranges
// ("10.0.0.5-10.0.0.20", "2001:db8::10-2001:db8::ff"). The ranges are
// returned in the order given. Errors are *Error values (ReasonInvalid for a
// malformed entry, ReasonOverlap for entries that overlap each other) whose
// message names the index and the entry and says how to fix it, e.g.
//
//	addresses[1] "10.0.0.9-10.0.0.1": range start is after its end; write the lower address first
func ParseAddresses(addrs []string) ([]Range, error) {
	rs, err := parseAddresses(addrs)
	if err != nil {
		return nil, err
	}
	return rs, nil
}

// parseAddresses is ParseAddresses with a concrete error type.
func parseAddresses(addrs []string) ([]Range, *Error) {
	out := make([]Range, 0, len(addrs))
	for i, entry := range addrs {
		r, why := parseEntry(entry)
		if why != "" {
			return nil, newError(ReasonInvalid, "addresses[%d] %q: %s", i, entry, why)
		}
		out = append(out, r)
	}
	if i, j, ok := findOverlap(out); ok {
		return nil, newError(ReasonOverlap,
			"addresses[%d] %q overlaps addresses[%d] %q; an address may appear only once in a pool, remove or shrink one of them",
			i, addrs[i], j, addrs[j])
	}
	return out, nil
}

// findOverlap returns the indexes i<j of two overlapping ranges, if any.
func findOverlap(rs []Range) (int, int, bool) {
	order := make([]int, len(rs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return rs[a].First.Compare(rs[b].First) })
	for k := 1; k < len(order); k++ {
		a, b := order[k-1], order[k]
		if rs[a].Overlaps(rs[b]) {
			return min(a, b), max(a, b), true
		}
	}
	return 0, 0, false
}

// parseEntry parses one address entry; on failure it returns a reason that
// says how to fix the entry.
func parseEntry(entry string) (Range, string) {
	s := strings.TrimSpace(entry)
	if s == "" {
		return Range{}, `empty entry; write a CIDR such as "192.168.10.0/24" or a range such as "10.0.0.5-10.0.0.20"`
	}
	if first, last, isRange := strings.Cut(s, "-"); isRange {
		return parseRange(strings.TrimSpace(first), strings.TrimSpace(last))
	}
	if strings.Contains(s, "/") {
		return parseCIDR(s)
	}
	if ip, err := netip.ParseAddr(s); err == nil {
		return Range{}, fmt.Sprintf("a single address is neither a CIDR nor a range; write %q or %q",
			netip.PrefixFrom(ip, ip.BitLen()).String(), s+"-"+s)
	}
	return Range{}, `not a CIDR or an address range; write a CIDR such as "192.168.10.0/24" or a range such as "10.0.0.5-10.0.0.20"`
}

func parseCIDR(s string) (Range, string) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return Range{}, fmt.Sprintf(`not a valid CIDR (%v); write it as address/prefix-length, e.g. "192.168.10.0/24" or "2001:db8::/64"`, err)
	}
	if why := checkAddr(p.Addr()); why != "" {
		return Range{}, why
	}
	if m := p.Masked(); m != p {
		first := p.Addr()
		return Range{}, fmt.Sprintf("host bits are set after the /%d prefix; write %q, or the range %q to start at %s",
			p.Bits(), m.String(), first.String()+"-"+lastOf(m).String(), first)
	}
	return Range{First: p.Addr(), Last: lastOf(p)}, ""
}

func parseRange(a, b string) (Range, string) {
	if strings.Contains(b, "-") {
		return Range{}, `more than one "-"; write a range as "first-last", e.g. "10.0.0.5-10.0.0.20"`
	}
	first, err := netip.ParseAddr(a)
	if err != nil {
		return Range{}, fmt.Sprintf(`range start %q is not an IP address; write a range as "first-last", e.g. "10.0.0.5-10.0.0.20"`, a)
	}
	last, err := netip.ParseAddr(b)
	if err != nil {
		return Range{}, fmt.Sprintf(`range end %q is not an IP address; write a range as "first-last", e.g. "10.0.0.5-10.0.0.20"`, b)
	}
	if why := checkAddr(first); why != "" {
		return Range{}, why
	}
	if why := checkAddr(last); why != "" {
		return Range{}, why
	}
	if FamilyOf(first) != FamilyOf(last) {
		return Range{}, fmt.Sprintf("range mixes %s and %s; both ends must be of the same family, use one entry per family",
			FamilyOf(first), FamilyOf(last))
	}
	if last.Less(first) {
		return Range{}, "range start is after its end; write the lower address first"
	}
	return Range{First: first, Last: last}, ""
}

// checkAddr rejects address forms that cannot be pool members.
func checkAddr(ip netip.Addr) string {
	if ip.Zone() != "" {
		return fmt.Sprintf("address %s has a zone; pool addresses cannot be scoped, remove %q", ip, "%"+ip.Zone())
	}
	if ip.Is4In6() {
		return fmt.Sprintf("%s is an IPv4-mapped IPv6 address; write it as the plain IPv4 address %s", ip, ip.Unmap())
	}
	return ""
}
