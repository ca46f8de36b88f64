package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Hairpin: a pod that reaches a Service it backs through the VIP may be
// balanced to itself. The packet then arrives with its own address as
// both source and destination, the pod answers itself inside its own
// network namespace, the node never undoes the NAT, and the connection
// fails. kube-proxy masquerades exactly that case (its endpoint chains
// mark a packet whose source is the endpoint itself); vipcast does the
// same where nothing masquerades the connection already (one tier under
// Local policy; two tiers, which keep the client's address under both
// policies):
//
//	table ip vipcast chain hairpin (nat, postrouting, srcnat)
//	    ip saddr . ip daddr @hairpin masquerade
//
// where the set holds "P . P" for every such endpoint P of this node's
// virtual servers. Only a packet NATed to the very pod that sent it has
// the same source and destination there, so the rule touches nothing
// else: the pod sees the node's address, and its answer comes back
// through the node.

const (
	hairpinSet   = "hairpin"
	hairpinChain = "hairpin"
)

// hairpinOf returns the endpoint addresses of svc (with slots, its tier-2
// slots, for a tier-1 virtual server) whose connections are not
// masqueraded otherwise: one tier's without source NAT, tier 2's.
// Sorted, without repeats.
func hairpinOf(svc Service, slots []netip.AddrPort) []netip.Addr {
	var out []netip.Addr
	switch {
	case tunnelled(svc.Backends):
		for _, s := range slots {
			if s.IsValid() {
				out = append(out, s.Addr().Unmap())
			}
		}
	case !svc.SNAT:
		for _, b := range svc.Backends {
			out = append(out, b.Addr.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// hairpins are the endpoints each virtual server needs in the hairpin set,
// and how many virtual servers need each.
type hairpins struct {
	by   map[Key][]netip.Addr
	refs map[netip.Addr]int
}

// hairpinsOf returns the hairpins of a whole desired state.
func hairpinsOf(st State) hairpins {
	t2 := Tier2Of(st)
	h := hairpins{by: map[Key][]netip.Addr{}, refs: map[netip.Addr]int{}}
	for _, svc := range st.Services {
		k := svc.Key()
		k.VIP = k.VIP.Unmap()
		h.set(k, hairpinOf(svc, t2[k]))
	}
	return h
}

// set makes addrs k's endpoints, reporting whether the union changed.
func (h *hairpins) set(k Key, addrs []netip.Addr) (changed bool) {
	if h.by == nil {
		h.by, h.refs = map[Key][]netip.Addr{}, map[netip.Addr]int{}
	}
	// Count the new ones in first, so that an endpoint that stays is
	// never seen to leave.
	for _, a := range addrs {
		if h.refs[a]++; h.refs[a] == 1 {
			changed = true
		}
	}
	for _, a := range h.by[k] {
		if h.refs[a]--; h.refs[a] == 0 {
			delete(h.refs, a)
			changed = true
		}
	}
	if len(addrs) == 0 {
		delete(h.by, k)
	} else {
		h.by[k] = addrs
	}
	return changed
}

// missing returns the addresses of next (contributions by key) that the
// union does not hold yet.
func (h *hairpins) missing(next map[Key][]netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, addrs := range next {
		for _, a := range addrs {
			if h.refs[a] == 0 {
				out = append(out, a)
			}
		}
	}
	return out
}

// all returns the union.
func (h *hairpins) all() []netip.Addr { return slices.Collect(maps.Keys(h.refs)) }

// hairpinNext returns, for each virtual server p touches, its endpoints in
// the hairpin set once p is applied to the in-memory state.
func (d *Dataplane) hairpinNext(p Plan) map[Key][]netip.Addr {
	keys := p.serviceKeys()
	keys = append(keys, p.AddSNAT...)
	keys = append(keys, p.DelSNAT...)
	for _, s := range append(slices.Clone(p.Tier2.Del), p.Tier2.Add...) {
		keys = append(keys, s.Key)
	}
	if len(keys) == 0 {
		return nil
	}
	after := State{Services: map[Key]Service{}}
	slots := Tier2{}
	for _, k := range keys {
		k.VIP = k.VIP.Unmap()
		if s, ok := d.cache.Services[k]; ok {
			after.Services[k] = s
		}
		if s, ok := d.tier2.have[k]; ok {
			slots[k] = slices.Clone(s)
		}
	}
	p.ApplyTo(&after)
	p.Tier2.ApplyTo(slots)
	next := make(map[Key][]netip.Addr, len(keys))
	for _, k := range keys {
		k.VIP = k.VIP.Unmap()
		next[k] = hairpinOf(after.Services[k], slots[k])
	}
	return next
}

// syncHairpin makes the hairpin sets hold exactly addrs.
func (d *Dataplane) syncHairpin(addrs []netip.Addr, f *failures) {
	if d.nft == nil || d.nft.hairpin[0] == nil {
		return
	}
	if err := d.nft.syncSets("hairpin", d.nft.hairpin, &d.nft.hairpinHave, addrs, pairCodec, nil); err != nil {
		f.add("hairpin masquerade", err)
	}
}

// setupHairpin makes, in both tables, the hairpin set (kept with its
// elements when it exists with the right type) and chain, in one
// transaction.
func (n *nftTables) setupHairpin() error {
	var sets [2]*nftables.Set
	var have [2]map[netip.Addr]struct{}
	for i, t := range n.tables {
		fam := tier2Families[i]
		keyType := nftables.MustConcatSetType(fam.addrType, fam.addrType)
		set, err := n.conn.GetSetByName(t, hairpinSet)
		if err == nil && set != nil && !set.IsMap && set.KeyType.Bytes == keyType.Bytes {
			if have[i], err = n.readSet(set, pairCodec); err != nil {
				return err
			}
		} else {
			if set != nil {
				n.conn.DelSet(set)
			}
			set = &nftables.Set{Table: t, Name: hairpinSet, KeyType: keyType, Concatenation: true}
			if err := n.conn.AddSet(set, nil); err != nil {
				return fmt.Errorf("set %s %s: %w", familyName(t.Family), hairpinSet, err)
			}
			have[i] = map[netip.Addr]struct{}{}
		}
		sets[i] = set
		ch := n.conn.AddChain(&nftables.Chain{
			Name: hairpinChain, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource,
		})
		n.conn.FlushChain(ch)
		n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: fam.saddrOff, Len: fam.addrLen},
			&expr.Payload{DestRegister: reg32 + fam.addrLen/4, Base: expr.PayloadBaseNetworkHeader, Offset: fam.daddrOff, Len: fam.addrLen},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
			&expr.Counter{},
			&expr.Masq{},
		}})
	}
	if err := n.conn.Flush(); err != nil {
		return fmt.Errorf("nftables tables %s, hairpin masquerade: %w", snatTable, err)
	}
	n.hairpin, n.hairpinHave = sets, have
	return nil
}
