package speaker

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/vipcast/vipcast/ipvs"
	"github.com/vipcast/vipcast/svcspec"
)

// endpointState is what an endpoint's conditions make of it for the
// dataplane, read as kube-proxy reads them (pkg/proxy's
// endpointslicecache at v1.37.1: ready and serving unset mean true,
// terminating unset means false).
type endpointState uint8

const (
	// epExcluded: neither ready nor terminating (a pod failing its
	// readiness probe, one not ready yet, one on a node gone Unknown): no
	// new flows; it keeps its TCP and SCTP connections, not its UDP
	// flows (keptFor).
	epExcluded endpointState = iota
	// epReady: new flows and existing ones.
	epReady
	// epServing: terminating but still serving. It keeps its flows, and
	// takes new ones only when no endpoint of its category is ready
	// (KEP-1669: kube-proxy's fallback to serving terminating endpoints).
	epServing
	// epDraining: terminating and no longer serving: it keeps its TCP
	// and SCTP connections (weight 0), not its UDP flows (keptFor), and
	// takes nothing new.
	epDraining
)

// stateOf returns the endpoint's state from its conditions.
func stateOf(e *discoveryv1.Endpoint) endpointState {
	c := e.Conditions
	ready := c.Ready == nil || *c.Ready
	serving := c.Serving == nil || *c.Serving
	terminating := c.Terminating != nil && *c.Terminating
	switch {
	case ready:
		return epReady
	case terminating && serving:
		return epServing
	case terminating:
		return epDraining
	}
	return epExcluded
}

// keptFor reports whether an endpoint in state s is a real server of a
// virtual server of protocol proto. Under TCP and SCTP every endpoint
// with an address is: a not-ready or draining one keeps the connections
// and associations it has, at weight 0, which deleting it would expire
// (net.ipv4.vs.expire_nodest_conn) — a readiness probe failing for a
// moment would reset them all — as kube-proxy's conntrack entries keep
// them. Under UDP only serving ones (ready, or terminating and serving)
// are: the flows to one that is not serving are balanced afresh
// (ipvs/staleflows.go), as kube-proxy clears the conntrack entries of a
// UDP endpoint that is not serving (pkg/proxy/conntrack's
// CleanStaleEntries).
func (s endpointState) keptFor(proto ipvs.Protocol) bool {
	return proto != ipvs.UDP || s == epReady || s == epServing
}

// weight is the IPVS weight of an endpoint in state s: 1 when ready, or
// when serving and its category falls back (no endpoint of it is ready);
// else 0 (it drains).
func (s endpointState) weight(fallback bool) int {
	if s == epReady || (s == epServing && fallback) {
		return 1
	}
	return 0
}

// endpointKinds says, for one family of one Service port, which kinds of
// endpoint exist, in the whole cluster and on this node, and what their
// topology hints say.
type endpointKinds struct {
	ready, serving           bool // some endpoint is ready; some is serving and terminating
	localReady, localServing bool // the same, on this node
	// Over the ready endpoints: some has no node hint, some no zone
	// hint; some is hinted for this node, some for its zone.
	unhintedNode, unhintedZone bool
	forNode, forZone           bool
}

// topology is how the ready endpoints' hints narrow the Cluster policy's
// endpoints on this node, as kube-proxy's topologyModeFromHints decides it
// (trafficDistribution PreferSameNode and PreferSameZone, or the topology
// annotation, write the hints): to those hinted for this node when every
// ready endpoint has a node hint and one names this node; else to those
// hinted for its zone when every one has a zone hint and one names it;
// else not at all.
func (r endpointKinds) topology() topologyMode {
	switch {
	case !r.ready:
		return topologyAny
	case !r.unhintedNode && r.forNode:
		return topologySameNode
	case !r.unhintedZone && r.forZone:
		return topologySameZone
	}
	return topologyAny
}

// topologyMode is a topology that narrows the Cluster policy's endpoints.
type topologyMode uint8

const (
	topologyAny topologyMode = iota
	topologySameNode
	topologySameZone
)

