package speaker

import (
	"net/netip"

	"github.com/vipcast/vipcast/ipvs"
)

// Dataplane is what the speaker needs from the kernel dataplane:
// *ipvs.Dataplane implements it. Options.Dataplane nil announces routes
// only, and the speaker then asks none of this.
type Dataplane interface {
	// Sync makes the kernel match desired with a full read (start-up and
	// drift repair), leaving foreign virtual servers alone.
	Sync(desired ipvs.State) (ipvs.Plan, error)
	// SyncService makes one virtual server match desired (nil: delete it)
	// without reading the kernel.
	SyncService(key ipvs.Key, desired *ipvs.Service) (ipvs.Plan, error)
	// Probe reports, at the cost of one kernel request, whether a virtual
	// server the dataplane programmed is gone (flushed by another
	// program), so the controller resyncs at once instead of at the next
	// DataplaneResync.
	Probe() (drifted bool, err error)

	// SetBFDPeers makes the routers the host guard takes BFD packets from
	// exactly peers: those this node runs BFD sessions with (a dataplane
	// without a guard takes none).
	SetBFDPeers(peers []netip.Addr) error

	// The two-tier dataplane (Options.TunnelPrefix).

	// TwoTierIPv6 reports whether IPv6 VIPs go through the two tiers too;
	// otherwise they keep one, and why says why (nil with one tier).
	TwoTierIPv6() (on bool, why error)
	// SetTunnelRoutes makes the routes to the other nodes' tunnel
	// addresses exactly routes (tunnel address to node address).
	SetTunnelRoutes(routes map[netip.Addr]netip.Addr) error
	// SetTunnelSources makes the addresses tunnelled packets may come
	// from exactly addrs: the nodes' addresses and tunnel addresses (the
	// tunnel guard).
	SetTunnelSources(addrs []netip.Addr) error

	// Connection sync: the IPVS sync daemons and their relay.

	// ConnSyncProblem is why the sync daemons asked for are not running
	// (nil: they run, or none were asked for).
	ConnSyncProblem() error
	// SetSyncPeers makes the other nodes the relay exchanges connections
	// with exactly peers (relayPeers); without a relay it does nothing.
	SetSyncPeers(peers []netip.Addr)
}

// The kernel dataplane is the speaker's.
var _ Dataplane = (*ipvs.Dataplane)(nil)
