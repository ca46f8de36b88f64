package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"

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
	// tunnel is on with Options.Tunnel; tier2 is the tier-2 map as last
	// read, plus what was applied since (valid with cache).
	tunnel bool
	// tunnel6 is on when the two tiers also serve IPv6 VIPs: ip6ip6 to
	// IPv6 tunnel addresses (Tunnel.Self6, tunnel6.go), or 6in4 to the IPv4
	// ones without connection sync (on a node with IPv6 and sit0).
	tunnel6 bool
	// ip6ip6 is on when IPv6 VIPs go to IPv6 tunnel addresses.
	ip6ip6 bool
	// tunnelCfg is Options.Tunnel, for the node's side of a full Sync.
	tunnelCfg *Tunnel
	// genl is the generic netlink socket for real servers of another
	// family than their virtual server (mixeddest.go), with tunnel.
	genl *genlConn
	// no6 says why IPv6 VIPs keep one tier with Options.Tunnel.
	no6   error
	tier2 Tier2
	// inCluster is on with source NAT: the in-cluster map (incluster.go),
	// as last read plus what was applied since, is cluster.
	inCluster    bool
	cluster      Tier2
	inClusterErr error // why the map is off with source NAT on
	// serving are the UDP and SCTP virtual servers' Local endpoints as
	// last planned, for their stale flows (staleflows.go).
	serving servingSets
	// connSync is Options.ConnSync when on, with its link resolved, for
	// Teardown and ConnSync.
	connSync *ConnSync
	// connSyncErr is why the daemons Options.ConnSync asked for are not
	// running.
	connSyncErr error
	// staleErr is why net.ipv4.vs.expire_nodest_conn is not 1 (nil: it
	// is): see StaleFlowsProblem.
	staleErr error
	// hairpin are the endpoints the hairpin sets hold, by virtual server
	// (hairpin.go).
	hairpin hairpins
	// ct is a netfilter netlink handle in New's namespace, for the
	// conntrack entries of stale flows (with two tiers or the in-cluster
	// map; nil otherwise).
	ct *netlink.Handle
	// relay carries the daemons' messages with ConnSync.Relay; targets
	// are the tier-1 virtual servers it lets connections name, kept with
	// cache.
	relay   *relay
	targets syncTargets
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
		snat: !opts.NoSNAT, guard: !opts.NoFilter, filter: NewFilter(), tunnel: opts.Tunnel != nil, tier2: Tier2{}, serving: servingSets{},
		inCluster: !opts.NoSNAT, cluster: Tier2{}}
	d.chooseIPv6(opts)
	if err := enableExpireNodest(); err != nil {
		d.staleErr = fmt.Errorf("%w: the flows of a deleted real server are dropped until their entries time out (UDP: 300 s) instead of going to another one; prepare the node (`vipcast-speaker %s` in a privileged init container, speaker.ipvs.prepareNode: true) or set net.ipv4.vs.expire_nodest_conn=1 on it", err, PrepareNodeCommand)
	}
	if d.tunnel {
		t := *opts.Tunnel
		d.tunnelCfg = &t
		if d.genl, err = openGenl(); err != nil {
			_ = d.Close()
			return nil, fmt.Errorf("two-tier dataplane: %w", err)
		}
	}
	if d.tunnel || d.inCluster {
		if d.ct, err = netlink.NewHandle(unix.NETLINK_NETFILTER); err != nil {
			_ = d.Close()
			return nil, fmt.Errorf("conntrack netlink: %w", err)
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
	if err := d.setupTunnel(opts.Tunnel); err != nil {
		return err
	}
	if !d.inCluster {
		return nil
	}
	// The pods' connections take the map where their family has one tier
	// (decided by setupTunnel); with two, tier 1.
	pods := podCIDRsByFamily(opts.PodCIDRs)
	if d.tunnel {
		pods[0] = nil
	}
	if d.tunnel6 {
		pods[1] = nil
	}
	if err := d.nft.setupInCluster(pods); err != nil {
		// Serving without the map beats not serving: the in-cluster
		// clients then go through IPVS, as they did before it.
		d.inCluster, d.inClusterErr = false, fmt.Errorf("in-cluster clients (the nodes' own connections, and the pods' under Local with one tier) go through IPVS and may be refused: %w", err)
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
	return d.inClusterErr
}

// chooseIPv6 decides how IPv6 VIPs go with opts: ip6ip6 to IPv6 tunnel
// addresses with Tunnel.Self6. Without, they go 6in4 to the IPv4 ones, and
// the kernel refuses real servers of another family than their virtual
// server while a sync daemon runs (its sync protocol cannot carry their
// connections): then they get the two tiers only with connection sync off.
// setupTunnel may still turn them off (no IPv6 on the node).
func (d *Dataplane) chooseIPv6(opts Options) {
	if !d.tunnel {
		return
	}
	d.ip6ip6 = opts.Tunnel.Self6.IsValid()
	d.tunnel6 = d.ip6ip6 || !opts.ConnSync.on()
	switch {
	case opts.Tunnel.OneTier6 != "":
		d.tunnel6, d.ip6ip6, d.no6 = false, false, errors.New(opts.Tunnel.OneTier6)
	case !d.tunnel6:
		d.no6 = errors.New("connection sync is on, and the kernel does not sync the connections of an IPv6 VIP tunnelled to IPv4 tunnel addresses (give the nodes IPv6 tunnel addresses)")
	}
}

// StaleFlowsProblem is why IPVS keeps the flows of a deleted real server
// (net.ipv4.vs.expire_nodest_conn is not 1 and New could not set it);
// nil when it does not. The Dataplane serves either way.
func (d *Dataplane) StaleFlowsProblem() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.staleErr
}

// ConnSyncProblem is why the sync daemons Options.ConnSync asked for are
// not running (nil: they run, or none were asked for).
func (d *Dataplane) ConnSyncProblem() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.connSyncErr
}

