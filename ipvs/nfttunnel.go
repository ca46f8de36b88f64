package ipvs

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The two-tier dataplane's maps and chains in the tables ip and ip6
// vipcast (see tunnel.go and tier2.go). They exist only while a Dataplane
// runs with Options.Tunnel: the raw chains stop connection tracking of VIP
// traffic from the fabric, which the source NAT of the one-tier path needs.
const (
	tier2Map   = "tier2"
	tunnelRaw  = "tunnel-raw"
	tunnelDNAT = "tunnel-dnat"
	tunnelIn   = "tunnel-input"
	tunnelMSS  = "tunnel-mss"
)

// tunnelChains are the chains of the two-tier dataplane, with their hooks.
var tunnelChains = []nftables.Chain{
	{Name: tunnelRaw, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw},
	{Name: tunnelDNAT, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest},
	{Name: tunnelIn, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter},
	{Name: tunnelMSS, Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityMangle},
}

// tier2Family is what the tier-2 map and the chains of one table (ip: 0,
// ip6: 1) differ in, beside the tunnel link that delivers the family's
// packets.
type tier2Family struct {
	addrType nftables.SetDatatype
	addrLen  uint32 // bytes
	nat      uint32 // NFPROTO_*
	daddrOff uint32 // the destination address in the network header
	saddrOff uint32 // the source address
}

var tier2Families = [2]tier2Family{
	{addrType: nftables.TypeIPAddr, addrLen: 4, nat: unix.NFPROTO_IPV4, daddrOff: 16, saddrOff: 12},
	{addrType: nftables.TypeIP6Addr, addrLen: 16, nat: unix.NFPROTO_IPV6, daddrOff: 24, saddrOff: 8},
}

// keyType is VIP . protocol . port . slot; dataType is endpoint address .
// port. The slot is typed mark, a 32-bit number in host byte order as
// numgen and jhash write it: nft's integer type has no size, and nft (1.0.6,
// Debian 12's) aborts listing a concatenation with one in it, and with it
// `nft list ruleset`, which operators run.
func (f tier2Family) keyType() nftables.SetDatatype {
	return nftables.MustConcatSetType(f.addrType, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark)
}

func (f tier2Family) dataType() nftables.SetDatatype {
	return nftables.MustConcatSetType(f.addrType, nftables.TypeInetService)
}

// setupTunnel ensures the tier-2 maps of the families on (kept with their
// elements when they have the expected types) and writes their chains'
// rules afresh, and takes the chains and map away from a family off, in
// one transaction: a restart with another MSS, or a newer release's rules,
// takes effect at once without touching the maps. links names each
// family's tunnel link ("": the family is off); mss is the clamp for TCP
// segments from clients of each family (tunnel.go); self the node's
// tunnel address of each family (invalid: none).
func (n *nftTables) setupTunnel(mss [2]uint16, links [2]string, self [2]netip.Addr) error {
	var sets, guards [2]*nftables.Set
	var guarded [2]map[netip.Addr]struct{}
	for i, fam := range tier2Families {
		t := n.tables[i]
		var err error
		if guards[i], guarded[i], err = n.setupTunnelGuard(i, t); err != nil {
			return err
		}
		if links[i] == "" {
			n.queueRemoveTunnel(t)
			continue
		}
		// The chains are emptied first: a map their rules use cannot be
		// deleted (EBUSY) when it must be made again.
		chains := make([]*nftables.Chain, len(tunnelChains))
		for j, c := range tunnelChains {
			c.Table = t
			chains[j] = n.conn.AddChain(&c)
			n.conn.FlushChain(chains[j])
		}
		set, err := n.ensureSlotMap(t, fam, tier2Map)
		if err != nil {
			return err
		}
		sets[i] = set
		for _, ch := range chains {
			for _, r := range tunnelRules(ch.Name, fam, links[i], n.vips[i], set, mss[i], self[i]) {
				n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r})
			}
		}
	}
	if err := n.conn.Flush(); err != nil {
		return fmt.Errorf("nftables tables %s, two-tier chains: %w", snatTable, slotExprHint(err))
	}
	n.tier2, n.guardSet, n.guardHave = sets, guards, guarded
	return nil
}

// removeTunnel deletes the two-tier maps and chains when a table has them
// (a node going back to the one-tier dataplane).
func (n *nftTables) removeTunnel() error {
	found := false
	for _, t := range n.tables {
		found = n.queueRemoveTunnel(t) || found
		found = n.queueRemoveTunnelGuard(t) || found
	}
	if !found {
		return nil
	}
	if err := n.conn.Flush(); err != nil {
		return fmt.Errorf("nftables tables %s: delete the two-tier chains: %w", snatTable, err)
	}
	n.tier2, n.guardSet, n.guardHave = [2]*nftables.Set{}, [2]*nftables.Set{}, [2]map[netip.Addr]struct{}{}
	return nil
}

// queueRemoveTunnel queues the deletion of table t's two-tier chains and
// map, those it has, and reports whether it had any.
func (n *nftTables) queueRemoveTunnel(t *nftables.Table) bool {
	found := false
	for _, c := range tunnelChains {
		if ch, err := n.conn.ListChain(t, c.Name); err == nil && ch != nil {
			n.conn.DelChain(ch)
			found = true
		}
	}
	if set, err := n.conn.GetSetByName(t, tier2Map); err == nil && set != nil {
		n.conn.DelSet(set)
		found = true
	}
	return found
}

