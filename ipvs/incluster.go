package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// In-cluster clients: connections to a VIP that start on the node itself
// (the host) or in its pods.
//
// kube-proxy sends them to the Service's endpoints anywhere in the
// cluster, whatever externalTrafficPolicy says (Local keeps the client's
// address for clients from outside; a pod or the node has nothing to
// keep), and masquerades the node's own. IPVS alone cannot: one tier under
// Local has only this node's endpoints (none, on a node that does not
// announce the VIP: the pod would be refused), and with two tiers a node's
// own connection leaves from the VIP itself, so another node's pod
// answers to the VIP, which is that node's own address.
//
// So the in-cluster connections go straight to an endpoint by DNAT, past
// IPVS, through a map of vipcast's nftables tables, "incluster", with
// tier 2's layout (tier2.go): VIP . protocol . port . slot → endpoint
// address . port, the slots shared by weight among Service.Cluster, drawn
// at random, or from a hash of the client's address for client affinity
// (sessionAffinity ClientIP):
//
//	chain incluster-dnat
//	    ip daddr . meta l4proto . th dport @restricted ip daddr . meta l4proto . th dport . ip saddr != @sources return
//	    dnat ip to ip daddr . meta l4proto . th dport . jhash ip saddr mod 32 offset 32 map @incluster
//	    dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 32 map @incluster
//	chain incluster-host (nat, output, dstnat)
//	    goto incluster-dnat
//	chain incluster-pods (nat, prerouting, dstnat), one tier and Options.PodCIDRs only
//	    ip saddr 10.244.0.0/16 fib saddr . iif oif != 0 goto incluster-dnat
//	chain incluster-snat (nat, postrouting, srcnat)
//	    ip saddr @vips masquerade
//
// A lookup that misses (a virtual server without Cluster endpoints) ends
// the rule: the packet goes on to IPVS as before. The node's own
// connections are DNATed before IPVS takes them at LOCAL_OUT (priority
// NF_IP_PRI_NAT_DST + 1), and those that leave from the VIP (the kernel's
// source for a local destination), which the endpoint's node would take
// as its own, are masqueraded. The pods' are not (as
// kube-proxy keeps a pod's address): the answer comes back through this
// node, whose conntrack undoes the DNAT. A pod is known by its address
// (Options.PodCIDRs, kube-proxy's --cluster-cidr) that came in on the
// interface the node routes it back through (a strict reverse-path check:
// a packet from the fabric with a pod's address forged as its source is
// not a pod's, and goes to IPVS as the fabric's do; kube-proxy matches the
// address only); without them a pod's connection goes through IPVS, as
// one from outside does. With two tiers
// the pods' connections go through tier 1 (tunnel.go), which reaches every
// node's endpoints already, and only the node's own use the map.
//
// Source ranges hold for in-cluster clients as for the others: a client
// outside a restricted virtual server's ranges is not DNATed, and the VIP
// filter (filter.go) or the output chain (sources.go) drops it.

const (
	inClusterMap  = "incluster"
	inClusterDNAT = "incluster-dnat"
	inClusterHost = "incluster-host"
	inClusterPods = "incluster-pods"
	inClusterSNAT = "incluster-snat"
)

// InClusterOf returns the in-cluster map a desired State needs: the slots
// of each virtual server with Cluster endpoints.
func InClusterOf(desired State) Tier2 { return slotMapOf(desired, inClusterWant) }

// inClusterWant returns the in-cluster slots of svc: its Cluster endpoints,
// hashed by the client's address with client affinity (tier 2's, or one
// tier's IPVS persistence).
func inClusterWant(svc Service) []netip.AddrPort {
	return slotsWant(svc.Cluster, svc.Affinity || svc.Persistent > 0)
}

// checkPodCIDRs reports a pod range that is not a valid prefix.
func checkPodCIDRs(pods []netip.Prefix) error {
	var errs []error
	for _, p := range pods {
		switch {
		case !p.IsValid():
			errs = append(errs, fmt.Errorf("pod CIDR %q: not a valid prefix", p))
		case p.Addr().Is4In6():
			errs = append(errs, fmt.Errorf("pod CIDR %s: an IPv4-mapped IPv6 prefix; give the IPv4 prefix", p))
		}
	}
	return errors.Join(errs...)
}

// podCIDRsByFamily splits pods (checked by checkPodCIDRs) by family,
// masked, sorted, without repeats.
func podCIDRsByFamily(pods []netip.Prefix) [2][]netip.Prefix {
	var out [2][]netip.Prefix
	for _, p := range pods {
		i := famIndex(p.Addr())
		out[i] = append(out[i], p.Masked())
	}
	for i := range out {
		slices.SortFunc(out[i], comparePrefix)
		out[i] = slices.Compact(out[i])
	}
	return out
}

