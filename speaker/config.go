package speaker

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/ipam"
)

// View is the configuration compiled for this node: the usable IPPools with
// their BGP attributes decoded and selectors evaluated against this node.
// Compile builds it once per change of the node, the pools or the peers;
// ServiceRoutes reads it for every Service. A View is immutable and safe
// for concurrent readers.
type View struct {
	// Node is the node the view was compiled for.
	Node Node
	// pools are the accepted pools by name.
	pools map[string]*Pool
	// index holds every accepted pool's ranges sorted by First; pools do
	// not overlap, so Last is sorted too.
	index []poolRange
}

type poolRange struct {
	ipam.Range
	pool *Pool
}

// Pool is one accepted IPPool as the routing decisions need it.
type Pool struct {
	// Name is the IPPool's name.
	Name string
	// Ranges are the pool's addresses, as ipam.ParseAddresses returns them.
	Ranges []ipam.Range
	// Communities are the decoded spec.bgp.communities, sorted, without
	// duplicates.
	Communities []uint32
	// LargeCommunities are the decoded spec.bgp.largeCommunities, sorted,
	// without duplicates.
	LargeCommunities []bgp.LargeCommunity
	// LocalPref is spec.bgp.localPref.
	LocalPref *uint32
	// AggregationLength and AggregationLengthV6 are the announced prefix
	// lengths of the pool's IPv4 and IPv6 addresses under
	// externalTrafficPolicy Cluster.
	AggregationLength, AggregationLengthV6 int
	// Peers are the BGPPeers, among those this node peers with, that
	// spec.bgp.peerSelector selects, sorted; nil when the pool has no
	// peerSelector (every peer).
	Peers []string
	// HasPeerSelector is true when spec.bgp.peerSelector is set, so an
	// empty Peers means "no peer".
	HasPeerSelector bool
	// Disabled, when not empty, says why this node does not announce the
	// pool's addresses: its nodeSelector does not select the node, or a
	// spec.bgp field cannot be used. The pool still owns its addresses
	// (a VIP inside it is never attributed to another pool).
	Disabled string
}

// PoolError is a problem with one IPPool found by Compile.
type PoolError struct {
	// Pool is the IPPool's name.
	Pool string
	// Reason is the v1alpha1 condition reason: ReasonInvalidAddresses
	// (addresses, aggregation lengths), ReasonOverlap, ReasonInvalidSelector
	// or ReasonInvalidConfig (communities).
	Reason string
	// Message names the field at fault and the fix.
	Message string
}

func (e PoolError) Error() string { return fmt.Sprintf("IPPool %s: %s", e.Pool, e.Message) }

// Pool returns the accepted pool called name, or nil.
func (v *View) Pool(name string) *Pool { return v.pools[name] }

// PoolFor returns the accepted pool containing ip, or nil. It costs
// O(log ranges).
func (v *View) PoolFor(ip netip.Addr) *Pool {
	i, _ := slices.BinarySearchFunc(v.index, ip, func(r poolRange, ip netip.Addr) int {
		return r.Last.Compare(ip)
	})
	if i < len(v.index) && v.index[i].Contains(ip) {
		return v.index[i].pool
	}
	return nil
}

