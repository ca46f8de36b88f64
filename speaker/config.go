package speaker

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/ipam"
	"github.com/vipcast/vipcast/poolspec"
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
		if prob := compileBGP(pool, p.Spec.BGP, selected, node); prob != nil {
			errs = append(errs, PoolError{p.Name, prob.Reason, prob.Message})
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
func compileBGP(pool *Pool, b *v1alpha1.IPPoolBGP, peers []peerLabels, node Node) *poolspec.Problem {
	pool.AggregationLength = int(b.AggregationLengthOrDefault())
	pool.AggregationLengthV6 = int(b.AggregationLengthV6OrDefault())
	if prob := poolspec.Check(b, pool.Ranges); prob != nil {
		pool.Disabled = fmt.Sprintf("pool %s is not announced: %s", pool.Name, prob.Message)
		return prob
	}
	if b == nil {
		return nil
	}
	// Check decoded every community already.
	for _, c := range b.Communities {
		v, _ := poolspec.ParseCommunity(c)
		pool.Communities = append(pool.Communities, v)
	}
	slices.Sort(pool.Communities)
	pool.Communities = slices.Compact(pool.Communities)
	for _, c := range b.LargeCommunities {
		v, _ := poolspec.ParseLargeCommunity(c)
		pool.LargeCommunities = append(pool.LargeCommunities, bgp.LargeCommunity(v))
	}
	slices.SortFunc(pool.LargeCommunities, compareLarge)
	pool.LargeCommunities = slices.Compact(pool.LargeCommunities)
	pool.LocalPref = b.LocalPref

	if b.PeerSelector != nil {
		sel, _ := metav1.LabelSelectorAsSelector(b.PeerSelector) // Check parsed it
		pool.HasPeerSelector = true
		pool.Peers = []string{}
		for _, p := range peers {
			if sel.Matches(p.labels) {
				pool.Peers = append(pool.Peers, p.name)
			}
		}
	}
	if b.NodeSelector != nil {
		sel, _ := metav1.LabelSelectorAsSelector(b.NodeSelector) // Check parsed it
		if !sel.Matches(node.Labels) {
			pool.Disabled = fmt.Sprintf("pool %s's nodeSelector does not select this node", pool.Name)
		}
	}
	return nil
}

func compareLarge(a, b bgp.LargeCommunity) int {
	return cmp.Or(cmp.Compare(a.Global, b.Global), cmp.Compare(a.Local1, b.Local1), cmp.Compare(a.Local2, b.Local2))
}