// admits reports whether m lets the endpoint e take new flows on the node
// nodeName in zone: kube-proxy's availableForTopology.
func (m topologyMode) admits(e *discoveryv1.Endpoint, nodeName, zone string) bool {
	switch m {
	case topologySameNode:
		return e.Hints != nil && slices.ContainsFunc(e.Hints.ForNodes, func(n discoveryv1.ForNode) bool { return n.Name == nodeName })
	case topologySameZone:
		return e.Hints != nil && slices.ContainsFunc(e.Hints.ForZones, func(z discoveryv1.ForZone) bool { return z.Name == zone })
	}
	return true
}

// fallback reports whether the category (this node's endpoints with
// local, else every endpoint) has no ready endpoint but a serving
// terminating one: then those take new flows, as kube-proxy's
// CategorizeEndpoints gives them.
func (r endpointKinds) fallback(local bool) bool {
	if local {
		return !r.localReady && r.localServing
	}
	return !r.ready && r.serving
}

// announces reports whether a node announces a VIP of this family:
//
//   - Cluster policy: when some endpoint is ready, else when some is
//     serving and terminating (the fallback: better a terminating pod
//     than a refused connection).
//   - Local policy: when one of this node's endpoints is ready; and, only
//     while no endpoint anywhere is ready, when one of them is serving
//     and terminating. A node whose pods all terminate withdraws while
//     other nodes have ready ones, as a cloud load balancer's health
//     check (kube-proxy's, which counts ready endpoints) drains it, and
//     its dataplane still serves the flows that reach it meanwhile.
func (r endpointKinds) announces(local bool) bool {
	if local {
		return r.localReady || (!r.ready && r.localServing)
	}
	return r.ready || r.serving
}

// scanEndpoints returns, per port (indexed like ports) and family slot,
// which kinds of endpoint the Service's EndpointSlices hold, for the node
// nodeName in zone (its topology.kubernetes.io/zone label). With no ports
// it returns one entry for the whole Service, whatever its slices' ports:
// what the routes need.
func scanEndpoints(svc *v1.Service, endpointSlices []*discoveryv1.EndpointSlice, ports []svcspec.Port, nodeName, zone string) [][2]endpointKinds {
	out := make([][2]endpointKinds, max(1, len(ports)))
	targets := make([]uint16, len(out))
	for _, s := range endpointSlices {
		slot, ok := sliceSlot(s)
		if !ok || len(s.Endpoints) == 0 || !ownSlice(svc, s) {
			continue
		}
		if ports == nil {
			targets[0] = 1
		} else if !sliceTargets(s, ports, targets) {
			continue
		}
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			st := stateOf(e)
			if addr, ok := endpointAddr(e); !ok || famSlot(addr) != slot || (st != epReady && st != epServing) {
				continue
			}
			local := onNode(e, nodeName)
			for j, tp := range targets {
				if tp == 0 {
					continue
				}
				r := &out[j][slot]
				if st == epReady {
					r.ready = true
					r.localReady = r.localReady || local
					r.hints(e, nodeName, zone)
				} else {
					r.serving = true
					r.localServing = r.localServing || local
				}
			}
		}
	}
	return out
}

// hints adds the topology hints of the ready endpoint e to r.
func (r *endpointKinds) hints(e *discoveryv1.Endpoint, nodeName, zone string) {
	if e.Hints == nil || len(e.Hints.ForNodes) == 0 {
		r.unhintedNode = true
	} else if !r.forNode && topologySameNode.admits(e, nodeName, zone) {
		r.forNode = true
	}
	if e.Hints == nil || len(e.Hints.ForZones) == 0 {
		r.unhintedZone = true
	} else if !r.forZone && zone != "" && topologySameZone.admits(e, nodeName, zone) {
		r.forZone = true
	}
}

// endpointAddr returns an endpoint's first address; it reports false when
// it is missing, zoned, unspecified or unparsable.
func endpointAddr(e *discoveryv1.Endpoint) (netip.Addr, bool) {
	if len(e.Addresses) == 0 {
		return netip.Addr{}, false
	}
	addr, err := netip.ParseAddr(e.Addresses[0])
	if err != nil || addr.Zone() != "" || addr.IsUnspecified() {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}
