package speaker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/ipvs"
)

// syncConfig recomputes everything, in four steps: this node's view of the
// pools and peers; the dataplane (with full, by comparing the whole kernel
// table, else Service by Service from what it last programmed); every
// Service's routes; the sessions. The dataplane comes before the routes: a
// VIP is announced only once this node can forward its traffic; the routes
// come before the sessions, so a new session gets the whole table at once.
func (c *Controller) syncConfig(ctx context.Context, full bool) error {
	start := time.Now()
	node, peers, err := c.syncView(ctx)
	if err != nil {
		return err
	}
	// Until a first full sync has succeeded every sync is a full one.
	full = full || !c.HasSynced()
	// One read of the caches for both the dataplane and the routes: a
	// Service (or an endpoint) that arrives in between is programmed and
	// announced by its own sync, queued by its event, never announced
	// here before its virtual servers exist.
	snap := c.snapshot()
	dpErr := c.syncDataplane(ctx, full, snap)
	if dpErr != nil && full && !c.HasSynced() {
		// Announcing VIPs this node cannot forward would black-hole
		// their traffic: no routes and no sessions until the dataplane
		// works.
		return dpErr
	}
	announced, withdrawn, err := c.ann.syncAll(ctx, c.routesOf(snap))
	if err != nil {
		return err
	}
	sessions, err := c.syncSessions(ctx, peers, node)
	if err != nil {
		return err
	}
	c.setSynced(time.Now(), sessions) // the table is in BGP and the sessions are configured
	c.opts.Metrics.observeSync("config", start)
	c.queue.AddAfter(keyStatus, statusCompute)
	klog.FromContext(ctx).V(2).Info("Configuration synced", "peers", len(sessions), "routes", c.ann.table.Len(),
		"announced", announced, "withdrawn", withdrawn, "duration", time.Since(start))
	return dpErr
}

// syncNodes follows a change of other nodes (with two tiers: a node's
// NodeTunnel added, deleted, given another address or Announces): the tunnel addresses, the
// routes to them, the tunnel guard and the relay's peers, then the
// Services with endpoints on those nodes, whose tier 1 names their tunnel
// addresses — not every Service, as a full sync would at every node's
// add or delete anywhere in the cluster. A change of this node, or one
// before the first full sync, is a full sync's. The problems with tunnel
// addresses are reported by the next full sync (every --resync-period).
func (c *Controller) syncNodes(ctx context.Context) error {
	nodes := c.watch.takeChangedNodes()
	if !c.HasSynced() || c.view == nil || slices.Contains(nodes, c.opts.NodeName) {
		return c.syncConfig(ctx, false)
	}
	defer c.opts.Metrics.observeSync("nodes", time.Now())
	node, err := c.watch.currentNode()
	if err != nil {
		return err
	}
	self, _ := NodeFrom(node)
	tunnels, tunnels6, problems := c.syncTunnels(ctx, self, node.UID, c.watch.listPeers(ctx))
	if len(problems) > 0 {
		klog.FromContext(ctx).V(2).Info("Tunnel problems after a change of nodes", "nodes", nodes, "problems", problems)
	}
	c.view.Tunnels, c.view.Tunnels6 = tunnels, tunnels6
	if tunnels != nil && c.view.SpeakersReady != nil {
		c.reportTier1(ctx, tunnels, c.view)
	}
	for _, key := range c.watch.servicesOnNodes(nodes) {
		if err := c.syncService(ctx, key); err != nil {
			// Retried alone, as its own key.
			klog.FromContext(ctx).Error(err, "Sync failed; retrying", "key", key)
			c.queue.AddRateLimited(key)
		}
	}
	return nil
}

