package speaker

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/vipcast/vipcast/ipvs"
	"github.com/vipcast/vipcast/poolspec"
	"github.com/vipcast/vipcast/svcspec"
)

// AnnotationScheduler is the Service annotation that picks the IPVS scheduler of its
// virtual servers (one of ipvs.Schedulers()); unset or empty means
// ipvs.DefaultScheduler (mh with source-port hashing and fallback).
const AnnotationScheduler = ipvs.SchedulerAnnotation

// ServiceDataplane returns the IPVS virtual servers this node programs for
// one Service — the node's desired dataplane state for it — sorted by VIP,
// port and protocol, and the problems with the Service's input that the
// user should fix (messages for logs and Events; empty when there is none).
// Like ServiceRoutes it reads only svc, its EndpointSlices and the view, so
// a change of one Service or its endpoints costs work for that Service
// only, and the caller applies the result with ipvs.DiffService/SyncService
// for that Service's keys.
//
// The rules:
//
//   - The Service is vipcast's under ServiceRoutes' rule: spec.type
//     LoadBalancer and no spec.loadBalancerClass. Its VIPs are the IPs of
//     status.loadBalancer.ingress (hostnames and unparsable IPs skipped).
//     Anything else has no virtual server and no problem.
//   - Each VIP must lie in an IPPool of the view. A VIP outside every pool
//     is not vipcast's (the CCM and ServiceRoutes agree on which pool owns
//     an address): binding it to the node and capturing its traffic could
//     hijack an address another load balancer, or the network, uses.
//     ServiceRoutes already reports such a VIP, so it is not a problem
//     here.
//   - Unlike announcements, the dataplane does not depend on the node being
//     excluded (node.kubernetes.io/exclude-from-external-load-balancers) or
//     cordoned, nor on the pool's spec.bgp (nodeSelector, peers, a Disabled
//     pool): a node that stops announcing keeps forwarding the traffic still
//     in flight while the routers converge (graceful withdraw), and starts
//     again without churn. Whether traffic reaches the node is BGP's
//     business; what the node does with it is this function's.
//   - One virtual server per VIP and ServicePort: Port is spec.ports[].port,
//     Protocol spec.ports[].protocol (ipvs.ParseProtocol, unset means TCP).
//     A port out of 1-65535 or an unknown protocol is skipped and reported
//     (the API server does not let either through). Two ServicePorts with
//     the same port and protocol make one virtual server (the first wins).
//   - Backends (real servers) are the endpoints of the VIP's family: an
//     EndpointSlice of addressType IPv4 for an IPv4 VIP, IPv6 for an IPv6
//     VIP; FQDN slices and slices of another Service are ignored; an
//     endpoint's first address is used (the only one the EndpointSlice API
//     gives a meaning to) and must be of the slice's family. The target port
//     is the slice's port with the ServicePort's name (both possibly empty)
//     and protocol; a slice without one gives this ServicePort no backend.
//   - Weight 1 for a ready endpoint (conditions.ready true or unset); weight
//     0 for a terminating one (conditions.terminating true and ready false):
//     it drains — its established connections go on, it gets no new ones —
//     until its EndpointSlice drops it. An endpoint neither ready nor
//     terminating is left out. The same address and port in several slices
//     is one backend, ready winning over terminating.
//   - externalTrafficPolicy Local: only the endpoints on this node
//     (EndpointSlice nodeName == view.Node.Name), and SNAT false, so the
//     client's address is kept. Cluster (or unset): every endpoint, and
//     SNAT true, so replies from another node's endpoint come back through
//     this node.
//   - With view.Tunnels set (the two-tier dataplane), an IPv4 VIP's
//     virtual servers take their real servers from twoTierBackends
//     instead, for both policies: tier 1 over the nodes that host
//     endpoints, tier 2 (Local) this node's endpoints, and SNAT false. An
//     IPv6 VIP does the same with view.TunnelIPv6 (tier 1 over the IPv6
//     tunnel addresses of view.Tunnels6, or without them over the IPv4
//     ones, weighted by the nodes' IPv6 endpoints), and keeps the rules
//     above without it.
//   - In-cluster endpoints (ipvs.Service.Cluster): every endpoint, under
//     the Cluster rules above, for the virtual servers of the two-tier
//     families and, under Local, of the one-tier ones: the node's own
//     connections to the VIP, and with one tier its pods', go to any of
//     them, as kube-proxy sends in-cluster clients to every endpoint
//     whatever externalTrafficPolicy says. One-tier virtual servers under
//     Cluster have none: IPVS reaches every endpoint already.
//   - A virtual server without backend is kept, with no real server, as
//     kube-proxy's IPVS mode does. IPVS then refuses new connections to
//     VIP:port cleanly (ICMP port unreachable) instead of letting them reach
//     whatever listens on the node's own sockets (the VIP is bound to the
//     node), and the virtual server, its scheduler state and its SNAT
//     element are not deleted and recreated when endpoints flap. ServiceRoutes
//     stops announcing such a VIP, so this only catches traffic in flight.
//   - Scheduler: the AnnotationScheduler annotation through
//     ipvs.ParseScheduler. Unset or empty gives Scheduler "" and no flags
//     (the ipvs package's default: mh with ipvs.DefaultSchedulerFlags); mh
//     gets the same flags; another valid scheduler no flags. An invalid
//     value keeps the default and is reported with the annotation, the bad
//     value and the allowed values: nothing else of the Service is lost.
//   - sessionAffinity ClientIP: Persistent is
//     sessionAffinityConfig.clientIP.timeoutSeconds, 10800 (the API's
//     default) when unset or not positive; None: 0. In two tiers Affinity
//     instead, and no persistence (setRealServers).
//   - Source ranges (sourceRanges): spec.loadBalancerSourceRanges, else the
//     service.beta.kubernetes.io/load-balancer-source-ranges annotation,
//     restrict every virtual server of the Service to the ranges of its
//     VIP's family, plus the VIP itself when a range holds the node's
//     address (vipRanges). A VIP with no range of its family admits no
//     client. A range that does not parse is reported and left out: a
//     malformed list admits fewer clients, never more.
//
// Backends are sorted by address and port; a virtual server's Backends do
// not alias another's (appending to them reallocates). A nil view (configuration not loaded yet) gives
// nothing: the caller must not apply that as the Service's desired state.
func ServiceDataplane(svc *v1.Service, endpointSlices []*discoveryv1.EndpointSlice, view *View) (services []ipvs.Service, problems []string) {
	if view == nil || !view.Classes.Serves(svc) {
		return nil, nil
	}
	var vips []netip.Addr
	var fams [2]bool // families with a VIP in a pool
	for _, vip := range serviceVIPs(svc) {
		if view.HolderFor(vip, poolspec.HeldBy(svc.Annotations)) != nil {
			vips = append(vips, vip)
			fams[famSlot(vip)] = true
		}
	}
	if len(vips) == 0 {
		return nil, nil
	}
	slices.SortFunc(vips, netip.Addr.Compare)

	ports, problems := svcspec.Ports(svc)
	if len(ports) == 0 {
		return nil, problems
	}
	sched, flags, problem := svcspec.Scheduler(svc)
	if problem != "" {
		problems = append(problems, problem)
	}
	persistent := sessionPersistence(svc)
	sched, flags = clientAffinity(sched, flags, persistent)
	restricted, ranges, problem := svcspec.SourceRanges(svc)
	if problem != "" {
		problems = append(problems, problem)
	}
	local := svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	rs, p := serviceRealServers(svc, endpointSlices, ports, view, fams, local)
	problems = append(problems, p...)

	services = make([]ipvs.Service, 0, len(vips)*len(ports))
	var used [2]bool // whether a family's backends were handed out already
	for _, vip := range vips {
		slot := famSlot(vip)
		var admitted []netip.Prefix
		if restricted {
			admitted = vipRanges(vip, ranges, &view.Node)
		}
		for i, p := range ports {
			s := ipvs.Service{VIP: vip, Port: p.Port, Protocol: p.Proto, Scheduler: sched, Flags: flags, Persistent: persistent,
				Restricted: restricted, SourceRanges: admitted}
			rs.set(&s, i, local, used[slot])
			services = append(services, s)
		}
		used[slot] = true
	}
	return services, problems
}

