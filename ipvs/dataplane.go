package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultLinkName is the dummy link that carries the VIPs.
const DefaultLinkName = "vipcast0"

// Options configure a Dataplane.
type Options struct {
	// LinkName is the dummy link holding the VIPs (default "vipcast0").
	// Every address on it is a vipcast VIP: see Diff for ownership.
	LinkName string
	// NoSNAT leaves net.ipv4.vs.conntrack and the source NAT set alone; a
	// Service with SNAT is then refused. By default New sets up source NAT
	// (see snat.go).
	NoSNAT bool
	// NoFilter leaves the VIP filter's sets alone (filter.go): the VIPs
	// then answer on every port of the node. With NoSNAT too, New does not
	// touch nftables at all (a read-only Dataplane, for inspection).
	NoFilter bool
	// Tunnel turns on the two-tier dataplane (tunnel.go): virtual servers
	// with Backend.Tunnel real servers and Service.Local endpoints. It needs
	// the VIP filter, and refuses Services with SNAT. Without it, New takes
	// away the two-tier chains a previous run left.
	Tunnel *Tunnel
	// ConnSync, when set, runs the kernel's IPVS sync daemons so that
	// every node knows the other nodes' tier-1 connections (connsync.go;
	// it needs Tunnel), or with ConnSync.Off stops those that run with its
	// ID (an earlier run's). Nil leaves the daemons alone. Daemons that
	// cannot start (a link that does not exist) do not fail New: the
	// Dataplane runs without them and ConnSyncProblem says why.
	ConnSync *ConnSync
	// HostGuard says who may reach the speaker's metrics listener
	// (hostguard.go); the guard's BFD rule follows SetBFDPeers. Without
	// nftables (NoSNAT and NoFilter) there is no guard.
	HostGuard HostGuard
	// PodCIDRs are the pods' addresses (kube-proxy's --cluster-cidr): their
	// connections to a virtual server of one tier with Cluster endpoints
	// go to one of them (incluster.go). None: they go through IPVS, as
	// connections from outside the node do. The node's own connections
	// use the Cluster endpoints either way. The in-cluster map needs
	// source NAT; without it (NoSNAT, or InClusterProblem) Service.Cluster
	// is ignored.
	PodCIDRs []netip.Prefix
}

// Dataplane programs the kernel of this node: IPVS virtual and real servers
// over generic netlink (github.com/moby/ipvs) and the VIPs on a dummy link
// (rtnetlink). It keeps the state it last applied in memory so that
// SyncService costs kernel work for one service only; Sync re-reads the
// kernel and repairs drift. Its methods are safe for concurrent use (they
// are serialised).
type Dataplane struct {
	mu    sync.Mutex
	ipvs  *libipvs.Handle
	nl    *netlink.Handle
	link  netlink.Link
	name  string
	nft   *nftTables // nil with Options.NoSNAT and NoFilter
	snat  bool       // source NAT is on
	guard bool       // the VIP filter is on
	// tiers forwards with one tier, or with two with Options.Tunnel
	// (twotier.go).
	tiers tiers
	// tier2 and cluster are the slot maps (slotmap.go), each as last read
	// plus what was applied since (valid with cache): tier 2, on with
	// Options.Tunnel, and the in-cluster map, on with source NAT unless
	// its chains could not be made.
	tier2, cluster *slotMap
	// ct finds the stale flows of the plans and clears their conntrack
	// entries (staleflows.go): with a slot map on; nil otherwise.
	ct *conntrack
	// connSync runs the connection sync of Options.ConnSync
	// (connsyncer.go); nil when none was asked for.
	connSync *connSyncer
	// staleErr is why net.ipv4.vs.expire_nodest_conn is not 1 (nil: it
	// is): see StaleFlowsProblem.
	staleErr error
	// hairpin are the endpoints the hairpin sets hold, by virtual server
	// (hairpin.go).
	hairpin hairpins
	cache   State // the kernel as last read, plus what was applied since
	// filter is the VIP filter as last read, plus what was applied since
	// (valid with cache).
	filter Filter
	stale  bool // cache invalid (never read, or an Apply failed)
	// closed: the handles are released (Close, or a Teardown that
	// succeeded: then torn too).
	closed, torn bool
}