// syncView compiles this node's View of the pools and peers into c.view,
// reporting problems with the node and the pools; it returns the node and
// the peers for the sessions step.
func (c *Controller) syncView(ctx context.Context) (Node, []*vipcastv1alpha1.BGPPeer, error) {
	node, err := c.watch.currentNode()
	if err != nil {
		return Node{}, nil, err
	}
	n, nodeErrs := NodeFrom(node)
	peers := c.watch.listPeers(ctx)
	var tunnels, tunnels6 map[string]netip.Addr
	if c.opts.TunnelPrefix.IsValid() {
		var problems []string
		tunnels, tunnels6, problems = c.syncTunnels(ctx, n, node.UID, peers)
		for _, p := range problems {
			nodeErrs = append(nodeErrs, errors.New(p))
		}
	}
	if p := c.connSyncProblem(); p != nil {
		nodeErrs = append(nodeErrs, p)
	}
	on6, why6 := c.twoTierIPv6()
	if c.opts.TunnelPrefix6.IsValid() && !on6 && why6 != nil {
		// The other nodes send this node's share of IPv6 VIP flows to its
		// IPv6 tunnel address, which it cannot take.
		nodeErrs = append(nodeErrs, fmt.Errorf("--tunnel-prefix has an IPv6 prefix, but IPv6 VIPs keep one tier on this node, and flows the other nodes send to its IPv6 endpoints are lost: %w", why6))
	}
	c.report.nodeProblems(ctx, node, nodeErrs)
	view, poolErrs := Compile(c.watch.listPools(ctx), peers, n)
	view.Classes = c.opts.Classes
	view.Tunnels = tunnels
	view.TunnelIPv6 = tunnels != nil && on6
	view.Tunnels6 = tunnels6
	if tunnels != nil {
		view.SpeakersReady = c.watch.speakersReady()
		c.reportTier1(ctx, tunnels, view)
	}
	c.report.poolProblems(ctx, poolErrs)
	c.view = view
	return n, peers, nil
}

// maxUnreadyLogged bounds the nodes a tier-1 log line names.
const maxUnreadyLogged = 10

// reportTier1 says which nodes with a tunnel address tier 1 takes as not
// ready (view.speakerReady): the metric, and a log line when that set
// changes.
func (c *Controller) reportTier1(ctx context.Context, tunnels map[string]netip.Addr, view *View) {
	if view.SpeakersReady == nil {
		return
	}
	var unready []string
	for _, name := range slices.Sorted(maps.Keys(tunnels)) {
		if !view.speakerReady(name) {
			unready = append(unready, name)
		}
	}
	c.opts.Metrics.setTier1Nodes(len(tunnels)-len(unready), len(unready))
	msg := strings.Join(unready, ",")
	if msg == c.unready {
		return
	}
	c.unready = msg
	shown := unready[:min(len(unready), maxUnreadyLogged)]
	klog.FromContext(ctx).Info("Tier 1 sends no new flows to nodes whose speaker is not ready (no ready endpoint of the speakers' Service there)",
		"service", c.opts.SpeakerService, "notReady", len(unready), "nodes", shown, "ready", len(tunnels)-len(unready))
}

// connSyncProblem is why the Dataplane runs without the connection sync
// it was asked for (its ConnSyncProblem), as a problem of this node's
// configuration.
func (c *Controller) connSyncProblem() error {
	if c.opts.Dataplane == nil {
		return nil
	}
	if err := c.opts.Dataplane.ConnSyncProblem(); err != nil {
		return fmt.Errorf("--conn-sync-interface, --conn-sync-transport: the IPVS sync daemons (or their relay) did not start, and this node serves without them (a flow that ECMP moves here after the nodes' endpoints changed is reset): %w", err)
	}
	return nil
}

// twoTierIPv6 reports whether the Dataplane gives IPv6 VIPs the two tiers
// too (its TwoTierIPv6); otherwise they keep one, and why says why (nil
// without a Dataplane).
func (c *Controller) twoTierIPv6() (on bool, why error) {
	if c.opts.Dataplane == nil {
		return false, nil
	}
	return c.opts.Dataplane.TwoTierIPv6()
}

// setBFDGuard sets the host guard's BFD peers (when there is a dataplane)
// and records them; on failure it keeps the record, so that the next call
// still lets them in, and retries the configuration.
func (c *Controller) setBFDGuard(ctx context.Context, peers []netip.Addr) {
	if c.opts.Dataplane == nil {
		return
	}
	if err := c.opts.Dataplane.SetBFDPeers(peers); err != nil {
		klog.FromContext(ctx).Error(err, "The host guard's BFD peers are not set: a new peer's BFD packets may be dropped until they are")
		c.queue.AddRateLimited(keyConfig)
		return
	}
	c.bfdGuarded = peers
}

