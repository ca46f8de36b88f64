package speaker

import (
	"fmt"
	"net/netip"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/ipam"
	"github.com/vipcast/vipcast/lbclass"
	"github.com/vipcast/vipcast/poolspec"
)

// View is the configuration compiled for this node: the admitted IPPools
// (poolspec.Admit, the CCM's rule) with their BGP attributes decoded and
// selectors evaluated against this node. Compile builds it once per change
// of the node, the pools or the peers; ServiceRoutes reads it for every
// Service. A View is immutable and safe for concurrent readers.
type View struct {
	// Node is the node the view was compiled for.
	Node Node
	// Classes says which Services vipcast serves (the speaker's
	// --load-balancer-class and --serve-classless-services, the same as
	// the CCM's); the zero value serves the class-less ones.
	Classes lbclass.Selector
	// admission decides which pool owns an address.
	admission *poolspec.Admission
	// pools are the admitted pools by name.
	pools map[string]*Pool
	// held are every pool (admitted or refused) by name, as they announce
	// the VIPs they hold outside their spec (poolspec.Admission.HeldBGP).
	held map[string]*Pool
	// Tunnels turns on the two-tier dataplane for IPv4 VIPs (ipvs.Tunnel):
	// each node's tunnel address by node name. Nil keeps one tier.
	Tunnels map[string]netip.Addr
	// TunnelIPv6, with Tunnels, gives IPv6 VIPs the two tiers too
	// (ipvs.Dataplane.TwoTierIPv6): through the IPv6 tunnel addresses
	// Tunnels6 when it is not nil, else through the IPv4 ones.
	TunnelIPv6 bool
	// Tunnels6 is each node's IPv6 tunnel address by node name (nil: none,
	// IPv6 VIPs go 6in4 to the IPv4 ones).
	Tunnels6 map[string]netip.Addr
	// SpeakersReady, when not nil, are the nodes whose speaker is ready
	// (a ready endpoint of Options.SpeakerService on that node): tier 1
	// gives the other nodes weight 0, so they take no new flows while a
	// node that is ready can (twoTierBackends). Nil: every node is taken
	// as ready.
	SpeakersReady map[string]bool
}

// speakerReady reports whether tier 1 may send new flows to node: this
// node always (its own speaker is the one computing), others when their
// speaker is ready or readiness is not watched.
func (v *View) speakerReady(node string) bool {
	return v.SpeakersReady == nil || node == v.Node.Name || v.SpeakersReady[node]
}

// Pool is one admitted IPPool as the routing decisions need it.
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
	// pool's addresses: its spec.bgp.nodeSelector does not select the
	// node. That is not an error, and the pool still owns its addresses.
	Disabled string
}

// PoolError is an IPPool that pool admission refused (poolspec.Refusal):
// it owns no address, here as in the CCM, which reports it on the
// IPPool's status.
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

// Pool returns the admitted pool called name, or nil.
func (v *View) Pool(name string) *Pool { return v.pools[name] }

// PoolFor returns the admitted pool that owns ip, or nil. It costs
// O(log ranges).
func (v *View) PoolFor(ip netip.Addr) *Pool {
	if p := v.admission.PoolFor(ip); p != nil {
		return v.pools[p.Name]
	}
	return nil
}

// HolderFor returns the pool that holds ip, a VIP in the status of a
// Service whose annotations name the pool named (poolspec.HeldBy), by the
// holding rule the CCM applies too (poolspec.Admission.Holder), or nil when
// none does:
// the admitted pool that owns ip, else (a pool narrowed or refused since
// it handed ip out) that pool as it announces what it holds outside its
// spec: host routes, with what still decodes of its spec.bgp.
func (v *View) HolderFor(ip netip.Addr, named string) *Pool {
	h, ok := v.admission.Holder(ip, named)
	switch {
	case !ok:
		return nil
	case h.InSpec:
		return v.pools[h.Pool]
	}
	return v.held[h.Pool]
}

// Compile builds this node's View of the pools and peers.
//
// Pools are admitted by poolspec.Admit, the rule the CCM allocates with,
// so both binaries agree on which pool owns an address: oldest first; a
// pool whose spec.addresses, spec.allocation selectors or spec.bgp cannot
// be used, or that overlaps an older admitted pool, is refused, returned
// as a PoolError and owns no address, as in the CCM. A VIP a Service
// already published keeps its holder, though (HolderFor): a pool narrowed
// or refused since keeps announcing it.
//
// What depends on this node is decided here: an admitted pool whose
// spec.bgp.nodeSelector does not select the node is Disabled (not an
// error: it still owns its addresses, this node just does not announce
// them), and spec.bgp.peerSelector is resolved against the peers this node
// peers with (those whose spec.nodeSelector selects it, whose settings
// are usable and whose address no older such peer has; see PeersForNode). A peer dropped only because its password
// cannot be read still counts, so routes keep naming it and reach it once
// it is fixed.
func Compile(pools []*v1alpha1.IPPool, peers []*v1alpha1.BGPPeer, node Node) (*View, []PoolError) {
	adm := poolspec.Admit(pools)
	v := &View{Node: node, admission: adm, pools: make(map[string]*Pool, len(adm.Pools)), held: map[string]*Pool{}}
	selected := selectedPeers(peers, node)
	for _, p := range adm.Pools {
		v.pools[p.Name] = nodePool(p.Name, p.Ranges, &p.BGP, selected, node)
	}
	for _, p := range pools {
		if p == nil {
			continue
		}
		if b := adm.HeldBGP(p.Name); b != nil && v.held[p.Name] == nil {
			v.held[p.Name] = nodePool(p.Name, nil, b, selected, node)
		}
	}
	var errs []PoolError
	for _, r := range adm.Refused {
		errs = append(errs, PoolError(r))
	}
	return v, errs
}

// nodePool is a pool as this node announces it, from its decoded spec.bgp
// b: its peerSelector resolved against the node's peers, Disabled when its
// nodeSelector does not select the node.
func nodePool(name string, ranges []ipam.Range, b *poolspec.BGP, peers []peerLabels, node Node) *Pool {
	pool := &Pool{
		Name:                name,
		Ranges:              ranges,
		Communities:         b.Communities,
		LocalPref:           b.LocalPref,
		AggregationLength:   b.AggregationLength,
		AggregationLengthV6: b.AggregationLengthV6,
	}
	for _, c := range b.LargeCommunities {
		pool.LargeCommunities = append(pool.LargeCommunities, bgp.LargeCommunity(c))
	}
	if b.PeerSelector != nil {
		pool.HasPeerSelector = true
		pool.Peers = []string{}
		for _, peer := range peers {
			if b.PeerSelector.Matches(peer.labels) {
				pool.Peers = append(pool.Peers, peer.name)
			}
		}
	}
	if b.NodeSelector != nil && !b.NodeSelector.Matches(node.Labels) {
		pool.Disabled = fmt.Sprintf("pool %s's nodeSelector does not select this node", name)
	}
	return pool
}