// realServers are a Service's real servers of every kind, per port and
// family slot: the two tiers of the families in twoTierFams, the backends
// of the others, and the in-cluster endpoints of the families in
// inCluster.
type realServers struct {
	twoTier           [][2]tiers
	backends, cluster [][2][]ipvs.Backend
	twoTierFams       [2]bool
	inCluster         [2]bool
}

// serviceRealServers returns the real servers of the Service's virtual
// servers of the families fams, and the problems found on the way. The
// in-cluster endpoints are the Cluster policy's backends, for the two-tier
// families and, under Local, the one-tier ones.
func serviceRealServers(svc *v1.Service, endpointSlices []*discoveryv1.EndpointSlice, ports []svcspec.Port, view *View, fams [2]bool, local bool) (realServers, []string) {
	var rs realServers
	var problems []string
	if view.Tunnels != nil {
		// IPv4 VIPs go through two tiers, whatever the policy; IPv6 ones
		// with TunnelIPv6.
		rs.twoTierFams = [2]bool{fams[0], fams[1] && view.TunnelIPv6}
	}
	rs.inCluster = [2]bool{fams[0] && (rs.twoTierFams[0] || local), fams[1] && (rs.twoTierFams[1] || local)}
	if rs.twoTierFams[0] || rs.twoTierFams[1] {
		rs.twoTier, problems = twoTierBackends(svc, endpointSlices, ports, view, rs.twoTierFams)
		fams[0] = fams[0] && !rs.twoTierFams[0]
		fams[1] = fams[1] && !rs.twoTierFams[1]
	}
	zone := view.Node.Labels[v1.LabelTopologyZone]
	rs.backends = dataplaneBackends(svc, endpointSlices, ports, fams, view.Node.Name, zone, local)
	if rs.inCluster != [2]bool{} {
		rs.cluster = dataplaneBackends(svc, endpointSlices, ports, rs.inCluster, view.Node.Name, zone, false)
	}
	return rs, problems
}

