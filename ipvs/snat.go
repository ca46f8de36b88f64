package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Source NAT for externalTrafficPolicy: Cluster.
//
// IPVS in NAT (masquerade) mode rewrites only the destination: the packet
// reaches the real server with the client's source address. A real server
// on another node answers the client directly, through its own node, with
// its own address as source: the client drops that reply (it talked to the
// VIP), and stateful firewalls on the way drop it too. So, for a Service
// with externalTrafficPolicy Cluster, the node that balanced the connection
// must also rewrite the source to its own address, and the replies come
// back to it, where IPVS and conntrack undo both rewrites.
//
// Mechanism: the kernel's connection tracking plus an nftables masquerade
// rule, programmed over netlink (github.com/google/nftables; no nft or
// iptables binary needed on the node):
//
//   - net.ipv4.vs.conntrack=1 (covers IPv6 too) makes IPVS keep the
//     conntrack entry of the connections it forwards (and update its reply
//     tuple to the real server), so that netfilter NAT applies to them;
//     without it IPVS marks its packets untracked and no NAT rule ever sees
//     them. kube-proxy's IPVS mode relies on the same setting.
//   - table ip vipcast / table ip6 vipcast, each owned by vipcast alone and
//     never touching any other table, with a set "snat" of VIP . protocol .
//     port (the virtual servers of Cluster-policy Services) and a chain
//     "postrouting" (type nat, hook postrouting, priority srcnat) holding
//     one rule:
//     ct original daddr . ct protocol . ct original proto-dst @snat masquerade
//     After IPVS has rewritten the destination to the real server, the
//     conntrack entry still remembers the original destination (VIP and
//     port), which is what identifies the Service: the packet's own
//     addresses no longer do.
//
// Why not the alternatives: IPVS has no source NAT of its own (FULLNAT
// never went upstream); an iptables rule would need the iptables binary and
// its legacy/nft flavour to match the host's; a firewall mark set in
// prerouting plus a mark match would cost a rule per Service or a shared
// mark bit with kube-proxy. The set makes a Service's policy change one
// element add or delete, whatever the number of Services.
//
// Every connection of a Cluster-policy virtual server is masqueraded, also
// those to an endpoint on this node (as kube-proxy does for Cluster): the
// Service then sees one kind of source address whatever endpoint answers.
// Local-policy virtual servers are never in the set: the client's address
// is kept.

const (
	snatTable = "vipcast"
	snatSet   = "snat"
	snatChain = "postrouting"
)

// snat owns the ip and ip6 vipcast tables.
type snat struct {
	conn   *nftables.Conn
	tables [2]*nftables.Table // ip, ip6
	sets   [2]*nftables.Set
}

func newSNAT() (*snat, error) {
	if err := enableIPVSConntrack(); err != nil {
		return nil, fmt.Errorf("%w: prepare the node first: the chart runs `vipcast-speaker %s` in a privileged init container (speaker.ipvs.prepareNode: true), or set net.ipv4.vs.conntrack=1 on the node (/etc/sysctl.d, with ip_vs in /etc/modules-load.d)", err, PrepareNodeCommand)
	}
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	n := &snat{conn: c}
	for i, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		if err := n.ensure(i, fam); err != nil {
			return nil, fmt.Errorf("nftables table %s %s: %w", familyName(fam), snatTable, err)
		}
	}
	return n, nil
}

func familyName(f nftables.TableFamily) string {
	if f == nftables.TableFamilyIPv6 {
		return "ip6"
	}
	return "ip"
}

// ensure reuses the table when it has the expected set and chain (a
// restarted speaker: the set's elements stay, and so does the masquerading
// of established connections), and recreates it otherwise. Connections
// already masqueraded keep their translation even across a recreation:
// conntrack holds it.
func (n *snat) ensure(i int, fam nftables.TableFamily) error {
	t := &nftables.Table{Name: snatTable, Family: fam}
	n.tables[i] = t
	if set, ok := n.existing(t); ok {
		n.sets[i] = set
		return nil
	}
	if tables, err := n.conn.ListTablesOfFamily(fam); err == nil {
		for _, old := range tables {
			if old.Name == snatTable {
				n.conn.DelTable(old)
			}
		}
	}
	n.conn.AddTable(t)
	keyType, addrLen := nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService), 4
	if fam == nftables.TableFamilyIPv6 {
		keyType, addrLen = nftables.MustConcatSetType(nftables.TypeIP6Addr, nftables.TypeInetProto, nftables.TypeInetService), 16
	}
	set := &nftables.Set{Table: t, Name: snatSet, KeyType: keyType, Concatenation: true}
	if err := n.conn.AddSet(set, nil); err != nil {
		return err
	}
	ch := n.conn.AddChain(&nftables.Chain{
		Name: snatChain, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource,
	})
	// Registers: the address goes to the first 32-bit registers (NFT_REG_1
	// = NFT_REG32_00..03), protocol and port to the next ones: the layout of
	// a concatenated key.
	const reg32 = 8 // NFT_REG32_00
	regProto := uint32(reg32 + addrLen/4)
	n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeyDST, Direction: 0}, // original direction
		&expr.Ct{Register: regProto, Key: expr.CtKeyPROTOCOL},
		&expr.Ct{Register: regProto + 1, Key: expr.CtKeyPROTODST, Direction: 0},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
		&expr.Counter{},
		&expr.Masq{},
	}})
	if err := n.conn.Flush(); err != nil {
		return err
	}
	n.sets[i] = set
	return nil
}

