package ipvs

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The tunnel guard: decapsulation only from the nodes.
//
// The kernel's fallback tunnel devices (tunl0, sit0, ip6tnl0) decapsulate
// every IPIP, 6in4 or IPv6 tunnel packet addressed to any local address,
// from any source, and tier 2 must take the packets off tunl0 with
// reverse-path filtering off. Left alone, any host that reaches a node
// address would inject packets with a forged source to VIPs, pods and
// ClusterIPs (the CVE-2020-10136 class). So, with the two tiers on, each of
// vipcast's tables holds a set "tunnel-sources" (the nodes' addresses and
// tunnel addresses, from the speaker: SetTunnelSources) and a chain
// "tunnel-guard" (type filter, hook input, priority filter - 10, before the
// tunnel devices see the packet at its delivery) with the rules
//
//	iifname "vcloop1" accept
//	meta l4proto { 4, 41 } ip saddr != @tunnel-sources counter drop
//
// (ip6: ip6 saddr), and in the ip table one more for the IPVS sync
// daemons' multicast (connsync.go), which the kernel's backup takes from
// anyone on its link:
//
//	iifname != { "vcsync0", "vcsync1" } ip daddr 224.0.0.81 udp dport 8848 ip saddr != @tunnel-sources counter drop
//
// and with the relay (ConnSync.Relay) one for its port, which only the
// other nodes' relays send to (from their node addresses):
//
//	udp dport 8849 ip saddr != @tunnel-sources counter drop
//
// (the relay's veth pair carries the master's messages to the relay and
// what the relay let through to the backup, from its link-local
// addresses). The loop's packets are the node's own tier 1 to itself.
// Until the speaker has given the sources once, the set is empty and the
// second rule is left out (a new table must not drop the tunnel's traffic
// of the moment before the speaker knows the nodes); a restarted speaker
// finds the set with its elements and keeps the rule. Calico and other
// CNIs that tunnel IPIP between nodes send from the same node addresses.
const (
	tunnelSourcesSet = "tunnel-sources"
	tunnelGuardChain = "tunnel-guard"
)

// setupTunnelGuard queues, in table t (family i), the set of tunnel
// sources (kept with its elements when it exists) and the guard chain with
// its rules, the drop rule only when the set has elements. It returns the
// set and the sources it holds.
func (n *nftTables) setupTunnelGuard(i int, t *nftables.Table) (*nftables.Set, map[netip.Addr]struct{}, error) {
	set, have, err := n.addrSet(i, t, tunnelSourcesSet)
	if err != nil {
		return nil, nil, err
	}
	n.queueGuardRules(i, t, set, len(have) > 0)
	return set, have, nil
}

// addrSet returns table t's (family i) set of addresses name with what it
// holds, kept when it exists with that type, else queued afresh (empty).
func (n *nftTables) addrSet(i int, t *nftables.Table, name string) (*nftables.Set, map[netip.Addr]struct{}, error) {
	addrType := tier2Families[i].addrType
	set, err := n.conn.GetSetByName(t, name)
	if err == nil && set != nil && !set.IsMap && set.KeyType.Bytes == addrType.Bytes {
		have, err := n.readAddrs(set)
		return set, have, err
	}
	if set != nil {
		n.conn.DelSet(set)
	}
	set = &nftables.Set{Table: t, Name: name, KeyType: addrType}
	if err := n.conn.AddSet(set, nil); err != nil {
		return nil, nil, fmt.Errorf("set %s %s: %w", familyName(t.Family), name, err)
	}
	return set, map[netip.Addr]struct{}{}, nil
}

// queueGuardRules queues the guard chain of table t (family i) with its
// rules afresh: the drop rule only with guard.
func (n *nftTables) queueGuardRules(i int, t *nftables.Table, set *nftables.Set, guard bool) {
	accept := nftables.ChainPolicyAccept
	ch := n.conn.AddChain(&nftables.Chain{
		Name: tunnelGuardChain, Table: t, Type: nftables.ChainTypeFilter,
		// Before tunnel-input (filter): the order among input chains of
		// one priority is undefined.
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityRef(-10), Policy: &accept,
	})
	n.conn.FlushChain(ch)
	n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(LoopPeer)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	if !guard {
		return
	}
	fam := tier2Families[i]
	saddrOff := uint32(12)
	if fam.addrLen == 16 {
		saddrOff = 8
	}
	fromStranger := func() []expr.Any {
		return []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: saddrOff, Len: fam.addrLen},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: true},
			&expr.Counter{},
			&expr.Verdict{Kind: expr.VerdictDrop},
		}
	}
	for _, proto := range []byte{unix.IPPROTO_IPIP, unix.IPPROTO_IPV6} {
		n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: []byte(dropTunnel), Exprs: append([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		}, fromStranger()...)})
	}
	if fam.addrLen != 4 {
		return
	}
	if n.relayPort != 0 {
		n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: []byte(dropRelay), Exprs: append([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, n.relayPort)},
		}, fromStranger()...)})
	}
	// The sync daemons' group, but on the relay's own veth pair: the
	// master's messages to the relay arrive on its end, the relay's to the
	// backup on the other.
	group := netip.MustParseAddr(syncMcastGroup).As4()
	n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: []byte(dropSyncMulticast), Exprs: append([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(SyncLink)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(SyncPeer)},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: group[:]},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, syncMcastPort)},
	}, fromStranger()...)})
}