// set gives s, the virtual server of port i, its real servers: the two
// tiers of its family when it has them, else the backends, with SNAT unless
// the policy is local; and its family's in-cluster endpoints. Once a
// family's were handed out (used), s gets copies. In two tiers, client
// affinity is tier 2's (ipvs.Service.Affinity) and tier 1's mh without
// port hashing, without IPVS persistence.
func (rs *realServers) set(s *ipvs.Service, i int, local, used bool) {
	slot := famSlot(s.VIP)
	if rs.inCluster[slot] {
		s.Cluster = rs.cluster[i][slot]
		if used {
			s.Cluster = slices.Clone(s.Cluster)
		}
	}
	if rs.twoTierFams[slot] {
		s.Affinity, s.Persistent = s.Persistent > 0, 0
		s.Backends, s.Local = rs.twoTier[i][slot].nodes, rs.twoTier[i][slot].local
		if used {
			s.Backends, s.Local = slices.Clone(s.Backends), slices.Clone(s.Local)
		}
		return
	}
	s.Backends, s.SNAT = rs.backends[i][slot], !local
	if used {
		s.Backends = slices.Clone(s.Backends)
	}
}

// tiers are one virtual server's real servers in the two-tier dataplane:
// the nodes (tier 1, at their tunnel addresses: view.tunnelsOf) and this
// node's endpoints of the VIP's family (tier 2).
type tiers struct {
	nodes, local []ipvs.Backend
}

// tunnelsOf returns the nodes' tunnel addresses that tier 1 sends the VIPs
// of family slot fam to: IPv6 VIPs go to Tunnels6 when set.
func (v *View) tunnelsOf(fam int) map[string]netip.Addr {
	if fam == 1 && v.Tunnels6 != nil {
		return v.Tunnels6
	}
	return v.Tunnels
}

