package speaker

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/poolspec"
)

// ServiceRoutes returns the routes this node announces for one Service,
// sorted by prefix, and, whenever one of the Service's VIPs is not
// announced, a short human reason for logs and Events (empty when every VIP
// is announced). It reads only svc, its EndpointSlices and the view, so a
// change of one Service or its endpoints costs work for that Service only.
//
// The rules, in the order they are checked:
//
//   - The Service is vipcast's when spec.type is LoadBalancer and
//     spec.loadBalancerClass is unset: the CCM's service controller only
//     handles class-less Services. Its VIPs are the IPs of
//     status.loadBalancer.ingress; hostnames and unparsable IPs are skipped.
//   - A node labelled node.kubernetes.io/exclude-from-external-load-balancers
//     (any value) or cordoned (spec.unschedulable) announces nothing.
//   - Endpoints: an endpoint counts when its conditions.ready is true or
//     unset (unset means ready, per the EndpointSlice API); a terminating
//     endpoint has ready false and does not count. Endpoints are counted per
//     IP family (the EndpointSlice's addressType), since a VIP is forwarded
//     to endpoints of its own family. With externalTrafficPolicy Local a VIP
//     is announced only when this node (EndpointSlice nodeName) has a ready
//     endpoint: traffic is not forwarded to other nodes. With Cluster it is
//     announced from every eligible node as soon as any node has a ready
//     endpoint, and not at all when none has: a route to a Service without
//     a backend only black-holes traffic that the fabric could send
//     elsewhere (MetalLB does the same).
//   - A pool must hold the VIP (View.HolderFor, the CCM's rule): the
//     admitted pool that owns it, else the pool the Service's annotations
//     name (poolspec.HeldBy: the CCM's vipcast.io/allocated-from-pool
//     record, else vipcast.io/pool) or a refused pool containing it —
//     a pool narrowed or broken since it handed the VIP out keeps it
//     announced until the Service lets it go, as a host route with what
//     still decodes of its spec.bgp. That pool must not be Disabled for
//     this node (its spec.bgp.nodeSelector selects the node).
//   - The prefix is the VIP masked to the pool's aggregationLength (IPv4)
//     or aggregationLengthV6 (IPv6) under Cluster. Under Local it is always
//     the host prefix (/32, /128): an aggregate would also attract traffic
//     for the other Services in it, which may have no endpoint on this node.
//   - The next hop is the node's address of the VIP's family; without one,
//     that VIP is not announced.
//   - Attributes come from the pool: communities, large communities,
//     localPref, and Peers from its peerSelector (nil, meaning every peer,
//     when the pool has none). A peerSelector selecting none of this node's
//     peers announces nothing.
//
// Routes share the view's attribute slices: do not modify them. A nil view
// (configuration not loaded yet) announces nothing.
func ServiceRoutes(svc *v1.Service, endpointSlices []*discoveryv1.EndpointSlice, view *View) (routes []bgp.Route, reason string) {
	routes, _, reason = serviceRoutes(svc, endpointSlices, view)
	return routes, reason
}

// HandoverRoutes returns the routes ServiceRoutes withholds only because,
// under externalTrafficPolicy Local, this node's endpoints of a VIP's
// family all terminate (serving on) while another node has ready ones:
// the routes the node announced until those became ready elsewhere. The
// Controller keeps announcing them for a handover (Options.Handover), so
// that the routers learn the other nodes' routes before this one's go,
// and a VIP is never left without a route between the two; the endpoints
// serve meanwhile, as kube-proxy keeps sending a node's traffic to its
// serving terminating endpoints when it has no ready one.
func HandoverRoutes(svc *v1.Service, endpointSlices []*discoveryv1.EndpointSlice, view *View) []bgp.Route {
	_, handover, _ := serviceRoutes(svc, endpointSlices, view)
	return handover
}

