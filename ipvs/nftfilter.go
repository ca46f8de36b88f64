package ipvs

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The VIP filter's chain and sets in vipcast's nftables tables; the rules
// are described in filter.go.

// addFilterChain queues the input chain of table t and its rules; vips,
// allow, restricted and sources are the table's sets, addrLen its address
// length (4 or 16).
func (n *nftTables) addFilterChain(t *nftables.Table, vips, allow, restricted, sources *nftables.Set, addrLen uint32) {
	accept := nftables.ChainPolicyAccept
	ch := n.conn.AddChain(&nftables.Chain{
		Name: filterChain, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept,
	})
	daddr := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
	// ICMP "fragmentation needed" (type 3 code 4); ICMPv6 "packet too big"
	// (type 2).
	icmpProto, icmp, icmpLen := []byte{unix.IPPROTO_ICMP}, []byte{3, 4}, uint32(2)
	if addrLen == 16 {
		daddr = &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16}
		icmpProto, icmp, icmpLen = []byte{unix.IPPROTO_ICMPV6}, []byte{2}, 1
	}
	regProto := reg32 + addrLen/4
	accepted := &expr.Verdict{Kind: expr.VerdictAccept}
	rules := [][]expr.Any{
		// Not a VIP: not the filter's business.
		{daddr, &expr.Lookup{SourceRegister: 1, SetName: vips.Name, SetID: vips.ID, Invert: true}, &expr.Verdict{Kind: expr.VerdictReturn}},
		// A client outside a restricted virtual server's ranges, before
		// anything lets it through (sources.go).
		sourceCheck(restricted, sources, addrLen),
		// A virtual server's port.
		{
			daddr,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regProto},
			&expr.Payload{DestRegister: regProto + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: allow.Name, SetID: allow.ID},
			accepted,
		},
		// A flow the node already has.
		{
			&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
			accepted,
		},
		// Path MTU discovery.
		{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: icmpProto},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: icmpLen},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: icmp},
			accepted,
		},
		// Everything else addressed to a VIP.
		{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}},
	}
	for _, r := range rules {
		n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
	}
}

// sourceCheck is the rule that drops a packet to a restricted virtual
// server (the set restricted) from a client outside its ranges (the set
// sources): the registers hold VIP . protocol . port, then the source
// address, the layout of the sets' keys.
func sourceCheck(restricted, sources *nftables.Set, addrLen uint32) []expr.Any {
	daddrOff, saddrOff := uint32(16), uint32(12)
	if addrLen == 16 {
		daddrOff, saddrOff = 24, 8
	}
	regProto := reg32 + addrLen/4
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: daddrOff, Len: addrLen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: regProto},
		&expr.Payload{DestRegister: regProto + 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 1, SetName: restricted.Name, SetID: restricted.ID},
		&expr.Payload{DestRegister: regProto + 2, Base: expr.PayloadBaseNetworkHeader, Offset: saddrOff, Len: addrLen},
		&expr.Lookup{SourceRegister: 1, SetName: sources.Name, SetID: sources.ID, Invert: true},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

// addOutputChain queues the output chain of table t: the source check for
// the node's own connections to a VIP (sources.go).
func (n *nftTables) addOutputChain(t *nftables.Table, restricted, sources *nftables.Set, addrLen uint32) {
	accept := nftables.ChainPolicyAccept
	ch := n.conn.AddChain(&nftables.Chain{
		Name: outputChain, Table: t, Type: nftables.ChainTypeFilter,
		// Mangle (-150): before IPVS takes the node's own connections to
		// a virtual server (LOCAL_OUT, priority NF_IP_PRI_NAT_DST + 1).
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityMangle, Policy: &accept,
	})
	n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: sourceCheck(restricted, sources, addrLen)})
}

// readFilter reads the filter's sets.
func (n *nftTables) readFilter() (Filter, error) {
	f := NewFilter()
	allow, err := n.readKeys(n.allow)
	if err != nil {
		return f, err
	}
	f.Allow = allow
	if f.Restricted, err = n.readKeys(n.restricted); err != nil {
		return f, err
	}
	for _, set := range n.sources {
		els, err := n.conn.GetSetElements(set)
		if err != nil {
			return f, fmt.Errorf("nftables set %s %s: %w", set.Table.Name, set.Name, err)
		}
		for _, e := range els {
			// vipcast writes prefixes only; another range (added by
			// hand) is not read back, so Sync does not repair it.
			if r, ok := parseSourceElement(e.Key, e.KeyEnd); ok {
				f.Sources[r.Key] = append(f.Sources[r.Key], r.Range)
			}
		}
	}
	for k := range f.Sources {
		slices.SortFunc(f.Sources[k], comparePrefix)
	}
	for _, set := range n.vips {
		vips, err := n.readAddrs(set)
		if err != nil {
			return f, err
		}
		maps.Copy(f.VIPs, vips)
	}
	return f, nil
}

func vipElems(vips []netip.Addr) []setElem {
	out := make([]setElem, len(vips))
	for i, a := range vips {
		out[i] = setElem{v6: !a.Is4(), key: a.AsSlice(), name: "VIP " + a.String()}
	}
	return out
}