// tunnelRules returns the rules of chain name in the table of family fam,
// whose packets tunnel link delivers (ip shown; ip6 the same with sit0 or
// vcip6tnl and ip6 daddr):
//
//	tunnel-raw:   iifname != "tunl0" ip daddr @vips notrack
//	tunnel-dnat:  iifname "tunl0" dnat ip to ip daddr . meta l4proto . th dport . jhash ip saddr mod Tier2Slots offset Tier2Slots map @tier2
//	              iifname "tunl0" dnat ip to ip daddr . meta l4proto . th dport . numgen random mod Tier2Slots map @tier2
//	tunnel-input: iifname "tunl0" ip daddr @vips counter drop
//	tunnel-mss:   ct direction reply ct original ip daddr @vips tcp flags & (syn|ack) == syn|ack
//	              tcp option maxseg size > mss tcp option maxseg size set mss
//
// tunnel-input drops what the tunnel delivers to a VIP without a tier-2
// entry (a virtual server with no endpoint on this node): left alone, IPVS
// would take it at LOCAL_IN and tunnel it again.
func tunnelRules(name string, fam tier2Family, link string, vips, tier2 *nftables.Set, mss uint16, self netip.Addr) [][]expr.Any {
	iif := func(op expr.CmpOp) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: op, Register: 1, Data: ifname(link)},
		}
	}
	daddr := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: fam.daddrOff, Len: fam.addrLen}
	inVIPs := &expr.Lookup{SourceRegister: 1, SetName: vips.Name, SetID: vips.ID}
	switch name {
	case tunnelRaw:
		return rawRules(fam, iif, daddr, inVIPs, vips, self)
	case tunnelDNAT:
		return slotDNATRules(fam, tier2, iif(expr.CmpOpEq))
	case tunnelIn:
		return [][]expr.Any{append(iif(expr.CmpOpEq), daddr, inVIPs, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop})}
	case tunnelMSS:
		m := binaryutil.BigEndian.PutUint16(mss)
		return [][]expr.Any{{
			&expr.Ct{Key: expr.CtKeyDIRECTION, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1}}, // IP_CT_DIR_REPLY
			&expr.Ct{Key: expr.CtKeyDST, Direction: 0, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: vips.Name, SetID: vips.ID},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x12}, Xor: []byte{0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x12}},
			&expr.Exthdr{Op: expr.ExthdrOpTcpopt, Type: 2, Offset: 2, Len: 2, DestRegister: 1},
			&expr.Cmp{Op: expr.CmpOpGt, Register: 1, Data: m},
			&expr.Immediate{Register: 1, Data: m},
			&expr.Exthdr{Op: expr.ExthdrOpTcpopt, Type: 2, Offset: 2, Len: 2, SourceRegister: 1},
		}}
	}
	return nil
}

// rawRules are the rules of the chain tunnelRaw: the martian check the
// node's accept_local (PrepareTunnel) needs, the answers of another node's
// tier 2 to this node's pods untracked, and the packets to a VIP from the
// fabric untracked. iif compares the input interface with the family's
// tunnel link, daddr loads the destination address, inVIPs looks it up in
// vips; self is the node's tunnel address of the family (invalid: none).
func rawRules(fam tier2Family, iif func(expr.CmpOp) []expr.Any, daddr *expr.Payload, inVIPs *expr.Lookup, vips *nftables.Set, self netip.Addr) [][]expr.Any {
	saddr := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: fam.saddrOff, Len: fam.addrLen}
	// A unicast packet from outside the node (not the loopback, not
	// the loop's tier 1 to itself) whose source is one of the node's
	// addresses: the kernel's martian check, which PrepareTunnel's
	// accept_local turns off for the sake of the VIPs, kept for every
	// other address; and for the VIPs, only towards another host
	// (a pod): such a packet is an answer from another node's tier 2.
	fromOutside := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyPKTTYPE, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.PACKET_HOST}},
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname("lo")},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(LoopPeer)},
	}
	localSource := []expr.Any{
		&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
	}
	drop := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}}
	var rules [][]expr.Any
	if self.IsValid() {
		// The tunnel address is local by a policy rule only, which
		// fib's address type does not see.
		rules = append(rules, concat(fromOutside, []expr.Any{saddr, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: self.AsSlice()}}, drop))
	}
	return append(rules,
		concat(fromOutside, localSource, []expr.Any{saddr, &expr.Lookup{SourceRegister: 1, SetName: vips.Name, SetID: vips.ID, Invert: true}}, drop),
		concat(fromOutside, []expr.Any{saddr, &expr.Lookup{SourceRegister: 1, SetName: vips.Name, SetID: vips.ID},
			&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)}}, drop),
		// That answer, untracked: its connection began on this node
		// with an untracked packet to the VIP (below), and conntrack
		// would call its first answer invalid (kube-proxy drops those).
		append(iif(expr.CmpOpNeq), saddr, &expr.Lookup{SourceRegister: 1, SetName: vips.Name, SetID: vips.ID}, &expr.Notrack{}),
		append(iif(expr.CmpOpNeq), daddr, inVIPs, &expr.Notrack{}),
	)
}

// concat returns the expressions of parts, in order, in a new slice.
func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// ifname is an interface name as nftables compares it.
func ifname(s string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, s)
	return b
}