// New opens the IPVS and rtnetlink handles and ensures the dummy link exists
// and is up (it is created when missing; an existing link is kept with its
// addresses, which are the VIPs of a previous run).
func New(opts Options) (*Dataplane, error) {
	if opts.LinkName == "" {
		opts.LinkName = DefaultLinkName
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	// NETLINK_ROUTE only: the default handle also opens XFRM and netfilter
	// sockets, which kernels without those fail to open.
	nh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("rtnetlink: %w", err)
	}
	link, err := ensureDummy(nh, opts.LinkName)
	if err != nil {
		nh.Close()
		return nil, err
	}
	ih, err := libipvs.New("")
	if err != nil {
		nh.Close()
		return nil, fmt.Errorf("ipvs netlink: %w (is the ip_vs module loaded?)", err)
	}
	d := &Dataplane{ipvs: ih, nl: nh, link: link, name: opts.LinkName, stale: true,
		snat: !opts.NoSNAT, guard: !opts.NoFilter, filter: NewFilter(), tiers: oneTier{},
		tier2: newTier2Map(opts.Tunnel != nil), cluster: newInClusterMap(!opts.NoSNAT)}
	if err := enableExpireNodest(); err != nil {
		d.staleErr = fmt.Errorf("%w: the flows of a deleted real server are dropped until their entries time out (UDP: 300 s) instead of going to another one; prepare the node (`vipcast-speaker %s` in a privileged init container, speaker.ipvs.prepareNode: true) or set net.ipv4.vs.expire_nodest_conn=1 on it", err, PrepareNodeCommand)
	}
	tiers, err := newTiers(opts)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	d.tiers = tiers
	if d.tier2.on() || d.cluster.on() {
		if d.ct, err = newConntrack(); err != nil {
			_ = d.Close()
			return nil, err
		}
	}
	err = d.setupNFT(opts)
	if err == nil {
		err = d.setupConnSync(opts.ConnSync)
	}
	if err != nil {
		_ = d.Close() // releases the netlink handles; never fails
		return nil, err
	}
	return d, nil
}

// check refuses options that do not go together or do not parse.
func (opts Options) check() error {
	if c := opts.ConnSync; c != nil && !c.Off {
		if opts.Tunnel == nil {
			return errors.New("connection sync: it needs the two-tier dataplane (Tunnel is not set)")
		}
		if err := c.check(); err != nil {
			return err
		}
	}
	if opts.Tunnel != nil {
		if err := opts.Tunnel.check(); err != nil {
			return fmt.Errorf("two-tier dataplane: %w", err)
		}
		if opts.NoFilter {
			return errors.New("two-tier dataplane: it needs the VIP filter (NoFilter is set)")
		}
	}
	return checkPodCIDRs(opts.PodCIDRs)
}

// setupNFT opens vipcast's nftables tables, unless source NAT and the VIP
// filter are both off, and sets up the host guard and the two-tier chains
// in them.
func (d *Dataplane) setupNFT(opts Options) error {
	if !d.snat && !d.guard {
		return nil
	}
	var err error
	if d.nft, err = newNFTables(d.snat); err != nil {
		return fmt.Errorf("nftables (source NAT for externalTrafficPolicy Cluster, VIP filter): %w", err)
	}
	d.nft.relayPort = opts.ConnSync.relayPort()
	if err := d.nft.setupHostGuards(opts.HostGuard); err != nil {
		return err
	}
	if d.snat {
		if err := d.nft.setupHairpin(); err != nil {
			return err
		}
	}
	if err := d.tiers.setup(d.nl, d.nft); err != nil {
		return err
	}
	if !d.cluster.on() {
		return nil
	}
	// The pods' connections take the map where their family has one tier
	// (decided by the tiers' setup); with two, tier 1.
	pods := podCIDRsByFamily(opts.PodCIDRs)
	for i, two := range d.tiers.families() {
		if two {
			pods[i] = nil
		}
	}
	if err := d.nft.setupInCluster(pods); err != nil {
		// Serving without the map beats not serving: the in-cluster
		// clients then go through IPVS, as they did before it.
		d.cluster.off = fmt.Errorf("in-cluster clients (the nodes' own connections, and the pods' under Local with one tier) go through IPVS and may be refused: %w", err)
	}
	return nil
}

// InClusterProblem is why the in-cluster map is off although source NAT
// is on (nil: it is on, or NoSNAT turned it off): its chains could not be
// made, such as on a kernel without nft_numgen or nft_hash. The Dataplane
// serves either way, ignoring Service.Cluster.
func (d *Dataplane) InClusterProblem() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.snat {
		return nil
	}
	return d.cluster.off
}

// StaleFlowsProblem is why IPVS keeps the flows of a deleted real server
// (net.ipv4.vs.expire_nodest_conn is not 1 and New could not set it);
// nil when it does not. The Dataplane serves either way.
func (d *Dataplane) StaleFlowsProblem() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.staleErr
}

// Close releases the handles. The kernel state stays: a restarted speaker
// finds it and changes nothing that is still wanted (Teardown is for a
// node vipcast leaves). Closing again does nothing.
func (d *Dataplane) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.close()
	return nil
}

// close releases the handles, once.
func (d *Dataplane) close() {
	if d.closed {
		return
	}
	d.closed = true
	d.connSync.stop()
	d.ipvs.Close()
	d.nl.Close()
	d.tiers.close()
	d.ct.close()
	if d.nft != nil {
		d.nft.close()
	}
}

// LinkName is the dummy link's name.
func (d *Dataplane) LinkName() string { return d.name }
