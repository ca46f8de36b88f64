package ipvs

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The VIP filter's chain and sets in vipcast's nftables tables; the rules
// are described in filter.go.

// addFilterChain queues the input chain of table t and its rules; vips and
// allow are the table's sets, addrLen its address length (4 or 16).
func (n *nftTables) addFilterChain(t *nftables.Table, vips, allow *nftables.Set, addrLen uint32) {
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

// readFilter reads the filter's sets.
func (n *nftTables) readFilter() (Filter, error) {
	f := NewFilter()
	allow, err := n.readKeys(n.allow)
	if err != nil {
		return f, err
	}
	f.Allow = allow
	for _, set := range n.vips {
		els, err := n.conn.GetSetElements(set)
		if err != nil {
			return f, fmt.Errorf("nftables set %s %s: %w", set.Table.Name, set.Name, err)
		}
		for _, e := range els {
			if a, ok := netip.AddrFromSlice(e.Key); ok {
				f.VIPs[a] = struct{}{}
			}
		}
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