// setupInCluster ensures the in-cluster map of both families (kept with
// its elements when it has the expected types) and writes the chains'
// rules afresh, in one transaction; pods are the pod ranges of each family
// whose pods' connections the map takes (none: chain incluster-pods stays
// empty).
func (n *nftTables) setupInCluster(pods [2][]netip.Prefix) error {
	var sets [2]*nftables.Set
	for i, fam := range tier2Families {
		t := n.tables[i]
		// Emptied first: a map their rules use cannot be deleted (EBUSY)
		// when it must be made again; the regular chain before those
		// that jump to it.
		dnat := n.conn.AddChain(&nftables.Chain{Name: inClusterDNAT, Table: t})
		n.conn.FlushChain(dnat)
		base := map[string]*nftables.Chain{}
		for _, c := range []nftables.Chain{
			{Name: inClusterHost, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityNATDest},
			{Name: inClusterPods, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest},
			{Name: inClusterSNAT, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource},
		} {
			c.Table = t
			base[c.Name] = n.conn.AddChain(&c)
			n.conn.FlushChain(base[c.Name])
		}
		set, err := n.ensureSlotMap(t, fam, inClusterMap)
		if err != nil {
			return err
		}
		sets[i] = set
		for _, r := range inClusterDNATRules(fam, set, n.restricted[i], n.sources[i]) {
			n.conn.AddRule(&nftables.Rule{Table: t, Chain: dnat, Exprs: r})
		}
		toDNAT := &expr.Verdict{Kind: expr.VerdictGoto, Chain: inClusterDNAT}
		n.conn.AddRule(&nftables.Rule{Table: t, Chain: base[inClusterHost], Exprs: []expr.Any{toDNAT}})
		for _, p := range pods[i] {
			exprs := slices.Concat(prefixMatch(fam.saddrOff, p), reversePath(), []expr.Any{toDNAT})
			n.conn.AddRule(&nftables.Rule{Table: t, Chain: base[inClusterPods], Exprs: exprs})
		}
		// A new connection from a VIP: the node's own to a VIP (its
		// source is the destination's address); the nat chains see no
		// other packet (answers from a VIP belong to connections that
		// began elsewhere). The source, not "ct original daddr": nft
		// 1.0.6 aborts listing a set lookup of a ct address.
		n.conn.AddRule(&nftables.Rule{Table: t, Chain: base[inClusterSNAT], Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: fam.saddrOff, Len: fam.addrLen},
			&expr.Lookup{SourceRegister: 1, SetName: n.vips[i].Name, SetID: n.vips[i].ID},
			&expr.Counter{},
			&expr.Masq{},
		}})
	}
	if err := n.conn.Flush(); err != nil {
		return fmt.Errorf("nftables tables %s, in-cluster chains: %w", snatTable, slotExprHint(err))
	}
	n.incluster = sets
	return nil
}

// reversePath matches a packet whose source the node routes back through
// the interface the packet came in on (fib saddr . iif oif != 0): what
// rp_filter=1 checks, for these rules only.
func reversePath() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

// inClusterDNATRules are the rules of the chain incluster-dnat of a table
// of family fam: a client outside a restricted virtual server's ranges
// goes on untouched, the others to the endpoint of their slot in m.
func inClusterDNATRules(fam tier2Family, m, restricted, sources *nftables.Set) [][]expr.Any {
	check := sourceCheck(restricted, sources, fam.addrLen)
	check = append(check[:len(check)-2:len(check)-2], &expr.Verdict{Kind: expr.VerdictReturn}) // counter, drop
	return append([][]expr.Any{check}, slotDNATRules(fam, m, nil)...)
}

// slotDNATRules are the two rules that DNAT a packet matched by match to
// the endpoint of its slot in the slot map m (tier2Map, inClusterMap):
// for a virtual server with client affinity the slot is a hash of the
// client's address (read into the registers after the slot's), at
// Tier2Slots and above, and a lookup that misses (a virtual server without
// affinity) ends the first rule; the second draws the slot at random.
func slotDNATRules(fam tier2Family, m *nftables.Set, match []expr.Any) [][]expr.Any {
	// The 32-bit registers after the address: protocol, port, slot.
	after := reg32 + fam.addrLen/4
	dnat := func(slot ...expr.Any) []expr.Any {
		r := append(slices.Clone(match),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: fam.daddrOff, Len: fam.addrLen},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: after},
			&expr.Payload{DestRegister: after + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
		return append(append(r, slot...),
			&expr.Lookup{SourceRegister: 1, SetName: m.Name, SetID: m.ID, DestRegister: 1, IsDestRegSet: true},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam.nat, RegAddrMin: 1, RegProtoMin: after, Specified: true})
	}
	return [][]expr.Any{
		dnat(&expr.Payload{DestRegister: after + 3, Base: expr.PayloadBaseNetworkHeader, Offset: fam.saddrOff, Len: fam.addrLen},
			&expr.Hash{SourceRegister: after + 3, DestRegister: after + 2, Length: fam.addrLen, Modulus: Tier2Slots, Offset: Tier2Slots, Seed: affinitySeed, Type: expr.HashTypeJenkins}),
		dnat(&expr.Numgen{Register: after + 2, Modulus: Tier2Slots, Type: unix.NFT_NG_RANDOM}),
	}
}