// setupTunnel readies the node and the nftables chains for the two-tier
// dataplane (t nil: takes the chains away).
func (d *Dataplane) setupTunnel(t *Tunnel) error {
	if t == nil {
		return d.nft.removeTunnel()
	}
	no6, err := ensureTunnel(d.nl, *t)
	if err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	if no6 != nil && d.tunnel6 {
		d.tunnel6, d.ip6ip6, d.no6 = false, false, no6
	}
	mss, err := clampFor(tunnelMTU(d.nl, *t), d.ip6ip6)
	if err != nil {
		return fmt.Errorf("two-tier dataplane: fabric %w", err)
	}
	links := [2]string{TunnelLink}
	switch {
	case d.ip6ip6:
		links[1] = IP6TunnelLink
	case d.tunnel6:
		links[1] = Tunnel6Link
	}
	self := [2]netip.Addr{t.Self.Unmap(), t.Self6}
	if err := d.nft.setupTunnel(mss, links, self); err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	return nil
}

// setupConnSync starts or stops the IPVS sync daemons as c asks (nil:
// leaves them alone). Daemons that cannot start fail nothing: the
// Dataplane runs without them (ConnSyncProblem), since serving without
// connection sync beats serving nothing (only flows that ECMP moves after
// tier 1 changed are lost); a daemon that did start (the master, before
// the backup failed) is stopped.
func (d *Dataplane) setupConnSync(c *ConnSync) error {
	switch {
	case c == nil:
		return nil
	case c.Off:
		// The relay's veth pair of an earlier run with it goes too.
		return errors.Join(stopConnSyncID(c.ID), deleteLink(d.nl, SyncLink, "veth"))
	case c.Relay == nil:
		// Likewise when the daemons go back to a shared link.
		if err := deleteLink(d.nl, SyncLink, "veth"); err != nil {
			return fmt.Errorf("two-tier dataplane: %w", err)
		}
	}
	if err := d.runConnSync(*c); err != nil {
		d.connSyncErr = errors.Join(err, stopConnSyncID(c.ID))
		if d.tunnel && !d.ip6ip6 {
			// IPv6 VIPs stay on one tier: the chains were set up so.
			d.no6 = errors.New("connection sync was asked for (its daemons did not start: see the sync problem), and the kernel does not sync the connections of an IPv6 VIP tunnelled to IPv4 tunnel addresses")
		}
	}
	return nil
}

// runConnSync starts c's daemons.
func (d *Dataplane) runConnSync(c ConnSync) error {
	// The kernel starts no sync daemon while a real server of another
	// family than its virtual server exists: those of a run with
	// connection sync off go first (this run keeps IPv6 VIPs on one tier).
	if err := d.dropMixedDests(); err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	if c.Relay == nil {
		on, err := ensureConnSync(d.nl, c)
		if err != nil {
			return fmt.Errorf("two-tier dataplane: %w", err)
		}
		d.connSync = &on
		return nil
	}
	peer, err := prepareSyncRelay(d.nl)
	if err != nil {
		return fmt.Errorf("two-tier dataplane: connection sync relay: %w", err)
	}
	c.Interface = SyncLink
	if err := startConnSync(c); err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	if d.relay, err = startRelay(peer, c.ID, *c.Relay, &d.targets); err != nil {
		return fmt.Errorf("two-tier dataplane: %w", err)
	}
	d.connSync = &c
	return nil
}

// SetSyncPeers replaces the other nodes' addresses the connection sync
// relay (ConnSync.Relay) sends to and accepts from; without a relay it
// does nothing.
func (d *Dataplane) SetSyncPeers(peers []netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.relay != nil {
		d.relay.setPeers(peers)
	}
}

// SetSyncKeys replaces the keys the connection sync relay
// (ConnSync.Relay) signs its datagrams with and checks the other nodes'
// with (syncauth.go); the zero SyncKeys turns authentication off. Without
// a relay it does nothing.
func (d *Dataplane) SetSyncKeys(k SyncKeys) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.relay != nil {
		d.relay.keys.Store(&k)
	}
}

// RelayStats counts what the connection sync relay did; ok is false
// without one.
func (d *Dataplane) RelayStats() (s RelayStats, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.relay == nil {
		return RelayStats{}, false
	}
	return d.relay.stats(), true
}

func ensureDummy(nh *netlink.Handle, name string) (netlink.Link, error) {
	link, err := ensureLink(nh, &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: name}})
	if err != nil {
		return nil, fmt.Errorf("dummy link for the VIPs: %w", err)
	}
	return link, nil
}

// ensureLink returns the link named as l, of l's type, creating it as l
// when missing, and sets it up.
func ensureLink(nh *netlink.Handle, l netlink.Link) (netlink.Link, error) {
	name := l.Attrs().Name
	link, err := linkOfType(nh, name, l.Type())
	if err == nil && link == nil {
		if err := nh.LinkAdd(l); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create %s link %s: %w", l.Type(), name, err)
		}
		if link, err = linkOfType(nh, name, l.Type()); err == nil && link == nil {
			err = fmt.Errorf("link %s: gone as soon as created", name)
		}
	}
	if err != nil {
		return nil, err
	}
	if err := nh.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	return link, nil
}