// twoTierBackends returns, per port, the two tiers of the virtual servers
// of each family in fams (the pair is indexed by family, as
// dataplaneBackends' result):
//
//   - tier 1: one IPIP real server per node that hosts an endpoint of the
//     family, at the node's tunnel address (view.tunnelsOf: IPv4, or for
//     IPv6 VIPs IPv6 ones when there are) and the Service's port, weighted by its count of ready
//     endpoints (0 when all of them terminate: the node drains). The same
//     for every node and for both traffic policies, so every node sends a
//     flow to the same node, and that node keeps the client's address.
//   - tier 2: this node's endpoints of the family, as dataplaneBackends
//     gives them.
//
// An endpoint without nodeName, or on a node without tunnel address, has
// no way in: it is left out and reported. A node whose speaker is not
// ready (view.speakerReady) drains: see drainUnready.
func twoTierBackends(svc *v1.Service, endpointSlices []*discoveryv1.EndpointSlice, ports []svcspec.Port, view *View, fams [2]bool) ([][2]tiers, []string) {
	all := dataplaneBackendsByNode(svc, endpointSlices, ports)
	// Tier 2 is this node's endpoints under the Local rules: they fall
	// back to serving terminating ones when none of them is ready, even
	// while tier 1, whose weights follow every node's, sends this node
	// no new flow.
	locals := dataplaneBackends(svc, endpointSlices, ports, fams, view.Node.Name, "", true)
	out := make([][2]tiers, len(ports))
	var problems []string
	// unreachable: nodes without a way in, each with the kind of tunnel
	// address it lacks ("" or "IPv6 ").
	unreachable := map[string]map[string]bool{}
	nodeOf := map[netip.Addr]string{} // tunnel address → node name
	fallback := false                 // drainUnready fell back somewhere
	for i, p := range ports {
		for fam := range all[i] {
			if !fams[fam] {
				continue
			}
			for node, bs := range all[i][fam] {
				if node == view.Node.Name {
					out[i][fam].local = locals[i][fam]
				}
				tunnel, ok := view.tunnelsOf(fam)[node]
				if !ok || node == "" {
					kind := ""
					if fam == 1 && view.Tunnels6 != nil {
						kind = "IPv6 "
					}
					if unreachable[node] == nil {
						unreachable[node] = map[string]bool{}
					}
					unreachable[node][kind] = true
					continue
				}
				ready := 0
				for _, b := range sortBackends(bs) {
					if b.Weight > 0 {
						ready++
					}
				}
				out[i][fam].nodes = append(out[i][fam].nodes, ipvs.Backend{Addr: tunnel, Port: p.Port, Weight: ready, Tunnel: true})
				nodeOf[tunnel] = node
			}
			out[i][fam].nodes = sortBackends(out[i][fam].nodes)
			if drainUnready(out[i][fam].nodes, nodeOf, view) {
				fallback = true
			}
		}
	}
	if fallback {
		problems = append(problems, "no node whose speaker is ready hosts a ready endpoint: tier 1 sends new flows to the nodes whose speaker is not ready rather than refuse them")
	}
	for _, node := range slices.Sorted(maps.Keys(unreachable)) {
		if node == "" {
			problems = append(problems, "endpoints without nodeName get no traffic: the two-tier dataplane sends a flow to the node of its endpoint")
			continue
		}
		for _, kind := range slices.Sorted(maps.Keys(unreachable[node])) {
			problems = append(problems, fmt.Sprintf("endpoints on node %s get no traffic: that node has no %stunnel address (is its speaker running with the two-tier dataplane?)", node, kind))
		}
	}
	return out, problems
}