// queueRemoveTunnelGuard queues the deletion of table t's guard chain and
// set, those it has, and reports whether it had any.
func (n *nftTables) queueRemoveTunnelGuard(t *nftables.Table) bool {
	found := false
	if ch, err := n.conn.ListChain(t, tunnelGuardChain); err == nil && ch != nil {
		n.conn.DelChain(ch)
		found = true
	}
	if set, err := n.conn.GetSetByName(t, tunnelSourcesSet); err == nil && set != nil {
		n.conn.DelSet(set)
		found = true
	}
	return found
}

// setTunnelSources makes each family's set of tunnel sources exactly the
// addresses of that family in addrs, with the guard's drop rule in force
// whenever the set is not empty, in one transaction.
func (n *nftTables) setTunnelSources(addrs []netip.Addr) error {
	return n.syncGuardSets("tunnel sources", n.guardSet, &n.guardHave, addrs, func(i int, set *nftables.Set, on bool) {
		n.queueGuardRules(i, n.tables[i], set, on)
	})
}

// syncGuardSets makes each family's set in sets (nil: that family has
// none) hold exactly the addresses of addrs of its family, in one
// transaction; requeue(i, set, on) queues family i's rules again when its
// set goes from empty to not, or back (on: it has elements). have caches
// what the sets hold (nil: unknown, read them first) and is kept current.
func (n *nftTables) syncGuardSets(what string, sets [2]*nftables.Set, have *[2]map[netip.Addr]struct{}, addrs []netip.Addr, requeue func(i int, set *nftables.Set, on bool)) error {
	return n.syncSets(what, sets, have, addrs, addrCodec, requeue)
}

// setCodec is how a set of addresses keys its elements: by the address
// (addrCodec), or by the address twice, "P . P" (pairCodec, the hairpin
// set).
type setCodec bool

const (
	addrCodec setCodec = false
	pairCodec setCodec = true
)

// key is a's element key.
func (c setCodec) key(a netip.Addr) []byte {
	b := a.AsSlice()
	if c == pairCodec {
		b = append(b, b...)
	}
	return b
}

// addr is the address of the element key b; false when b is not one of
// c's keys.
func (c setCodec) addr(b []byte) (netip.Addr, bool) {
	if c == pairCodec {
		h := len(b) / 2
		if len(b)%2 != 0 || string(b[:h]) != string(b[h:]) {
			return netip.Addr{}, false
		}
		b = b[:h]
	}
	return netip.AddrFromSlice(b)
}

// elements are the set elements of addrs.
func (c setCodec) elements(addrs []netip.Addr) []nftables.SetElement {
	out := make([]nftables.SetElement, len(addrs))
	for i, a := range addrs {
		out[i] = nftables.SetElement{Key: c.key(a)}
	}
	return out
}

// syncSets is syncGuardSets for sets whose elements codec keys; requeue
// may be nil.
func (n *nftTables) syncSets(what string, sets [2]*nftables.Set, have *[2]map[netip.Addr]struct{}, addrs []netip.Addr, codec setCodec, requeue func(i int, set *nftables.Set, on bool)) error {
	var want [2]map[netip.Addr]struct{}
	for i := range want {
		want[i] = map[netip.Addr]struct{}{}
	}
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() || a.IsUnspecified() {
			continue
		}
		want[famIndex(a)][a] = struct{}{}
	}
	changed := false
	for i, set := range sets {
		if set == nil {
			continue
		}
		if have[i] == nil {
			h, err := n.readSet(set, codec)
			if err != nil {
				return err
			}
			have[i] = h
		}
		add, del := missing(want[i], have[i]), missing(have[i], want[i])
		if len(add) == 0 && len(del) == 0 {
			continue
		}
		changed = true
		slices.SortFunc(add, netip.Addr.Compare)
		slices.SortFunc(del, netip.Addr.Compare)
		if err := queueElements(n.conn.SetAddElements, set, codec.elements(add)); err != nil {
			return err
		}
		if err := queueElements(n.conn.SetDeleteElements, set, codec.elements(del)); err != nil {
			return err
		}
		if requeue != nil && (len(have[i]) > 0) != (len(want[i]) > 0) {
			requeue(i, set, len(want[i]) > 0)
		}
	}
	if !changed {
		return nil
	}
	if err := n.conn.Flush(); err != nil {
		// What the sets hold is unknown now: the next call reads them.
		*have = [2]map[netip.Addr]struct{}{}
		return fmt.Errorf("nftables tables %s: %s: %w", snatTable, what, err)
	}
	for i := range have {
		if sets[i] != nil {
			have[i] = want[i]
		}
	}
	return nil
}

// readAddrs reads the addresses in set.
func (n *nftTables) readAddrs(set *nftables.Set) (map[netip.Addr]struct{}, error) {
	return n.readSet(set, addrCodec)
}

// readSet reads the addresses in set, whose elements codec keys.
func (n *nftTables) readSet(set *nftables.Set, codec setCodec) (map[netip.Addr]struct{}, error) {
	els, err := n.conn.GetSetElements(set)
	if err != nil {
		return nil, fmt.Errorf("nftables set %s %s: %w", familyName(set.Table.Family), set.Name, err)
	}
	out := make(map[netip.Addr]struct{}, len(els))
	for _, e := range els {
		if a, ok := codec.addr(e.Key); ok {
			out[a] = struct{}{}
		}
	}
	return out, nil
}

func famIndex(a netip.Addr) int {
	if a.Is4() {
		return 0
	}
	return 1
}