// linkOfType returns the link name, nil when there is none. A link of
// that name and another type than typ is not vipcast's: an error.
func linkOfType(nh *netlink.Handle, name, typ string) (netlink.Link, error) {
	link, err := nh.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	switch {
	case errors.As(err, &notFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("link %s: %w", name, err)
	case link.Type() != typ:
		return nil, fmt.Errorf("link %s is a %s link, not %s: not vipcast's, left alone", name, link.Type(), typ)
	}
	return link, nil
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
	if d.relay != nil {
		d.relay.stop()
	}
	d.ipvs.Close()
	d.nl.Close()
	if d.genl != nil {
		d.genl.close()
	}
	if d.ct != nil {
		d.ct.Close()
	}
	if d.nft != nil {
		d.nft.close()
	}
}

// TwoTierIPv6 reports whether IPv6 VIPs go through the two tiers:
// Options.Tunnel with Tunnel.Self6 on a node with IPv6 (ip6ip6 to the
// nodes' IPv6 tunnel addresses), or without Self6 on a node with IPv6 and
// the sit module, connection sync off (6in4 to the IPv4 tunnel addresses).
// Otherwise they keep one tier, and with Options.Tunnel why says why.
func (d *Dataplane) TwoTierIPv6() (on bool, why error) { return d.tunnel6, d.no6 }

// LinkName is the dummy link's name.
func (d *Dataplane) LinkName() string { return d.name }

// ConnSync returns the connection synchronisation this Dataplane started
// (its link resolved), or nil.
func (d *Dataplane) ConnSync() *ConnSync {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.connSync == nil {
		return nil
	}
	c := *d.connSync
	return &c
}

// Read returns the kernel's whole IPVS table (foreign virtual servers too)
// and the VIPs bound to the dummy link.
func (d *Dataplane) Read() (State, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k, err := d.read(nil)
	return k.st, err
}

// ReadTier2 returns the tier-2 map as the kernel has it (empty without
// Options.Tunnel).
func (d *Dataplane) ReadTier2() (Tier2, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k, err := d.read(nil)
	return k.tier2, err
}

// ReadInCluster returns the in-cluster map as the kernel has it (empty
// with Options.NoSNAT).
func (d *Dataplane) ReadInCluster() (Tier2, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k, err := d.read(nil)
	return k.cluster, err
}

// ReadFilter returns the VIP filter's content as the kernel has it (empty
// with Options.NoFilter).
func (d *Dataplane) ReadFilter() (Filter, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k, err := d.read(nil)
	return k.filter, err
}

// kernel is what read finds.
type kernel struct {
	st State
	// orphans are source NAT entries without a virtual server.
	orphans []Key
	filter  Filter
	tier2   Tier2
	cluster Tier2
}

// read reads the kernel; the real servers of virtual servers that
// withBackends rejects are not read (Sync skips foreign ones). withBackends
// is given the key and the VIPs bound to the link.
func (d *Dataplane) read(withBackends func(Key, map[netip.Addr]struct{}) bool) (k kernel, err error) {
	k.st, k.filter, k.tier2, k.cluster = NewState(), NewFilter(), Tier2{}, Tier2{}
	if err := d.readVIPs(k.st.VIPs); err != nil {
		return k, err
	}
	if err := d.readServices(k.st, withBackends); err != nil {
		return k, err
	}
	if d.snat {
		if k.orphans, err = d.readSNAT(k.st); err != nil {
			return k, err
		}
	}
	if d.guard {
		if k.filter, err = d.nft.readFilter(); err != nil {
			return k, fmt.Errorf("VIP filter: %w", err)
		}
	}
	if d.tunnel {
		if k.tier2, err = d.nft.readTier2(); err != nil {
			return k, fmt.Errorf("tier 2: %w", err)
		}
	}
	if d.inCluster {
		if k.cluster, err = d.nft.readInCluster(); err != nil {
			return k, fmt.Errorf("in-cluster map: %w", err)
		}
	}
	return k, nil
}

// readVIPs adds the addresses bound to the dummy link to vips.
func (d *Dataplane) readVIPs(vips map[netip.Addr]struct{}) error {
	addrs, err := dump("addresses of "+d.name, func() ([]netlink.Addr, error) {
		return d.nl.AddrList(d.link, netlink.FAMILY_ALL)
	})
	if err != nil {
		return err
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.IsLinkLocalUnicast() {
			continue // the kernel's own IPv6 link-local address
		}
		vips[ip.Unmap()] = struct{}{}
	}
	return nil
}

// readServices adds the kernel's virtual servers to st.Services, with their
// real servers when withBackends (nil: always) accepts them. st.VIPs must
// be read already.
func (d *Dataplane) readServices(st State, withBackends func(Key, map[netip.Addr]struct{}) bool) error {
	svcs, err := d.ipvs.GetServices()
	if err != nil {
		return fmt.Errorf("list IPVS services: %w", err)
	}
	return d.readListed(st, svcs, withBackends)
}

// readListed is readServices for the virtual servers svcs, as listed: one
// deleted since the list (by hand, while a Sync reads) is left out, not
// read as a virtual server without real servers.
func (d *Dataplane) readListed(st State, svcs []*libipvs.Service, withBackends func(Key, map[netip.Addr]struct{}) bool) error {
	for _, ks := range svcs {
		svc, ok := serviceFrom(ks)
		if !ok {
			continue
		}
		if withBackends == nil || withBackends(svc.Key(), st.VIPs) {
			var err error
			svc.Backends, err = d.readBackends(ks, svc.Key())
			if errors.Is(err, errGone) {
				continue
			}
			if err != nil {
				return err
			}
		}
		st.Services[svc.Key()] = svc.Normalize()
	}
	return nil
}

// errGone is readBackends' answer for a virtual server that no longer
// exists.
var errGone = errors.New("virtual server gone")

// serviceFrom converts a kernel virtual server, without its real servers.
// It reports false for those vipcast never owns: firewall-mark services and
// addresses it cannot parse.
func serviceFrom(ks *libipvs.Service) (Service, bool) {
	if ks.FWMark != 0 {
		return Service{}, false // firewall-mark services are never vipcast's
	}
	vip, ok := netip.AddrFromSlice(ks.Address)
	if !ok {
		return Service{}, false
	}
	svc := Service{
		VIP:       vip.Unmap(),
		Port:      ks.Port,
		Protocol:  Protocol(ks.Protocol),
		Scheduler: ks.SchedName,
		Flags:     ks.Flags & userFlags,
	}
	if ks.Flags&FlagPersistent != 0 {
		svc.Persistent = ks.Timeout
	}
	return svc, true
}

// readBackends reads the real servers of the kernel virtual server ks,
// whose key is k.
func (d *Dataplane) readBackends(ks *libipvs.Service, k Key) ([]Backend, error) {
	dests, err := d.ipvs.GetDestinations(ks)
	if err != nil {
		return nil, fmt.Errorf("list real servers of %s: %w", k, err)
	}
	if len(dests) == 0 {
		// The kernel dumps no real servers, without an error, for a
		// virtual server that does not exist: ask for it, or a Sync
		// would add real servers to nothing (ESRCH) and never call it
		// lost.
		if _, err := d.ipvs.GetService(ks); isNotFound(err) {
			return nil, errGone
		} else if err != nil {
			return nil, fmt.Errorf("read virtual server %s: %w", k, err)
		}
	}
	var bs []Backend
	for _, kd := range dests {
		a, ok := netip.AddrFromSlice(kd.Address)
		if !ok {
			continue
		}
		bs = append(bs, Backend{Addr: a.Unmap(), Port: kd.Port, Weight: kd.Weight,
			Tunnel: kd.ConnectionFlags&libipvs.ConnectionFlagFwdMask == libipvs.ConnectionFlagTunnel})
	}
	return bs, nil
}

// readSNAT marks the virtual servers of st whose connections are
// masqueraded and returns the source NAT entries without a virtual server.
func (d *Dataplane) readSNAT(st State) (orphans []Key, err error) {
	keys, err := d.nft.readKeys(d.nft.snat)
	if err != nil {
		return nil, err
	}
	for k := range keys {
		if svc, ok := st.Services[k]; ok {
			svc.SNAT = true
			st.Services[k] = svc
		} else {
			orphans = append(orphans, k)
		}
	}
	return orphans, nil
}

// Sync makes the kernel match desired with a full read: Read, Diff, Apply.
// It returns the plan it applied (empty when nothing differed), also when
// Apply failed part way. It refreshes the in-memory state SyncService
// works from, so a periodic Sync repairs drift (a virtual server deleted by
// hand, a real server changed by someone else); the plan's Lost names the
// virtual servers it had programmed and found gone.
//
// One virtual server the kernel refuses (a scheduler it does not have, an
// IPv6 VIP with IPv6 off) does not stop the others: Sync applies the whole
// plan, going on past failures, and returns a *SyncErrors naming the
// virtual servers refused and why. A failure to read the kernel, or a
// desired state that does not validate, is a plain error and nothing is
// applied.
func (d *Dataplane) Sync(desired State) (Plan, error) {
	if err := d.validate(desired); err != nil {
		return Plan{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	want := desired.allVIPs()
	kern, err := d.read(func(k Key, linkVIPs map[netip.Addr]struct{}) bool {
		if _, ok := want[k.VIP]; ok {
			return true
		}
		_, ok := linkVIPs[k.VIP]
		return ok
	})
	if err != nil {
		d.stale = true
		return Plan{}, err
	}
	actual := kern.st
	p := Diff(desired, actual)
	if !d.stale {
		p.Lost = lost(d.cache, actual, func(k Key) bool {
			_, want := desired.Services[k]
			return want // the read skipped other VIPs: nothing is known of them
		})
	}
	for _, k := range kern.orphans {
		if s, ok := desired.Services[k]; ok && s.SNAT {
			// The element outlived its virtual server (deleted by hand),
			// which comes back wanting it: keep it, or the recreated
			// virtual server would forward unmasqueraded connections
			// until the next Sync.
			p.AddSNAT = slices.DeleteFunc(p.AddSNAT, func(x Key) bool { return x == k })
			continue
		}
		p.DelSNAT = append(p.DelSNAT, k)
	}
	if d.guard {
		// The filter's sets are vipcast's alone: repaired whole, like the
		// source NAT set.
		p.Filter = DiffFilter(FilterOf(desired), kern.filter)
	}
	if d.tunnel {
		p.Tier2 = DiffTier2(Tier2Of(desired), kern.tier2)
	}
	if d.inCluster {
		p.InCluster = DiffTier2(InClusterOf(desired), kern.cluster)
	}
	if d.ct != nil {
		in := desiredIn(desired)
		p.StaleFlows = mergeStale(staleFlows(p.Tier2, in), staleFlows(p.InCluster, in), d.serving.updateAll(desired))
	}
	wasStale := d.stale
	d.cache, d.filter, d.tier2, d.cluster, d.stale = actual, kern.filter, kern.tier2, kern.cluster, false
	d.targets.reset(d.cache)
	// The hairpin sets are vipcast's alone: read and repaired whole, before
	// the plan gives any endpoint its first flow.
	d.hairpin = hairpinsOf(desired)
	if d.nft != nil {
		d.nft.hairpinHave = [2]map[netip.Addr]struct{}{}
	}
	hf := newFailures()
	d.syncHairpin(d.hairpin.all(), hf)
	f := d.applySynced(p, desired, wasStale)
	f.all = append(f.all, hf.all...)
	return p, f.syncErrors(desired)
}

// applySynced applies p, the plan of a Sync to desired, and with two
// tiers repairs the node's side of them. After a stale Sync (wasStale),
// one walk of the conntrack table clears the flows p names and those no
// plan named (clearUnserved), in place of clearStaleFlows' own walk.
func (d *Dataplane) applySynced(p Plan, desired State, wasStale bool) *failures {
	stale := p.StaleFlows
	if wasStale {
		p.StaleFlows = nil // a copy: the Sync's plan keeps them
	}
	f := d.applyPlan(p)
	if wasStale {
		d.clearUnserved(desired, stale, f)
	}
	if !d.tunnel {
		return f
	}
	if err := d.repairTunnelNode(); err != nil {
		f.add("the two-tier dataplane's setup on the node", err)
	}
	return f
}

// repairTunnelNode puts back the node's side of the two tiers that
// something took away since New (a rule or route deleted by hand; the
// IPv6 tunnel address gone with its link set down, or its route in the
// kernel's local table back): a full Sync's drift repair, as for the
// virtual servers. It works through the Dataplane's rtnetlink handle only,
// in whatever namespace it is called: a loop that is gone needs New again
// (its sysctls are the init container's). Each step reads before it
// writes, so a node as New left it costs reads only.
func (d *Dataplane) repairTunnelNode() error {
	out, err := d.nl.LinkByName(LoopLink)
	if err != nil {
		return fmt.Errorf("the loop %s is gone (%w): restart the speaker to make it again", LoopLink, err)
	}
	in, err := d.nl.LinkByName(LoopPeer)
	if err != nil {
		return fmt.Errorf("the loop's peer %s is gone (%w): restart the speaker to make it again", LoopPeer, err)
	}
	for _, l := range []netlink.Link{out, in} {
		if err := setUp(d.nl, l); err != nil {
			return err
		}
	}
	if err := ensureTunnelAddress(d.nl, d.tunnelCfg.Self, out, in); err != nil {
		return err
	}
	if d.ip6ip6 {
		return ensureTunnel6(d.nl, d.tunnelCfg.Self6, out, in)
	}
	return nil
}

func (d *Dataplane) validate(desired State) error {
	if err := desired.Validate(); err != nil {
		return err
	}
	for _, k := range desired.keys() {
		if err := d.check(desired.Services[k]); err != nil {
			return err
		}
	}
	return nil
}

// check refuses what svc needs and the dataplane's options turn off.
func (d *Dataplane) check(svc Service) error {
	switch {
	case svc.SNAT && !d.snat:
		return fmt.Errorf("virtual server %s: source NAT wanted, but the dataplane runs with NoSNAT", svc.Key())
	case svc.Restricted && !d.guard:
		return fmt.Errorf("virtual server %s: source ranges wanted, but the dataplane runs with NoFilter, which enforces them", svc.Key())
	case svc.SNAT && d.tunnel && (svc.VIP.Unmap().Is4() || d.tunnel6):
		return fmt.Errorf("virtual server %s: source NAT wanted, but the two-tier dataplane keeps the client's address and does not use it", svc.Key())
	case d.tunnel && !svc.VIP.Unmap().Is4() && !d.tunnel6 && (len(svc.Local) > 0 || slices.ContainsFunc(svc.Backends, func(b Backend) bool { return b.Tunnel })):
		return fmt.Errorf("virtual server %s: IPv6 VIPs keep one tier on this node: %w", svc.Key(), d.no6)
	case d.tunnel6 && !svc.VIP.Unmap().Is4() && slices.ContainsFunc(svc.Backends, func(b Backend) bool { return b.Tunnel && b.Addr.Unmap().Is4() == d.ip6ip6 }):
		want := "IPv4 tunnel addresses (6in4): this node has no IPv6 tunnel address"
		if d.ip6ip6 {
			want = "IPv6 tunnel addresses (ip6ip6), as this node's is"
		}
		return fmt.Errorf("virtual server %s: an IPv6 VIP's tunnel real servers must be %s", svc.Key(), want)
	case d.tunnel:
		return nil
	case len(svc.Local) > 0:
		return fmt.Errorf("virtual server %s: local endpoints are for the two-tier dataplane, which is off (Options.Tunnel)", svc.Key())
	case slices.ContainsFunc(svc.Backends, func(b Backend) bool { return b.Tunnel }):
		return fmt.Errorf("virtual server %s: tunnel real servers are for the two-tier dataplane, which is off (Options.Tunnel)", svc.Key())
	}
	return nil
}

// SyncService makes one virtual server match desired (nil: delete it) using
// the in-memory state of the last Sync and the changes applied since: no
// kernel read, kernel work only for that service. When the kernel refuses a
// change (it drifted from the in-memory state), SyncService reads the
// kernel again and redoes the service once; the plan returned is the one of
// the last attempt, whose Lost then names every virtual server of the
// in-memory state that read found gone (only key's is restored: the
// caller runs Sync for the others).
func (d *Dataplane) SyncService(key Key, desired *Service) (Plan, error) {
	if desired != nil {
		if err := desired.Validate(); err != nil {
			return Plan{}, err
		}
		if err := d.check(*desired); err != nil {
			return Plan{}, err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.refresh(); err != nil {
		return Plan{}, err
	}
	p := d.diffService(key, desired)
	err := d.apply(p)
	if err == nil {
		return p, nil
	}
	// The kernel was not what the in-memory state said (a virtual server
	// deleted by hand, say): read it again and redo this service once.
	before := d.cache
	if rerr := d.refresh(); rerr != nil {
		return p, errors.Join(err, rerr)
	}
	deleted := p.DelServices // the failed apply may have done these
	p = d.diffService(key, desired)
	// Every virtual server found gone, not only this one: the read
	// replaced the in-memory state, so neither Probe nor a later Sync
	// would know them as lost.
	p.Lost = lost(before, d.cache, func(k Key) bool { return !slices.Contains(deleted, k) })
	return p, d.apply(p)
}

// lost returns, sorted, the virtual servers of before (the in-memory
// state) that the kernel read after lacks, among those keep accepts.
func lost(before, after State, keep func(Key) bool) []Key {
	var out []Key
	for k := range before.Services {
		if _, ok := after.Services[k]; !ok && keep(k) {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, Key.compare)
	return out
}

// diffService is DiffService against the in-memory state, with the filter
// changes that go with it.
func (d *Dataplane) diffService(key Key, desired *Service) Plan {
	p := DiffService(key, desired, d.cache)
	if d.guard {
		p.Filter = filterStep(key, desired, p, d.filter)
	}
	if d.tunnel {
		p.Tier2 = tier2Step(key, desired, d.tier2)
	}
	if d.inCluster {
		p.InCluster = slotStep(key, desired, d.cluster, inClusterWant)
	}
	if d.ct != nil {
		one := desiredOne(key, desired)
		p.StaleFlows = mergeStale(staleFlows(p.Tier2, one), staleFlows(p.InCluster, one), d.serving.update(key, desired))
	}
	return p
}

// Probe asks the kernel for one virtual server of the in-memory state
// whose VIP is on the link (vipcast's own: any one, as a flush takes them
// all) and reports whether it is gone: another program flushed (or
// deleted) virtual servers. kube-proxy flushes every IPVS virtual
// server of the node when it starts in nftables mode (its clean-up of the
// other modes' leftovers), and so does `kube-proxy --cleanup`. A probe is
// one netlink request, so a caller can probe every few seconds and run
// Sync, a full kernel read, only when it finds drift. With nothing applied
// yet, or the in-memory state unknown, Probe reports no drift: the next
// Sync reads the kernel anyway.
func (d *Dataplane) Probe() (drifted bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.stale {
		return false, nil
	}
	for k := range d.cache.Services {
		if _, own := d.cache.VIPs[k.VIP]; !own {
			continue
		}
		_, err := d.ipvs.GetService(keyService(k))
		switch {
		case err == nil:
			return false, nil
		case isNotFound(err):
			return true, nil
		default:
			return false, fmt.Errorf("probe virtual server %s: %w", k, err)
		}
	}
	return false, nil
}

// State returns a copy of the in-memory state (the kernel as Dataplane
// believes it is), reading the kernel first when that is unknown.
func (d *Dataplane) State() (State, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.refresh(); err != nil {
		return State{}, err
	}
	return d.cache.Clone(), nil
}

func (d *Dataplane) refresh() error {
	if !d.stale {
		return nil
	}
	k, err := d.read(nil)
	if err != nil {
		return err
	}
	d.cache, d.filter, d.tier2, d.cluster, d.stale = k.st, k.filter, k.tier2, k.cluster, false
	d.targets.reset(d.cache)
	return nil
}

// Apply performs p on the kernel, in the order documented on Plan. It
// tolerates a kernel that is already there (an add of something present
// becomes an update, a delete of something absent is skipped), goes on past
// other errors and returns them all.
func (d *Dataplane) Apply(p Plan) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.refresh(); err != nil {
		return err
	}
	return d.apply(p)
}

// apply performs p on the kernel (see Apply) and, when every step
// succeeded, on the in-memory state; a failure marks that stale.
func (d *Dataplane) apply(p Plan) error {
	return d.applyPlan(p).err()
}

// applyPlan is apply, returning the failures by what they concern.
func (d *Dataplane) applyPlan(p Plan) *failures {
	f := newFailures()
	// An endpoint that can take its own connections through the VIP is
	// in the hairpin set before its first flow (hairpin.go), and leaves
	// it after its last.
	next := d.hairpinNext(p)
	if grow := d.hairpin.missing(next); len(grow) > 0 {
		d.syncHairpin(append(d.hairpin.all(), grow...), f)
	}
	unguarded := d.filterVIPs(p.Filter.AddVIPs, f)
	d.bindVIPs(p.AddVIPs, unguarded, f)
	d.startSNAT(p.AddSNAT, f)
	d.applyServices(p, f)
	d.restrict(p.Filter, f)
	d.allow(p.Filter.AddAllow, f)
	d.applyTier2(p.Tier2, f)
	d.applyInCluster(p.InCluster, f)
	d.clearStaleFlows(p.StaleFlows, f)
	d.applyBackends(p, f)
	d.disallow(p.Filter.DelAllow, f)
	d.unrestrict(p.Filter, f)
	d.deleteServices(p.DelServices, f)
	d.stopSNAT(p.DelSNAT, f)
	d.unbindVIPs(p.DelVIPs, f)
	d.unfilterVIPs(p.Filter.DelVIPs, f)
	if len(f.all) > 0 {
		d.stale = true
		return f
	}
	p.ApplyTo(&d.cache)
	p.Filter.ApplyTo(&d.filter)
	p.Tier2.ApplyTo(d.tier2)
	p.InCluster.ApplyTo(d.cluster)
	d.targets.update(d.cache, p.serviceKeys())
	changed := false
	for k, addrs := range next {
		if d.hairpin.set(k, addrs) {
			changed = true
		}
	}
	if changed {
		d.syncHairpin(d.hairpin.all(), f)
	}
	return f
}

// newFailures returns an empty failures.
func newFailures() *failures {
	return &failures{absent: map[Key]bool{}, unrestricted: map[Key]bool{}}
}

// failures collects the errors of the steps of an apply, each prefixed
// with what failed, and remembers which concern one virtual server or one
// VIP.
type failures struct {
	all   []error
	keys  map[Key][]error
	vips  map[netip.Addr][]error
	other []error // neither: a source NAT batch
	// absent are the virtual servers the kernel refused to add: their
	// real servers are not tried.
	absent map[Key]bool
	// unrestricted are the virtual servers whose restriction to their
	// source ranges failed: allow keeps their ports closed.
	unrestricted map[Key]bool
}

// add records err as the failure to do what, concerning no single virtual
// server or VIP.
func (f *failures) add(what string, err error) {
	e := fmt.Errorf("%s: %w", what, err)
	f.all, f.other = append(f.all, e), append(f.other, e)
}

// addKey records err as the failure to do what to virtual server k.
func (f *failures) addKey(k Key, what string, err error) {
	e := fmt.Errorf("%s: %w", what, err)
	if f.keys == nil {
		f.keys = map[Key][]error{}
	}
	f.all, f.keys[k] = append(f.all, e), append(f.keys[k], e)
}

// addVIP records err as the failure to do what to VIP a.
func (f *failures) addVIP(a netip.Addr, what string, err error) {
	e := fmt.Errorf("%s: %w", what, err)
	if f.vips == nil {
		f.vips = map[netip.Addr][]error{}
	}
	f.all, f.vips[a] = append(f.all, e), append(f.vips[a], e)
}

// err joins every failure (nil: none).
func (f *failures) err() error { return errors.Join(f.all...) }

// syncErrors is the error of a Sync to desired: nil without failures, else
// a *SyncErrors where a VIP's failure counts against every desired virtual
// server on it.
func (f *failures) syncErrors(desired State) error {
	if len(f.all) == 0 {
		return nil
	}
	e := &SyncErrors{Services: map[Key]error{}, Other: errors.Join(f.other...)}
	for k, errs := range f.keys {
		e.Services[k] = errors.Join(errs...)
	}
	for a, errs := range f.vips {
		attributed := false
		for k := range desired.Services {
			if k.VIP == a {
				e.Services[k] = errors.Join(append([]error{e.Services[k]}, errs...)...)
				attributed = true
			}
		}
		if !attributed { // a VIP being removed
			e.Other = errors.Join(append([]error{e.Other}, errs...)...)
		}
	}
	return e
}

// SyncErrors is the error of a Sync that applied all it could: the kernel
// refused changes to some virtual servers (Services, by key; a refused VIP
// counts against every virtual server on it) and, in Other (nil: none),
// changes that concern no single virtual server (a source NAT batch, the
// removal of a VIP nothing wants). Everything else in the plan was applied.
type SyncErrors struct {
	Services map[Key]error
	Other    error
}

// Error lists the failures, virtual servers in key order.
func (e *SyncErrors) Error() string {
	keys := slices.SortedFunc(maps.Keys(e.Services), Key.compare)
	msgs := make([]string, 0, len(keys)+1)
	for _, k := range keys {
		msgs = append(msgs, fmt.Sprintf("virtual server %s: %v", k, e.Services[k]))
	}
	if e.Other != nil {
		msgs = append(msgs, e.Other.Error())
	}
	return strings.Join(msgs, "; ")
}

// Unwrap returns every failure, for errors.Is and errors.As.
func (e *SyncErrors) Unwrap() []error {
	out := make([]error, 0, len(e.Services)+1)
	for _, err := range e.Services {
		out = append(out, err)
	}
	if e.Other != nil {
		out = append(out, e.Other)
	}
	return out
}

// bindVIPs adds the VIPs to the dummy link; one already there is fine. A
// VIP in unguarded is not bound: the filter failed to take it, and bound it
// would answer on every port of the node.
func (d *Dataplane) bindVIPs(vips []netip.Addr, unguarded map[netip.Addr]bool, f *failures) {
	for _, a := range vips {
		if unguarded[a] {
			f.addVIP(a, "bind VIP "+a.String(), errors.New("not bound: the VIP filter does not have it"))
			continue
		}
		if err := d.nl.AddrAdd(d.link, vipAddr(a)); err != nil && !errors.Is(err, unix.EEXIST) {
			f.addVIP(a, "bind VIP "+a.String(), err)
		}
	}
}

// startSNAT masquerades the connections of the virtual servers keys.
func (d *Dataplane) startSNAT(keys []Key, f *failures) {
	if len(keys) == 0 {
		return
	}
	if !d.snat {
		f.add("source NAT", errors.New("disabled (NoSNAT)"))
	} else if err := d.nft.update(d.nft.snat, keyElems(keys), nil); err != nil {
		f.add("start source NAT", err)
	}
}

// applyServices adds p's new virtual servers (updating one that exists)
// and updates its changed ones.
func (d *Dataplane) applyServices(p Plan, f *failures) {
	for _, s := range p.AddServices {
		ks := kernelService(s)
		err := d.ipvs.NewService(ks)
		if errors.Is(err, unix.EEXIST) {
			err = d.ipvs.UpdateService(ks)
		}
		if err != nil {
			f.addKey(s.Key(), "add virtual server "+s.Key().String(), schedulerError(s, err))
			f.absent[s.Key()] = true
		}
	}
	for _, s := range p.UpdateServices {
		if err := d.ipvs.UpdateService(kernelService(s)); err != nil {
			f.addKey(s.Key(), "update virtual server "+s.Key().String(), schedulerError(s, err))
		}
	}
}

// applyBackends changes p's real servers in the order of backendOps:
// adding one that is present updates it, deleting one that is absent is
// fine.
func (d *Dataplane) applyBackends(p Plan, f *failures) {
	for _, op := range p.backendOps() {
		c := op.BackendChange
		var err error
		what := "add real server "
		switch {
		case op.cmd == ipvsCmdNewDest && f.absent[c.Key]:
			continue // its virtual server was refused: that is the failure
		case op.cmd == ipvsCmdNewDest && c.Again:
			err, what = d.againDest(c.Key, c.Backend), "add real server again "
		case op.cmd == ipvsCmdNewDest:
			err = d.destCmd(ipvsCmdNewDest, c.Key, c.Backend)
			if errors.Is(err, unix.EEXIST) {
				err = d.destCmd(ipvsCmdSetDest, c.Key, c.Backend)
			}
		case op.cmd == ipvsCmdSetDest:
			err, what = d.destCmd(ipvsCmdSetDest, c.Key, c.Backend), "update real server "
		default:
			what = "delete real server "
			if err = d.destCmd(ipvsCmdDelDest, c.Key, c.Backend); isNotFound(err) {
				err = nil
			}
		}
		if err != nil {
			f.addKey(c.Key, what+c.String(), err)
		}
	}
}

// destCmd adds (ipvsCmdNewDest), updates (SetDest) or deletes (DelDest)
// the real server b of virtual server k: through moby/ipvs, or mixedDest
// when b is of another family.
func (d *Dataplane) destCmd(cmd uint8, k Key, b Backend) error {
	if mixedFamily(k, b) {
		return d.mixedDest(cmd, k, b)
	}
	ks, kd := keyService(k), kernelDest(b)
	switch cmd {
	case ipvsCmdNewDest:
		return d.ipvs.NewDestination(ks, kd)
	case ipvsCmdSetDest:
		return d.ipvs.UpdateDestination(ks, kd)
	default:
		return d.ipvs.DelDestination(ks, kd)
	}
}

// deleteServices deletes the virtual servers keys with their real servers;
// an absent one is skipped.
func (d *Dataplane) deleteServices(keys []Key, f *failures) {
	for _, k := range keys {
		if err := d.ipvs.DelService(keyService(k)); err != nil && !isNotFound(err) {
			f.addKey(k, "delete virtual server "+k.String(), err)
		}
	}
}

// stopSNAT stops masquerading the connections of the virtual servers keys
// (nothing to do with NoSNAT).
func (d *Dataplane) stopSNAT(keys []Key, f *failures) {
	if len(keys) == 0 || !d.snat {
		return
	}
	if err := d.nft.update(d.nft.snat, nil, keyElems(keys)); err != nil {
		f.add("stop source NAT", err)
	}
}

// applyTier2 performs the tier-2 map's changes, before tier 1 gets its
// real servers: a node's endpoints are in its tier 2 before its own tier 1
// sends to it.
func (d *Dataplane) applyTier2(p Tier2Plan, f *failures) {
	if p.Len() == 0 {
		return
	}
	if !d.tunnel {
		f.add("tier 2", errors.New("the two-tier dataplane is off (Options.Tunnel)"))
		return
	}
	if err := d.nft.updateTier2(p); err != nil {
		keys := map[Key]bool{}
		for _, s := range append(slices.Clone(p.Del), p.Add...) {
			if !keys[s.Key] {
				keys[s.Key] = true
				f.addKey(s.Key, "tier 2 of "+s.Key.String(), err)
			}
		}
	}
}

// unbindVIPs removes the VIPs from the dummy link; one already gone is
// fine.
func (d *Dataplane) unbindVIPs(vips []netip.Addr, f *failures) {
	for _, a := range vips {
		if err := d.nl.AddrDel(d.link, vipAddr(a)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			f.addVIP(a, "unbind VIP "+a.String(), err)
		}
	}
}

func isNotFound(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH)
}

// vipAddr is a host address: /32 or /128; IPv6 without duplicate address
// detection (a VIP is announced by many nodes at once, and DAD would keep
// it tentative and unusable for a second or more).
func vipAddr(a netip.Addr) *netlink.Addr {
	bits := a.BitLen()
	na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
	if a.Is6() {
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}

func family(a netip.Addr) uint16 {
	if a.Is4() {
		return syscall.AF_INET
	}
	return syscall.AF_INET6
}

func keyService(k Key) *libipvs.Service {
	return &libipvs.Service{
		Address:       k.VIP.AsSlice(),
		Port:          k.Port,
		Protocol:      uint16(k.Protocol),
		AddressFamily: family(k.VIP),
		Netmask:       netmask(k.VIP),
	}
}

func netmask(a netip.Addr) uint32 {
	if a.Is4() {
		return 0xffffffff
	}
	return 128
}

func kernelService(s Service) *libipvs.Service {
	ks := keyService(s.Key())
	ks.SchedName = s.Scheduler
	ks.Flags = s.Flags & userFlags
	if s.Persistent > 0 {
		ks.Flags |= FlagPersistent
		ks.Timeout = s.Persistent
	}
	return ks
}

func kernelDest(b Backend) *libipvs.Destination {
	fwd := uint32(libipvs.ConnectionFlagMasq)
	if b.Tunnel {
		fwd = libipvs.ConnectionFlagTunnel
	}
	return &libipvs.Destination{
		Address:         b.Addr.AsSlice(),
		Port:            b.Port,
		Weight:          b.Weight,
		ConnectionFlags: fwd,
		AddressFamily:   family(b.Addr),
	}
}

// filterVIPs puts the VIPs in the VIP filter before they are bound. When
// that fails it returns them all: they are not bound.
func (d *Dataplane) filterVIPs(vips []netip.Addr, f *failures) (failed map[netip.Addr]bool) {
	if len(vips) == 0 || !d.guard {
		return nil
	}
	err := d.nft.update(d.nft.vips, vipElems(vips), nil)
	if err == nil {
		return nil
	}
	failed = make(map[netip.Addr]bool, len(vips))
	for _, a := range vips {
		f.addVIP(a, "filter VIP "+a.String(), err)
		failed[a] = true
	}
	return failed
}

// allow lets the virtual servers keys through the VIP filter, except those
// the kernel refused to add and those restrict could not restrict: their
// port stays closed.
func (d *Dataplane) allow(keys []Key, f *failures) {
	if len(keys) == 0 || !d.guard {
		return
	}
	ok := make([]Key, 0, len(keys))
	for _, k := range keys {
		if !f.absent[k] && !f.unrestricted[k] {
			ok = append(ok, k)
		}
	}
	if err := d.nft.update(d.nft.allow, keyElems(ok), nil); err != nil {
		for _, k := range ok {
			f.addKey(k, "let "+k.String()+" through the VIP filter", err)
		}
	}
}

// restrict puts in place, before any port is let through, the source
// ranges that p adds and the restrictions it adds, and takes out the ranges
// of the virtual servers that stay restricted, in one transaction with the
// additions (sources.go). A failure counts against each virtual server
// concerned; one that could not be restricted is not let through (its port
// stays closed rather than open to everyone) until a later apply succeeds.
func (d *Dataplane) restrict(p FilterPlan, f *failures) {
	if !d.guard || len(p.AddSources)+len(p.AddRestricted)+len(p.DelSources) == 0 {
		return
	}
	narrowed, _ := p.splitDelSources()
	if err := d.nft.update(d.nft.sources, sourceElems(p.AddSources), sourceElems(narrowed)); err != nil {
		for _, r := range append(slices.Clone(p.AddSources), narrowed...) {
			f.addKey(r.Key, "source range "+r.String(), err)
		}
	}
	if err := d.nft.update(d.nft.restricted, keyElems(p.AddRestricted), nil); err != nil {
		for _, k := range p.AddRestricted {
			f.addKey(k, "restrict "+k.String()+" to its source ranges", err)
			f.unrestricted[k] = true
		}
	}
}

// unrestrict lifts, after the ports going are closed, the restrictions p
// deletes, then deletes their ranges.
func (d *Dataplane) unrestrict(p FilterPlan, f *failures) {
	if !d.guard || len(p.DelRestricted) == 0 {
		return
	}
	_, rs := p.splitDelSources()
	if err := d.nft.update(d.nft.restricted, nil, keyElems(p.DelRestricted)); err != nil {
		f.add("lift source-range restrictions", err)
		return
	}
	if err := d.nft.update(d.nft.sources, nil, sourceElems(rs)); err != nil {
		f.add("delete source ranges", err)
	}
}

// disallow stops letting the virtual servers keys through the VIP filter.
func (d *Dataplane) disallow(keys []Key, f *failures) {
	if len(keys) == 0 || !d.guard {
		return
	}
	if err := d.nft.update(d.nft.allow, nil, keyElems(keys)); err != nil {
		f.add("close ports of the VIP filter", err)
	}
}

// unfilterVIPs takes the VIPs, unbound by now, out of the VIP filter.
func (d *Dataplane) unfilterVIPs(vips []netip.Addr, f *failures) {
	if len(vips) == 0 || !d.guard {
		return
	}
	if err := d.nft.update(d.nft.vips, nil, vipElems(vips)); err != nil {
		f.add("take VIPs out of the VIP filter", err)
	}
}