// drainUnready gives weight 0 to the tier-1 real servers (nodes, by
// tunnel address in nodeOf) whose node's speaker is not ready, so that no
// new flow goes to a node that may not decapsulate it (no speaker, one
// that crash-loops or lacks the tunnel), while the flows it already has go
// on. When that leaves no weight at all but the nodes had some, it keeps
// them as they were, as kube-proxy falls back to terminating endpoints: a
// node whose speaker restarts keeps its kernel state and still serves, and
// trying it is better than refusing every new flow. It reports whether it
// fell back.
func drainUnready(nodes []ipvs.Backend, nodeOf map[netip.Addr]string, view *View) (fellBack bool) {
	if view.SpeakersReady == nil {
		return false
	}
	readyWeight, unready := 0, 0
	for _, b := range nodes {
		if view.speakerReady(nodeOf[b.Addr]) {
			readyWeight += b.Weight
		} else if b.Weight > 0 {
			unready++
		}
	}
	if unready == 0 {
		return false
	}
	if readyWeight == 0 {
		return true
	}
	for i := range nodes {
		if !view.speakerReady(nodeOf[nodes[i].Addr]) {
			nodes[i].Weight = 0
		}
	}
	return false
}

// dataplaneBackendsByNode returns, per port and family, the backends of
// every node by node name ("" for endpoints without one), with the rules
// of dataplaneBackends.
func dataplaneBackendsByNode(svc *v1.Service, endpointSlices []*discoveryv1.EndpointSlice, ports []svcspec.Port) [][2]map[string][]ipvs.Backend {
	out := make([][2]map[string][]ipvs.Backend, len(ports))
	for i := range out {
		out[i] = [2]map[string][]ipvs.Backend{{}, {}}
	}
	rd := scanEndpoints(svc, endpointSlices, ports, "", "")
	targets := make([]uint16, len(ports))
	for _, s := range endpointSlices {
		slot, ok := sliceSlot(s)
		if !ok || len(s.Endpoints) == 0 || !ownSlice(svc, s) || !sliceTargets(s, ports, targets) {
			continue
		}
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			addr, ok := endpointAddr(e)
			st := stateOf(e)
			if !ok || famSlot(addr) != slot {
				continue
			}
			node := ""
			if e.NodeName != nil {
				node = *e.NodeName
			}
			for j, tp := range targets {
				if tp != 0 && st.keptFor(ports[j].Proto) {
					out[j][slot][node] = append(out[j][slot][node], ipvs.Backend{Addr: addr, Port: tp, Weight: st.weight(rd[j][slot].fallback(false))})
				}
			}
		}
	}
	return out
}

// sessionPersistence returns the IPVS persistence timeout in seconds for
// sessionAffinity ClientIP (its timeoutSeconds, or the API's default when
// unset or not positive), and 0 for None.
func sessionPersistence(svc *v1.Service) uint32 {
	if svc.Spec.SessionAffinity != v1.ServiceAffinityClientIP {
		return 0
	}
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil && *c.ClientIP.TimeoutSeconds > 0 {
		return uint32(*c.ClientIP.TimeoutSeconds)
	}
	return uint32(v1.DefaultClientIPServiceAffinitySeconds)
}

// clientAffinity returns the scheduler and flags of a Service with
// sessionAffinity ClientIP: mh (the default) without port hashing, so that
// every node sends all of one client's connections to the same real
// server. ECMP spreads a client's connections over the nodes by their
// source ports, and each node's IPVS persistence is its own: with the port
// in the hash, each node would pick its own real server (as Cilium, which
// leaves the port out of its Maglev hash for ClientIP). Another scheduler
// keeps its flags; its affinity holds per node only. Without persistence
// (sessionAffinity None) sched and flags are returned as they are.
func clientAffinity(sched string, flags, persistent uint32) (string, uint32) {
	switch {
	case persistent == 0:
		return sched, flags
	case sched == "":
		return ipvs.DefaultScheduler, ipvs.DefaultSchedulerFlags &^ ipvs.FlagMHPort
	case sched == ipvs.DefaultScheduler:
		return sched, flags &^ ipvs.FlagMHPort
	}
	return sched, flags
}

