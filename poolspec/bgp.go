package poolspec

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ipam"
)

// LargeCommunity is a decoded RFC 8092 large community.
type LargeCommunity struct {
	Global, Local1, Local2 uint32
}

// BGP is an admitted pool's spec.bgp, decoded.
type BGP struct {
	// Communities are spec.bgp.communities, sorted, without duplicates.
	Communities []uint32
	// LargeCommunities are spec.bgp.largeCommunities, sorted, without
	// duplicates.
	LargeCommunities []LargeCommunity
	// LocalPref is spec.bgp.localPref (nil when unset).
	LocalPref *uint32
	// AggregationLength and AggregationLengthV6 are the announced prefix
	// lengths of the pool's IPv4 and IPv6 addresses under
	// externalTrafficPolicy Cluster, defaults applied.
	AggregationLength, AggregationLengthV6 int
	// PeerSelector is spec.bgp.peerSelector parsed; nil when unset (every
	// peer).
	PeerSelector labels.Selector
	// NodeSelector is spec.bgp.nodeSelector parsed; nil when unset (every
	// node).
	NodeSelector labels.Selector
}

// problem is why a pool's spec.bgp cannot be announced: a condition reason
// (v1alpha1.ReasonInvalidAddresses, ReasonInvalidConfig or
// ReasonInvalidSelector) and a message that names the field and the fix.
type problem struct {
	reason  string
	message string
}

// parseAll parses the items of list that parse, sorted by compare and
// without duplicates; bad is the index of the first item that does not
// parse (-1 when every one does).
func parseAll[T comparable](list []string, parse func(string) (T, bool), compare func(a, b T) int) (out []T, bad int) {
	bad = -1
	for i, item := range list {
		v, ok := parse(item)
		if !ok {
			if bad < 0 {
				bad = i
			}
			continue
		}
		out = append(out, v)
	}
	slices.SortFunc(out, compare)
	return slices.Compact(out), bad
}

// decodeBGP decodes b (nil: the pool's defaults) for a pool of the given
// ranges, or returns its first problem, in the order aggregation lengths,
// communities, large communities, peerSelector, nodeSelector.
func decodeBGP(b *v1alpha1.IPPoolBGP, ranges []ipam.Range) (BGP, *problem) {
	out := BGP{
		AggregationLength:   int(b.AggregationLengthOrDefault()),
		AggregationLengthV6: int(b.AggregationLengthV6OrDefault()),
	}
	if msg := checkAggregation(ranges, out.AggregationLength, out.AggregationLengthV6); msg != "" {
		return BGP{}, &problem{v1alpha1.ReasonInvalidAddresses, msg}
	}
	if b == nil {
		return out, nil
	}
	var bad int
	if out.Communities, bad = parseAll(b.Communities, parseCommunity, cmp.Compare[uint32]); bad >= 0 {
		return BGP{}, &problem{v1alpha1.ReasonInvalidConfig, fmt.Sprintf("spec.bgp.communities[%d] %q is not a community: write ASN:VALUE with both parts 0-65535 (e.g. 64512:100) or a well-known name such as no-export", bad, b.Communities[bad])}
	}
	if out.LargeCommunities, bad = parseAll(b.LargeCommunities, parseLargeCommunity, compareLarge); bad >= 0 {
		return BGP{}, &problem{v1alpha1.ReasonInvalidConfig, fmt.Sprintf("spec.bgp.largeCommunities[%d] %q is not a large community: write GLOBAL:LOCAL1:LOCAL2 with each part 0-4294967295 (e.g. 4200000000:1:2)", bad, b.LargeCommunities[bad])}
	}
	if b.LocalPref != nil {
		lp := *b.LocalPref
		out.LocalPref = &lp
	}
	var msg string
	if out.PeerSelector, msg = selector("spec.bgp.peerSelector", b.PeerSelector); msg != "" {
		return BGP{}, &problem{v1alpha1.ReasonInvalidSelector, msg}
	}
	if out.NodeSelector, msg = selector("spec.bgp.nodeSelector", b.NodeSelector); msg != "" {
		return BGP{}, &problem{v1alpha1.ReasonInvalidSelector, msg}
	}
	return out, nil
}

func compareLarge(a, b LargeCommunity) int {
	return cmp.Or(cmp.Compare(a.Global, b.Global), cmp.Compare(a.Local1, b.Local1), cmp.Compare(a.Local2, b.Local2))
}

