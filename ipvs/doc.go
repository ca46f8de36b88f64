// Package ipvs is vipcast's dataplane: it turns the desired virtual and real
// servers into the minimal set of kernel IPVS changes (github.com/moby/ipvs),
// keeps the VIPs on a local dummy link (github.com/vishvananda/netlink) and
// source-NATs the connections of externalTrafficPolicy Cluster Services and
// drops the traffic to a VIP that none of its virtual servers takes (the VIP
// filter; nftables over netlink, github.com/google/nftables). It is the only
// package that imports those libraries.
//
// Pure logic and I/O are apart:
//
//   - Service, Backend, State, Key: what a node wants (or has);
//   - FilterOf(desired) and DiffFilter(want, have): the VIP filter's sets
//     from the desired state, and the element changes (filter.go);
//   - Diff(desired, actual) and DiffService(key, desired, actual): the
//     minimal Plan, which never touches a virtual server vipcast does not
//     own (ownership: the VIP is one of vipcast's, that is desired or
//     bound to vipcast's dummy link); Plan.ApplyTo performs a plan in
//     memory;
//   - Tier2Of(desired) and DiffTier2(want, have): the two-tier dataplane's
//     tier-2 map and its element changes (tier2.go; the node side is
//     tunnel.go and tunnelnode.go, on with Options.Tunnel);
//   - Dataplane: New (dummy link, IPVS and nftables handles), Read, Apply,
//     Sync (full read + diff + apply: start-up and periodic drift repair)
//     and SyncService (one Service, from the in-memory state: the
//     per-EndpointSlice path, no kernel read); Teardown takes everything
//     it owns out of the kernel, for a node vipcast leaves (uninstalled).
//
// The Dataplane's optional parts are components New chooses once, so that
// Sync, SyncService and Apply take one path whatever the options:
//
//   - tiers (twotier.go): oneTier, or twoTiers with Options.Tunnel: the
//     node's side of the tunnels, what a virtual server may ask for, and
//     the socket for the real servers moby/ipvs cannot program;
//   - slotMap (slotmap.go): tier 2's map and the in-cluster map
//     (incluster.go), each on or off; an off map reads and plans nothing;
//   - conntrack (staleflows.go): the stale UDP and SCTP flows of the
//     plans, while a slot map is on;
//   - connSyncer (connsyncer.go): the IPVS sync daemons of
//     Options.ConnSync (connsync.go) and their relay (syncrelay.go).
//
// Short of Teardown, nothing is ever flushed: a restarted speaker reads
// the kernel, finds what it wants already there and changes nothing, so
// established connections survive. A terminating endpoint is a Backend
// with weight 0: it keeps its connections and gets no new ones.
//
// Its kernel tests run inside a real Debian kernel under qemu
// (github.com/vipcast/vipcast/test/vm), since CI hosts often lack IPVS.
package ipvs