// serviceRoutes returns ServiceRoutes' routes and reason and the
// HandoverRoutes, from one scan of the endpoints.
func serviceRoutes(svc *v1.Service, endpointSlices []*discoveryv1.EndpointSlice, view *View) (routes, handover []bgp.Route, reason string) {
	if view == nil {
		return nil, nil, "configuration not loaded yet"
	}
	if why := view.Classes.Why(svc); why != "" {
		return nil, nil, why
	}
	vips := serviceVIPs(svc)
	if len(vips) == 0 {
		return nil, nil, "no VIP in status.loadBalancer.ingress yet"
	}
	node := &view.Node
	if node.Excluded {
		return nil, nil, "node excluded by label " + LabelExcludeFromExternalLB
	}
	if node.Cordoned {
		return nil, nil, "node cordoned"
	}
	local := svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	kinds := &scanEndpoints(svc, endpointSlices, nil, node.Name, "")[0]

	routes = make([]bgp.Route, 0, len(vips))
	var reasons []string
	for _, vip := range vips {
		r, why := vipRoute(vip, poolspec.HeldBy(svc.Annotations), view, kinds, local)
		if why != "" {
			if !slices.Contains(reasons, why) {
				reasons = append(reasons, why)
			}
			if h := handoverKinds(kinds, vip, local); h != nil {
				if r, why := vipRoute(vip, poolspec.HeldBy(svc.Annotations), view, h, local); why == "" {
					handover = append(handover, r)
				}
			}
			continue
		}
		routes = append(routes, r)
	}
	if len(routes) > 1 {
		slices.SortFunc(routes, func(a, b bgp.Route) int { return comparePrefix(a.Prefix, b.Prefix) })
		// Two VIPs of one Service in one aggregate make one route.
		routes = slices.CompactFunc(routes, func(a, b bgp.Route) bool { return a.Prefix == b.Prefix })
	}
	if len(routes) == 0 {
		routes = nil
	}
	return routes, handover, strings.Join(reasons, "; ")
}

// handoverKinds returns kinds as a Local handover sees vip's family (no
// other node's endpoint ready) when this node's endpoints of it all
// terminate and serve while another node's are ready; else nil.
func handoverKinds(kinds *[2]endpointKinds, vip netip.Addr, local bool) *[2]endpointKinds {
	k := kinds[famSlot(vip)]
	if !local || k.localReady || !k.localServing || !k.ready {
		return nil
	}
	h := *kinds
	h[famSlot(vip)].ready = false
	return &h
}

// vipRoute returns the route of one VIP of a Service whose vipcast.io/pool
// annotation is named under ServiceRoutes' rules, or why it is not
// announced.
func vipRoute(vip netip.Addr, named string, view *View, kinds *[2]endpointKinds, local bool) (bgp.Route, string) {
	pool := view.HolderFor(vip, named)
	switch {
	case pool == nil:
		return bgp.Route{}, fmt.Sprintf("VIP %s is in no IPPool", vip)
	case pool.Disabled != "":
		return bgp.Route{}, pool.Disabled
	}
	if msg := missing(kinds, vip, local); msg != "" {
		return bgp.Route{}, msg
	}
	nh, ok := view.Node.NextHop(vip)
	if !ok {
		return bgp.Route{}, fmt.Sprintf("node has no %s address (InternalIP or ExternalIP) to announce VIP %s with", familyName(vip), vip)
	}
	if pool.HasPeerSelector && len(pool.Peers) == 0 {
		return bgp.Route{}, fmt.Sprintf("pool %s's peerSelector selects none of this node's BGPPeers", pool.Name)
	}
	bits := vip.BitLen()
	if !local {
		bits = pool.AggregationLength
		if vip.Is6() {
			bits = pool.AggregationLengthV6
		}
	}
	return bgp.Route{
		Prefix:           netip.PrefixFrom(vip, bits).Masked(),
		NextHop:          nh,
		Communities:      pool.Communities,
		LargeCommunities: pool.LargeCommunities,
		LocalPref:        pool.LocalPref,
		Peers:            pool.Peers,
	}, ""
}

// missing returns why vip may not be announced for lack of endpoints
// (endpointKinds.announces), or "". kinds are the Service's, per family.
func missing(kinds *[2]endpointKinds, vip netip.Addr, local bool) string {
	slot := famSlot(vip)
	if kinds[slot].announces(local) {
		return ""
	}
	other := kinds[1-slot].announces(local)
	switch {
	case local && kinds[slot].localServing:
		return fmt.Sprintf("externalTrafficPolicy Local and this node's %s endpoints for VIP %s are all terminating, while other nodes have ready ones", familyName(vip), vip)
	case local && other:
		return fmt.Sprintf("externalTrafficPolicy Local and no ready %s endpoint on this node for VIP %s", familyName(vip), vip)
	case local:
		return "externalTrafficPolicy Local and no ready endpoint on this node"
	case other:
		return fmt.Sprintf("no ready %s endpoints for VIP %s", familyName(vip), vip)
	}
	return "no ready endpoints"
}