// checkAggregation rejects aggregation lengths out of range, or that would
// announce a prefix covering addresses outside the pool: for each range,
// the aggregate blocks holding its first and last addresses must lie inside
// the pool (the blocks in between lie inside the range itself). For CIDR
// entries this is the API server's own rule; for first-last ranges it
// catches, e.g., 192.0.2.10-192.0.2.20 with aggregationLength 24.
func checkAggregation(ranges []ipam.Range, agg4, agg6 int) string {
	merged := mergeRanges(ranges)
	for _, fam := range []struct {
		field string
		bits  int
		agg   int
	}{{"aggregationLength", 32, agg4}, {"aggregationLengthV6", 128, agg6}} {
		if fam.agg < 0 || fam.agg > fam.bits {
			return fmt.Sprintf("spec.bgp.%s %d is out of range: use 0 to %d", fam.field, fam.agg, fam.bits)
		}
		fits := func(length int) (ipam.Range, netip.Prefix, bool) {
			for _, r := range ranges {
				if r.First.BitLen() != fam.bits {
					continue
				}
				for _, ip := range []netip.Addr{r.First, r.Last} {
					if b := blockOf(ip, length); !covered(merged, b) {
						return r, b, false
					}
				}
			}
			return ipam.Range{}, netip.Prefix{}, true
		}
		if r, block, ok := fits(fam.agg); !ok {
			shortest := fam.agg + 1
			for ; shortest < fam.bits; shortest++ {
				if _, _, ok := fits(shortest); ok {
					break
				}
			}
			return fmt.Sprintf("spec.bgp.%s %d would announce %s, which covers addresses outside the pool (entry %s); use %d or longer, or make the pool's addresses fill whole /%d blocks",
				fam.field, fam.agg, block, r, shortest, fam.agg)
		}
	}
	return ""
}

// blockOf returns ip's covering prefix of the given length.
func blockOf(ip netip.Addr, length int) netip.Prefix {
	return netip.PrefixFrom(ip, length).Masked()
}

// mergeRanges sorts ranges and merges overlapping or adjacent ones.
func mergeRanges(rs []ipam.Range) []ipam.Range {
	out := slices.Clone(rs)
	slices.SortFunc(out, func(a, b ipam.Range) int { return a.First.Compare(b.First) })
	merged := out[:0]
	for _, r := range out {
		if n := len(merged); n > 0 && merged[n-1].Family() == r.Family() {
			last := &merged[n-1]
			if next := last.Last.Next(); r.First.Compare(last.Last) <= 0 || (next.IsValid() && next == r.First) {
				if r.Last.Compare(last.Last) > 0 {
					last.Last = r.Last
				}
				continue
			}
		}
		merged = append(merged, r)
	}
	return merged
}

// covered reports whether every address of p lies in one of the merged
// ranges.
func covered(merged []ipam.Range, p netip.Prefix) bool {
	first := p.Addr()
	// merged ranges are sorted and disjoint: the first whose Last is at or
	// after first is the only candidate.
	i, _ := slices.BinarySearchFunc(merged, first, func(r ipam.Range, ip netip.Addr) int { return r.Last.Compare(ip) })
	return i < len(merged) && merged[i].Contains(first) && merged[i].Contains(lastAddr(p))
}

// lastAddr returns the last address of a masked prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// parseCommunity decodes ASN:VALUE or a well-known community name.
func parseCommunity(s string) (uint32, bool) {
	s = strings.TrimSpace(s)
	if v, ok := v1alpha1.WellKnownCommunities[s]; ok {
		return v, true
	}
	hi, lo, ok := strings.Cut(s, ":")
	if !ok {
		return 0, false
	}
	a, err1 := strconv.ParseUint(hi, 10, 16)
	b, err2 := strconv.ParseUint(lo, 10, 16)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return uint32(a)<<16 | uint32(b), true
}

// parseLargeCommunity decodes GLOBAL:LOCAL1:LOCAL2.
func parseLargeCommunity(s string) (LargeCommunity, bool) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	if len(parts) != 3 {
		return LargeCommunity{}, false
	}
	var v [3]uint32
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return LargeCommunity{}, false
		}
		v[i] = uint32(n)
	}
	return LargeCommunity{Global: v[0], Local1: v[1], Local2: v[2]}, true
}