// union returns the addresses in a or b, sorted, without duplicates.
func union(a, b []netip.Addr) []netip.Addr {
	out := slices.Concat(a, b)
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// bfdPeers returns the addresses of the peers with BFD, sorted, without
// duplicates.
func bfdPeers(peers []bgp.Peer) []netip.Addr {
	var out []netip.Addr
	for _, p := range peers {
		if p.BFD != nil {
			out = append(out, p.Address)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// syncTunnels derives every node's tunnel address (and with
// TunnelPrefix6 its IPv6 one) and routes this node's kernel to the
// others' through their node addresses of the family; it returns the
// tunnel addresses by node name and the problems to report (nodes without
// one, malformed NodeTunnels, routes the kernel refused). The other nodes
// come from their NodeTunnels, this node (self, its Node's uid) from its
// Node, and its own NodeTunnel is published to say so. It also gives the
// relay its peers, the other nodes that announce.
func (c *Controller) syncTunnels(ctx context.Context, self Node, uid types.UID, peers []*vipcastv1alpha1.BGPPeer) (tunnels, tunnels6 map[string]netip.Addr, problems []string) {
	nodes, problems := c.watch.tunnelNodes(ctx)
	spec := nodeTunnelSpec(self, peers)
	nodes = slices.DeleteFunc(nodes, func(n tunnelNode) bool { return n.Name == self.Name })
	nodes = append(nodes, tunnelNode{Name: self.Name, IPv4: self.IPv4, IPv6: self.IPv6, Announces: spec.Announces})
	if c.tunnelPub != nil {
		c.tunnelPub.set(uid, spec)
	}
	addrs, addrs6 := make(map[string]netip.Addr, len(nodes)), make(map[string]netip.Addr, len(nodes))
	for _, n := range nodes {
		addrs[n.Name], addrs6[n.Name] = n.IPv4, n.IPv6
	}
	var p []string
	tunnels, p = Tunnels(c.opts.TunnelPrefix, addrs)
	problems = append(problems, p...)
	if c.opts.TunnelPrefix6.IsValid() {
		tunnels6, p = Tunnels(c.opts.TunnelPrefix6, addrs6)
		problems = append(problems, p...)
	}
	dp := c.opts.Dataplane
	if dp == nil {
		return tunnels, tunnels6, problems
	}
	routes := make(map[netip.Addr]netip.Addr, len(tunnels)+len(tunnels6))
	for name, t := range tunnels {
		if name != self.Name {
			routes[t] = addrs[name]
		}
	}
	for name, t := range tunnels6 {
		if name != self.Name {
			routes[t] = addrs6[name]
		}
	}
	if err := dp.SetTunnelRoutes(routes); err != nil {
		problems = append(problems, fmt.Sprintf("routes to the other nodes' tunnel addresses: %v", err))
	}
	if err := dp.SetTunnelSources(tunnelSources(addrs, addrs6, tunnels, tunnels6)); err != nil {
		problems = append(problems, fmt.Sprintf("sources of tunnelled packets: %v", err))
	}
	// The relay listens on this node's IPv4 InternalIP.
	dp.SetSyncPeers(relayPeers(self.Name, nodes))
	klog.FromContext(ctx).V(4).Info("Tunnel addresses", "nodes", len(tunnels), "ipv6", len(tunnels6), "routes", len(routes))
	return tunnels, tunnels6, problems
}

// tunnelSources returns every address the nodes send tunnelled packets
// from: their node addresses of both families (a node's tier 1 sends from
// the address of its route to the other node's tunnel address, which goes
// through that node's address of the family), and their tunnel addresses;
// sorted, without duplicates.
func tunnelSources(maps ...map[string]netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, m := range maps {
		for _, a := range m {
			if a.IsValid() {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// syncDataplane programs every Service's virtual servers: with full, by a
// resync against the kernel table; else Service by Service, from what was
// last programmed, also removing those of Services gone from the cache.
//
// A Service whose virtual servers the kernel refuses fails alone: it gets
// a Warning Event, is not announced (see serviceRoutes) and its key is
// queued with backoff, which retries it alone. The error returned is what
// failed beyond single Services.
func (c *Controller) syncDataplane(ctx context.Context, full bool, snap []serviceSnapshot) error {
	if c.prog == nil {
		return nil
	}
	if full {
		all := make([]serviceServers, 0, len(snap))
		for _, s := range snap {
			all = append(all, serviceServers{ServiceKey(s.svc), c.desiredFor(ctx, s.svc, s.slices)})
		}
		refused, err := c.prog.resync(ctx, all)
		if err != nil {
			return err
		}
		for _, s := range snap {
			c.report.dataplaneRefused(ctx, s.svc, c.prog.refusal(ServiceKey(s.svc)))
		}
		for _, key := range refused {
			c.queue.AddRateLimited(key)
		}
		return nil
	}
	var errs []error
	inSnap := make(map[string]bool, len(snap))
	for _, s := range snap {
		key := ServiceKey(s.svc)
		inSnap[key] = true
		err := c.prog.program(key, c.desiredFor(ctx, s.svc, s.slices))
		c.report.dataplaneRefused(ctx, s.svc, c.prog.refusal(key))
		if err != nil {
			c.queue.AddRateLimited(key) // retried alone
		}
	}
	for key := range c.prog.programmed {
		if !inSnap[key] {
			errs = append(errs, c.prog.program(key, nil))
		}
	}
	return errors.Join(errs...)
}

// serviceSnapshot is one Service and its EndpointSlices as the caches held
// them at one moment.
type serviceSnapshot struct {
	svc    *v1.Service
	slices []*discoveryv1.EndpointSlice
}

// snapshot reads every Service and its EndpointSlices from the caches.
func (c *Controller) snapshot() []serviceSnapshot {
	services := c.watch.listServices()
	out := make([]serviceSnapshot, 0, len(services))
	held := 0
	for _, svc := range services {
		slices, n := c.watch.heldSlicesOf(svc)
		held += n
		out = append(out, serviceSnapshot{svc, slices})
	}
	c.opts.Metrics.setOutageHeld(held)
	return out
}

// routesOf yields every Service of snap with its routes, and records anew
// why this node announces none for some (notAnnounced).
func (c *Controller) routesOf(snap []serviceSnapshot) func(yield func(string, []bgp.Route) bool) {
	return func(yield func(string, []bgp.Route) bool) {
		fresh := map[string]bool{}
		seen := make(map[string]bool, len(snap))
		for _, s := range snap {
			seen[ServiceKey(s.svc)] = true
			routes, why := c.serviceRoutes(s.svc, s.slices)
			if c.unannounced(s.svc, why) {
				fresh[ServiceKey(s.svc)] = true
			}
			if !yield(ServiceKey(s.svc), routes) {
				return
			}
		}
		c.handovers.forget(seen)
		c.notAnnounced = fresh
	}
}

// unannounced reports whether svc belongs in the SpeakerStatus's
// notAnnounced: a Service vipcast serves, with a VIP in its status, that
// ServiceRoutes gave a reason for (some VIP without a route here).
func (c *Controller) unannounced(svc *v1.Service, why string) bool {
	return why != "" && len(svc.Status.LoadBalancer.Ingress) > 0 && c.opts.Classes.Serves(svc)
}

// publishStatus hands the status writer this node's SpeakerStatus, once
// the first full sync has computed it.
func (c *Controller) publishStatus(ctx context.Context) error {
	if !c.HasSynced() {
		return nil // the first sync queues keyStatus
	}
	node, err := c.watch.currentNode()
	if err != nil {
		return err
	}
	sessions, err := c.opts.BGP.Sessions(ctx)
	if err != nil {
		return fmt.Errorf("reading the BGP sessions: %w", err)
	}
	c.report.prefixCount(ctx, node, c.ann.table.Len(), c.opts.PrefixWarning)
	var refused map[string]string
	if c.prog != nil {
		refused = c.prog.refusedMessages()
	}
	c.status.set(node, BuildSpeakerStatus(sessions, c.ann.table.Len(), c.ann.table.First(vipcastv1alpha1.MaxSpeakerStatusAnnounced),
		len(c.notAnnounced), refused, c.opts.Classes))
	return nil
}

// serviceRoutes is ServiceRoutes, except that a Service whose virtual
// servers the dataplane refused has none (this node cannot serve it), and
// that the routes of a Local handover stay for Options.Handover
// (handovers), the Service looked at again when it ends.
func (c *Controller) serviceRoutes(svc *v1.Service, eps []*discoveryv1.EndpointSlice) ([]bgp.Route, string) {
	key := ServiceKey(svc)
	if c.prog != nil {
		if err := c.prog.refusal(key); err != nil {
			c.handovers.end(key)
			return nil, "dataplane refused it: " + err.Error()
		}
	}
	routes, handover, why := serviceRoutes(svc, eps, c.view)
	keep, again := c.handovers.keep(key, handover, c.ann.table.ServiceRoutes(key), time.Now())
	if len(keep) > 0 {
		routes = append(routes, keep...)
		slices.SortFunc(routes, func(a, b bgp.Route) int { return comparePrefix(a.Prefix, b.Prefix) })
		// A fixed text: the reason is in the SpeakerStatus, which a text
		// that changed each sync would rewrite each time.
		why += " (announced for --convergence-delay more, while the routers learn the other nodes' routes)"
		c.queue.AddAfter(key, again)
	}
	return routes, why
}

// syncSessions configures this node's BGP sessions, reporting the peers it
// cannot use; it returns the count of sessions.
func (c *Controller) syncSessions(ctx context.Context, peers []*vipcastv1alpha1.BGPPeer, node Node) ([]string, error) {
	bgpPeers, problems := PeersForNode(peers, node, c.watch.passwords())
	c.report.peerProblems(ctx, peers, problems)
	// The host guard lets a new BFD peer in before its session starts (its
	// first packets must get in) and shuts an old one out only once its
	// session has stopped: a guard narrowed first drops the router's
	// packets to a session still running, which then goes down on its
	// detection time and resets BGP, where it should have ended
	// AdminDown. A failure does not hold the sessions back; the
	// configuration is synced again after a back-off.
	want := bfdPeers(bgpPeers)
	c.setBFDGuard(ctx, union(c.bfdGuarded, want))
	if err := c.opts.BGP.SetPeers(ctx, bgpPeers); err != nil {
		return nil, fmt.Errorf("configuring BGP peers: %w", err)
	}
	c.setBFDGuard(ctx, want)
	names := make([]string, 0, len(bgpPeers))
	for _, p := range bgpPeers {
		names = append(names, p.Name)
	}
	return names, nil
}

// syncService recomputes one Service's virtual servers and routes. The
// dataplane goes first; routes go either way (a withdrawal must not wait
// for the kernel), and a dataplane error retries the key.
func (c *Controller) syncService(ctx context.Context, key string) error {
	if c.view == nil || !c.HasSynced() {
		return nil // the first full sync has not succeeded; it covers this key
	}
	start := time.Now()
	svc, err := c.watch.service(key)
	if err != nil {
		return err
	}
	defer c.queue.AddAfter(keyStatus, statusCompute)
	if svc == nil {
		delete(c.notAnnounced, key)
		c.handovers.end(key)
		c.report.forgetService(key)
		dpErr := c.program(key, nil)
		return errors.Join(dpErr, c.ann.deleteService(ctx, key))
	}
	slices := c.watch.slicesOf(svc)
	dpErr := c.program(key, c.desiredFor(ctx, svc, slices))
	if c.prog != nil {
		c.report.dataplaneRefused(ctx, svc, c.prog.refusal(key))
	}
	routes, why := c.serviceRoutes(svc, slices)
	if c.unannounced(svc, why) {
		c.notAnnounced[key] = true
		if len(routes) == 0 {
			klog.FromContext(ctx).V(2).Info("Not announcing", "service", key, "reason", why)
		}
	} else {
		delete(c.notAnnounced, key)
	}
	if err := c.ann.setService(ctx, key, routes); err != nil {
		return errors.Join(dpErr, err)
	}
	c.opts.Metrics.observeSync("service", start)
	return dpErr
}

// desiredFor computes one Service's virtual servers (none without a
// dataplane) and reports a changed problem with its annotations or ports.
func (c *Controller) desiredFor(ctx context.Context, svc *v1.Service, slices []*discoveryv1.EndpointSlice) []ipvs.Service {
	if c.prog == nil {
		return nil
	}
	services, problems := ServiceDataplane(svc, slices, c.view)
	c.report.dataplaneProblems(ctx, svc, problems)
	return services
}

// program applies one Service's virtual servers when there is a dataplane.
func (c *Controller) program(key string, desired []ipvs.Service) error {
	if c.prog == nil {
		return nil
	}
	return c.prog.program(key, desired)
}