func (n *snat) existing(t *nftables.Table) (*nftables.Set, bool) {
	set, err := n.conn.GetSetByName(t, snatSet)
	if err != nil || set == nil || !set.Concatenation {
		return nil, false
	}
	ch, err := n.conn.ListChain(t, snatChain)
	if err != nil || ch == nil || ch.Type != nftables.ChainTypeNAT {
		return nil, false
	}
	// The table, its set, chain and rule were made in one nftables
	// transaction, so a table that has both the set and the chain has the
	// rule too. (The rule is not read back: google/nftables v0.3.0 cannot
	// decode its ct expressions.)
	return set, true
}

func (n *snat) close() {
	_ = n.conn.CloseLasting()
}

// element encodes k as a set key: address, then protocol and port each in
// a 32-bit register slot.
func snatElement(k Key) nftables.SetElement {
	b := k.VIP.AsSlice()
	// IP protocol numbers are 8-bit (TCP 6, UDP 17, SCTP 132).
	b = append(b, byte(k.Protocol), 0, 0, 0) //nolint:gosec // see above
	b = binary.BigEndian.AppendUint16(b, k.Port)
	b = append(b, 0, 0)
	return nftables.SetElement{Key: b}
}

func parseSNATElement(b []byte) (Key, bool) {
	if len(b) != 12 && len(b) != 24 {
		return Key{}, false
	}
	a, ok := netip.AddrFromSlice(b[:len(b)-8])
	if !ok {
		return Key{}, false
	}
	r := b[len(b)-8:]
	return Key{VIP: a, Protocol: Protocol(r[0]), Port: uint16(r[4])<<8 | uint16(r[5])}, true
}

func (n *snat) read() (map[Key]struct{}, error) {
	out := map[Key]struct{}{}
	for _, set := range n.sets {
		els, err := n.conn.GetSetElements(set)
		if err != nil {
			return nil, fmt.Errorf("nftables set %s %s: %w", set.Table.Name, set.Name, err)
		}
		for _, e := range els {
			if k, ok := parseSNATElement(e.Key); ok {
				out[k] = struct{}{}
			}
		}
	}
	return out, nil
}

// apply adds and deletes elements in one batch per call.
func (n *snat) apply(add, del []Key) error {
	if len(add) == 0 && len(del) == 0 {
		return nil
	}
	split := func(keys []Key) (v4, v6 []nftables.SetElement) {
		for _, k := range keys {
			if k.VIP.Is4() {
				v4 = append(v4, snatElement(k))
			} else {
				v6 = append(v6, snatElement(k))
			}
		}
		return
	}
	var errs []error
	a4, a6 := split(add)
	d4, d6 := split(del)
	for i, els := range [][]nftables.SetElement{a4, a6} {
		if len(els) > 0 {
			errs = append(errs, n.conn.SetAddElements(n.sets[i], els))
		}
	}
	for i, els := range [][]nftables.SetElement{d4, d6} {
		if len(els) > 0 {
			errs = append(errs, n.conn.SetDeleteElements(n.sets[i], els))
		}
	}
	err := errors.Join(errs...)
	if err == nil {
		err = n.conn.Flush()
	}
	if err == nil {
		return nil
	}
	// One bad element (say, a delete of one already gone) fails the whole
	// batch: redo them one by one, ignoring what is already done.
	var errs2 []error
	for _, k := range add {
		if err := n.one(k, true); err != nil {
			errs2 = append(errs2, fmt.Errorf("add %s: %w", k, err))
		}
	}
	for _, k := range del {
		if err := n.one(k, false); err != nil && !isNotFound(err) {
			errs2 = append(errs2, fmt.Errorf("delete %s: %w", k, err))
		}
	}
	return errors.Join(errs2...)
}

func (n *snat) one(k Key, add bool) error {
	set := n.sets[0]
	if !k.VIP.Is4() {
		set = n.sets[1]
	}
	var err error
	if add {
		err = n.conn.SetAddElements(set, []nftables.SetElement{snatElement(k)})
	} else {
		err = n.conn.SetDeleteElements(set, []nftables.SetElement{snatElement(k)})
	}
	if err != nil {
		return err
	}
	return n.conn.Flush()
}