// Compile builds this node's View of the pools and peers.
//
// Pools are accepted with the CCM's rule so that both binaries agree on
// which pool owns an address: oldest first (creationTimestamp, then name);
// a pool whose addresses do not parse, whose spec.allocation selectors do
// not parse, or that overlaps an older accepted pool is rejected, reported
// and ignored (its addresses belong to no pool here, as in the CCM).
//
// An accepted pool whose spec.bgp cannot be used on this node — a
// malformed nodeSelector, peerSelector, community or aggregation length —
// is kept (it still owns its addresses) but Disabled: nothing in it is
// announced from this node, and the problem is reported. A nodeSelector
// that does not select this node also disables the pool, without an error.
//
// peerSelector is resolved against the peers this node peers with (those
// whose spec.nodeSelector selects it and whose settings are usable; see
// PeersForNode). A peer dropped only because its password cannot be read
// still counts, so routes keep naming it and reach it once it is fixed.
func Compile(pools []*v1alpha1.IPPool, peers []*v1alpha1.BGPPeer, node Node) (*View, []PoolError) {
	v := &View{Node: node, pools: map[string]*Pool{}}
	var errs []PoolError

	ordered := slices.Clone(pools)
	slices.SortFunc(ordered, func(a, b *v1alpha1.IPPool) int {
		switch {
		case v1alpha1.OlderFirst(a, b):
			return -1
		case v1alpha1.OlderFirst(b, a):
			return 1
		}
		return 0
	})

	// Acceptance: the allocator's own rule, through the allocator itself.
	var specs []ipam.Pool
	ranges := map[string][]ipam.Range{}
	for _, p := range ordered {
		rs, err := ipam.ParseAddresses(p.Spec.Addresses)
		if err != nil {
			errs = append(errs, PoolError{p.Name, reasonFor(err), "spec.addresses: " + err.Error()})
			continue
		}
		if msg := allocationSelectorError(p); msg != "" {
			errs = append(errs, PoolError{p.Name, v1alpha1.ReasonInvalidSelector, msg})
			continue
		}
		ranges[p.Name] = rs
		specs = append(specs, ipam.Pool{Name: p.Name, Addresses: p.Spec.Addresses})
	}
	rejected := ipam.New().SetPools(specs)

	selected := selectedPeers(peers, node)
	for _, p := range ordered {
		rs, parsed := ranges[p.Name]
		if !parsed {
			continue
		}
		if err, bad := rejected[p.Name]; bad {
			errs = append(errs, PoolError{p.Name, reasonFor(err), err.Error()})
			continue
		}
		pool := &Pool{Name: p.Name, Ranges: rs}
		if msg := compileBGP(pool, p.Spec.BGP, selected, node); msg != "" {
			errs = append(errs, PoolError{p.Name, reasonForBGP(msg), msg})
		}
		v.pools[p.Name] = pool
		for _, r := range rs {
			v.index = append(v.index, poolRange{Range: r, pool: pool})
		}
	}
	slices.SortFunc(v.index, func(a, b poolRange) int { return a.First.Compare(b.First) })
	return v, errs
}

func reasonFor(err error) string {
	if ipam.ReasonOf(err) == ipam.ReasonOverlap {
		return v1alpha1.ReasonOverlap
	}
	return v1alpha1.ReasonInvalidAddresses
}

// reasonForBGP maps a compileBGP problem to a condition reason.
func reasonForBGP(msg string) string {
	switch {
	case strings.HasPrefix(msg, "spec.bgp.nodeSelector"), strings.HasPrefix(msg, "spec.bgp.peerSelector"):
		return v1alpha1.ReasonInvalidSelector
	case strings.HasPrefix(msg, "spec.bgp.aggregationLength"):
		return v1alpha1.ReasonInvalidAddresses
	}
	return v1alpha1.ReasonInvalidConfig
}

// allocationSelectorError mirrors the CCM, which rejects a pool whose
// spec.allocation selectors do not parse.
func allocationSelectorError(p *v1alpha1.IPPool) string {
	a := p.Spec.Allocation
	if a == nil {
		return ""
	}
	for field, sels := range map[string][]metav1.LabelSelector{
		"spec.allocation.namespaceSelectors": a.NamespaceSelectors,
		"spec.allocation.serviceSelectors":   a.ServiceSelectors,
	} {
		for i := range sels {
			if _, err := metav1.LabelSelectorAsSelector(&sels[i]); err != nil {
				return fmt.Sprintf("%s[%d]: %v; fix the selector (operators are In, NotIn, Exists, DoesNotExist)", field, i, err)
			}
		}
	}
	return ""
}