// dataplaneBackends returns, per port (indexed like ports) and per family
// slot, the sorted, deduplicated backends of the families in fams, for the
// node nodeName in zone. Under Cluster policy a ready endpoint that the
// hints' topology leaves out gets weight 0: no new flows, its own kept.
func dataplaneBackends(svc *v1.Service, endpointSlices []*discoveryv1.EndpointSlice, ports []svcspec.Port, fams [2]bool, nodeName, zone string, local bool) [][2][]ipvs.Backend {
	out := backendBuffers(svc, endpointSlices, len(ports), fams, nodeName, local)
	rd := scanEndpoints(svc, endpointSlices, ports, nodeName, zone)
	targets := make([]uint16, len(ports)) // target port per ServicePort in the current slice
	for _, s := range endpointSlices {
		slot, ok := sliceSlot(s)
		if !ok || !fams[slot] || len(s.Endpoints) == 0 || !ownSlice(svc, s) || !sliceTargets(s, ports, targets) {
			continue
		}
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			if local && !onNode(e, nodeName) {
				continue
			}
			addr, ok := endpointAddr(e)
			st := stateOf(e)
			if !ok || famSlot(addr) != slot {
				continue
			}
			for j, tp := range targets {
				if tp == 0 || !st.keptFor(ports[j].Proto) {
					continue
				}
				w := st.weight(rd[j][slot].fallback(local))
				if !local && !rd[j][slot].topology().admits(e, nodeName, zone) {
					w = 0
				}
				out[j][slot] = append(out[j][slot], ipvs.Backend{Addr: addr, Port: tp, Weight: w})
			}
		}
	}
	for i := range out {
		for slot := range out[i] {
			if bs := sortBackends(out[i][slot]); len(bs) > 0 {
				out[i][slot] = bs
			} else {
				out[i][slot] = nil
			}
		}
	}
	return out
}

// backendBuffers returns, per port and family slot, an empty slice whose
// capacity is the count of candidate endpoints: one backing array per
// family, carved per port with its capacity capped, so that the appends of
// dataplaneBackends never reallocate.
func backendBuffers(svc *v1.Service, endpointSlices []*discoveryv1.EndpointSlice, nports int, fams [2]bool, nodeName string, local bool) [][2][]ipvs.Backend {
	var n [2]int
	for _, s := range endpointSlices {
		slot, ok := sliceSlot(s)
		if !ok || !fams[slot] || !ownSlice(svc, s) {
			continue
		}
		if !local {
			n[slot] += len(s.Endpoints)
			continue
		}
		for i := range s.Endpoints {
			if onNode(&s.Endpoints[i], nodeName) {
				n[slot]++
			}
		}
	}
	out := make([][2][]ipvs.Backend, nports)
	for slot := range n {
		if n[slot] == 0 {
			continue
		}
		buf := make([]ipvs.Backend, n[slot]*nports)
		for i := range out {
			out[i][slot] = buf[i*n[slot] : i*n[slot] : (i+1)*n[slot]]
		}
	}
	return out
}

// sliceTargets sets targets[i] to the port of s named like ports[i] with
// its protocol, or 0, and reports whether any is set.
func sliceTargets(s *discoveryv1.EndpointSlice, ports []svcspec.Port, targets []uint16) bool {
	found := false
	for i, p := range ports {
		targets[i] = 0
		for _, sp := range s.Ports {
			if sp.Port == nil || *sp.Port < 1 || *sp.Port > 65535 {
				continue
			}
			var name, proto string
			if sp.Name != nil {
				name = *sp.Name
			}
			if sp.Protocol != nil {
				proto = string(*sp.Protocol)
			}
			if name != p.Name {
				continue
			}
			if pr, err := ipvs.ParseProtocol(proto); err != nil || pr != p.Proto {
				continue
			}
			targets[i] = uint16(*sp.Port)
			found = true
			break
		}
	}
	return found
}

// sortBackends sorts bs by address and port and removes duplicates, the
// highest weight (ready) winning.
func sortBackends(bs []ipvs.Backend) []ipvs.Backend {
	if len(bs) < 2 {
		return bs
	}
	slices.SortFunc(bs, func(a, b ipvs.Backend) int {
		return cmp.Or(a.AddrPort().Compare(b.AddrPort()), cmp.Compare(b.Weight, a.Weight))
	})
	return slices.CompactFunc(bs, func(a, b ipvs.Backend) bool { return a.AddrPort() == b.AddrPort() })
}
