package ipvs

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
)

// Teardown removes everything this Dataplane owns from the kernel, for a
// node vipcast leaves (the speaker being uninstalled; a speaker that only
// stops leaves it all in place for the next one: see Close):
//
//   - its virtual servers, with their real servers: those on a VIP bound to
//     its dummy link, the ownership rule of Sync with an empty desired
//     state (see Diff). A foreign virtual server (kube-proxy's, an
//     operator's) stays;
//   - its VIPs and the dummy link itself;
//   - the nftables tables ip vipcast and ip6 vipcast, with all they hold:
//     source NAT, the VIP filter, the two-tier chains and tier-2 map. These
//     are per network namespace, shared by every Dataplane in it (one per
//     node in practice). A Dataplane with Options.NoSNAT and NoFilter never
//     touches nftables, and its Teardown does not either;
//   - the node side of the two-tier dataplane (tunnelnode.go): the rule and
//     the routes of TunnelTable, the routes SetTunnelRoutes programmed
//     (TunnelRouteProtocol) and the loop LoopLink/LoopPeer. Also without
//     Options.Tunnel (as New without it takes the two-tier chains away):
//     an earlier run with it may have left them;
//   - with Options.ConnSync on, the IPVS sync daemons that run with its ID,
//     and with ConnSync.Relay the relay's veth pair SyncLink/SyncPeer.
//
// It leaves alone tunl0, which belongs to the ipip module (other software
// may use it), and every sysctl that New, PrepareNode or PrepareTunnel set
// (net.ipv4.vs.conntrack, expire_nodest_conn, sloppy_tcp, sloppy_sctp, drop_entry,
// accept_local and rp_filter): they are node settings whose earlier values
// are not known, and other software (kube-proxy's IPVS mode) may rely on
// them.
//
// A part that fails does not keep the others: Teardown goes on and
// returns every failure, joined. Parts already gone are fine. After a
// Teardown that succeeded the Dataplane is closed (see Close) and no
// other method may be called; a second Teardown, or Close, does nothing
// and returns nil. After one that failed it stays open: Teardown again
// tries what is left, and Close releases it.
func (d *Dataplane) Teardown() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case d.torn:
		return nil
	case d.closed:
		return errors.New("teardown: the dataplane is closed")
	}
	// The VIPs go before the VIP filter: bound without it, a VIP would
	// answer on every port of the node.
	errs := []error{d.teardownServices(), deleteLink(d.nl, d.name, "dummy")}
	if d.nft != nil {
		errs = append(errs, d.nft.removeTables(), removeTunnelNode(d.nl))
	}
	errs = append(errs, d.connSync.teardown(d.nl))
	if err := errors.Join(errs...); err != nil {
		d.stale = true
		return fmt.Errorf("teardown: %w", err)
	}
	d.torn = true
	d.close()
	return nil
}

// teardownServices deletes the virtual servers this Dataplane owns and
// unbinds its VIPs: Sync's plan for an empty desired state, from a read of
// what ownership needs only (the link's VIPs and the virtual servers
// without their real servers), so that nftables state gone or broken does
// not keep them.
func (d *Dataplane) teardownServices() error {
	have := NewState()
	err := d.readVIPs(have.VIPs)
	if err == nil {
		err = d.readServices(have, func(Key, map[netip.Addr]struct{}) bool { return false })
	}
	if err == nil {
		// The hairpin sets go with their tables (removeTables), whole:
		// no element is taken out first, in tables that may be gone
		// already.
		if d.nft != nil {
			d.nft.hairpin = [2]*nftables.Set{}
		}
		err = d.apply(Diff(NewState(), have))
	}
	if err != nil {
		return fmt.Errorf("virtual servers and VIPs: %w", err)
	}
	return nil
}