// compileBGP fills pool's BGP attributes. It returns the problem that
// disables the pool, if any; a nodeSelector that does not select the node
// disables the pool without a problem.
func compileBGP(pool *Pool, b *v1alpha1.IPPoolBGP, peers []peerLabels, node Node) string {
	pool.AggregationLength = int(b.AggregationLengthOrDefault())
	pool.AggregationLengthV6 = int(b.AggregationLengthV6OrDefault())
	fail := func(msg string) string {
		pool.Disabled = fmt.Sprintf("pool %s is not announced: %s", pool.Name, msg)
		return msg
	}
	if msg := checkAggregation(pool); msg != "" {
		return fail(msg)
	}
	if b == nil {
		return ""
	}
	for i, c := range b.Communities {
		v, ok := parseCommunity(c)
		if !ok {
			return fail(fmt.Sprintf("spec.bgp.communities[%d] %q is not a community: write ASN:VALUE with both parts 0-65535 (e.g. 64512:100) or a well-known name such as no-export", i, c))
		}
		pool.Communities = append(pool.Communities, v)
	}
	slices.Sort(pool.Communities)
	pool.Communities = slices.Compact(pool.Communities)
	for i, c := range b.LargeCommunities {
		v, ok := parseLargeCommunity(c)
		if !ok {
			return fail(fmt.Sprintf("spec.bgp.largeCommunities[%d] %q is not a large community: write GLOBAL:LOCAL1:LOCAL2 with each part 0-4294967295 (e.g. 4200000000:1:2)", i, c))
		}
		pool.LargeCommunities = append(pool.LargeCommunities, v)
	}
	slices.SortFunc(pool.LargeCommunities, compareLarge)
	pool.LargeCommunities = slices.Compact(pool.LargeCommunities)
	pool.LocalPref = b.LocalPref

	if b.PeerSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(b.PeerSelector)
		if err != nil {
			return fail(fmt.Sprintf("spec.bgp.peerSelector: %v; fix the selector (operators are In, NotIn, Exists, DoesNotExist)", err))
		}
		pool.HasPeerSelector = true
		pool.Peers = []string{}
		for _, p := range peers {
			if sel.Matches(p.labels) {
				pool.Peers = append(pool.Peers, p.name)
			}
		}
	}
	if b.NodeSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(b.NodeSelector)
		if err != nil {
			return fail(fmt.Sprintf("spec.bgp.nodeSelector: %v; fix the selector (operators are In, NotIn, Exists, DoesNotExist)", err))
		}
		if !sel.Matches(node.Labels) {
			pool.Disabled = fmt.Sprintf("pool %s's nodeSelector does not select this node", pool.Name)
		}
	}
	return ""
}

// checkAggregation rejects aggregation lengths out of range, or that would
// announce a prefix covering addresses outside the pool: for each range,
// the aggregate blocks holding its first and last addresses must lie inside
// the pool (the blocks in between lie inside the range itself). For CIDR
// entries this is the API server's own rule; for first-last ranges it
// catches, e.g., 192.0.2.10-192.0.2.20 with aggregationLength 24.
func checkAggregation(pool *Pool) string {
	merged := mergeRanges(pool.Ranges)
	for _, fam := range []struct {
		field string
		bits  int
		agg   int
	}{{"aggregationLength", 32, pool.AggregationLength}, {"aggregationLengthV6", 128, pool.AggregationLengthV6}} {
		if fam.agg < 0 || fam.agg > fam.bits {
			return fmt.Sprintf("spec.bgp.%s %d is out of range: use 0 to %d", fam.field, fam.agg, fam.bits)
		}
		fits := func(length int) (ipam.Range, netip.Prefix, bool) {
			for _, r := range pool.Ranges {
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
func parseLargeCommunity(s string) (bgp.LargeCommunity, bool) {
	parts := strings.Split(strings.TrimSpace(s), ":")
	if len(parts) != 3 {
		return bgp.LargeCommunity{}, false
	}
	var v [3]uint32
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return bgp.LargeCommunity{}, false
		}
		v[i] = uint32(n)
	}
	return bgp.LargeCommunity{Global: v[0], Local1: v[1], Local2: v[2]}, true
}

func compareLarge(a, b bgp.LargeCommunity) int {
	return cmp.Or(cmp.Compare(a.Global, b.Global), cmp.Compare(a.Local1, b.Local1), cmp.Compare(a.Local2, b.Local2))
}
