package ipvs

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// GuardDrops returns the packets the tunnel guard and the host guard
// dropped, summed over both families, by what the dropping rule guards:
// "tunnel" (IPIP, 6in4, ip6ip6 from a non-node), "relay" and
// "sync-multicast" (connection sync from a non-node), "bfd" (BFD from a
// router the node has no session with), "metrics" (the metrics port from
// a source not allowed). A rule not in force has no entry. The counters
// are the kernel's, so they survive a restart of the speaker and restart
// from zero when the rules are written afresh (a change of the chain's
// rules).
func (d *Dataplane) GuardDrops() (map[string]uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.nft == nil {
		return nil, nil
	}
	out := map[string]uint64{}
	for _, t := range d.nft.tables {
		for _, chain := range []string{tunnelGuardChain, hostGuardChain} {
			if ch, err := d.nft.conn.ListChain(t, chain); err != nil || ch == nil {
				continue // not there: nothing dropped
			}
			rules, err := d.nft.conn.GetRules(t, &nftables.Chain{Name: chain, Table: t})
			if err != nil {
				return nil, fmt.Errorf("nftables chain %s %s %s: %w", familyName(t.Family), snatTable, chain, err)
			}
			for _, r := range rules {
				if len(r.UserData) == 0 {
					continue
				}
				for _, e := range r.Exprs {
					if c, ok := e.(*expr.Counter); ok {
						out[string(r.UserData)] += c.Packets
					}
				}
			}
		}
	}
	return out, nil
}
