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
	snatTable   = "vipcast"
	snatSet     = "snat"
	snatChain   = "postrouting"
	filterVIPs  = "vips"
	filterAllow = "allow"
	filterChain = "input"
	// The source ranges' sets and the chain for the node's own
	// connections (sources.go).
	filterRestricted = "restricted"
	filterSources    = "sources"
	outputChain      = "output"
)

// nftTables owns the ip and ip6 vipcast tables: the source NAT set and
// chain, and the VIP filter's sets and chain (filter.go). Both are always
// there; what Options turn off is whether vipcast puts elements in them.
type nftTables struct {
	conn   *nftables.Conn
	tables [2]*nftables.Table // ip, ip6
	snat   [2]*nftables.Set
	vips   [2]*nftables.Set
	allow  [2]*nftables.Set
	// restricted and sources hold the source ranges (sources.go).
	restricted [2]*nftables.Set
	sources    [2]*nftables.Set
	tier2      [2]*nftables.Set // the two-tier dataplane's maps, once set up
	incluster  [2]*nftables.Set // the in-cluster maps, once set up (incluster.go)
	// guardSet are the tunnel guard's sets of sources, once set up
	// (tunnelguard.go); guardHave what they hold (nil: unknown).
	guardSet  [2]*nftables.Set
	guardHave [2]map[netip.Addr]struct{}
	// hostGuard is the host guard's configuration; bfdSet its sets of BFD
	// peers and bfdHave what they hold (nil: unknown) (hostguard.go).
	hostGuard HostGuard
	bfdSet    [2]*nftables.Set
	bfdHave   [2]map[netip.Addr]struct{}
	// hairpin are the hairpin sets ("P . P"; hairpin.go) with source NAT
	// on, hairpinHave what they hold (nil: unknown).
	hairpin     [2]*nftables.Set
	hairpinHave [2]map[netip.Addr]struct{}
	// relayPort is the connection sync relay's UDP port (0: no relay),
	// which the tunnel guard opens to the tunnel sources only.
	relayPort uint16
	// slowPaths counts the batches that failed and were redone one element
	// at a time (for tests: a batch should fail only on drift).
	slowPaths int
}

// newNFTables ensures the tables; with conntrack it first sets
// net.ipv4.vs.conntrack=1 (needed for source NAT).
func newNFTables(conntrack bool) (*nftTables, error) {
	if conntrack {
		if err := enableIPVSConntrack(); err != nil {
			return nil, fmt.Errorf("%w: prepare the node first: the chart runs `vipcast-speaker %s` in a privileged init container (speaker.ipvs.prepareNode: true), or set net.ipv4.vs.conntrack=1 on the node (/etc/sysctl.d, with ip_vs in /etc/modules-load.d)", err, PrepareNodeCommand)
		}
	}
	// A lasting connection: its socket stays in the network namespace New
	// ran in, whatever thread later calls the Dataplane (a transient one
	// would open a socket in the caller's namespace for each operation).
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("nftables netlink: %w", err)
	}
	n := &nftTables{conn: c}
	for i, fam := range tableFamilies {
		if err := n.ensure(i, fam); err != nil {
			return nil, fmt.Errorf("nftables table %s %s: %w", familyName(fam), snatTable, err)
		}
	}
	return n, nil
}

// tableFamilies are the families of the tables, in the order of
// nftTables.tables.
var tableFamilies = [2]nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6}

func familyName(f nftables.TableFamily) string {
	if f == nftables.TableFamilyIPv6 {
		return "ip6"
	}
	return "ip"
}

// ensure reuses the table when it has the expected sets and chains (a
// restarted speaker: the sets' elements stay, and so do the masquerading of
// established connections and the VIP filter), and recreates it otherwise
// (a table of an older version: the next Sync puts the elements back).
// Connections already masqueraded keep their translation even across a
// recreation: conntrack holds it.
func (n *nftTables) ensure(i int, fam nftables.TableFamily) error {
	t := &nftables.Table{Name: snatTable, Family: fam}
	n.tables[i] = t
	if n.existing(i, t) {
		return nil
	}
	// A failed listing queues nothing: the transaction below reports the
	// trouble.
	_, _ = n.dropTable(fam)
	n.conn.AddTable(t)
	addrType, addrLen := nftables.TypeIPAddr, uint32(4)
	if fam == nftables.TableFamilyIPv6 {
		addrType, addrLen = nftables.TypeIP6Addr, 16
	}
	keyType := nftables.MustConcatSetType(addrType, nftables.TypeInetProto, nftables.TypeInetService)
	sets := []*nftables.Set{
		{Table: t, Name: snatSet, KeyType: keyType, Concatenation: true},
		{Table: t, Name: filterVIPs, KeyType: addrType},
		{Table: t, Name: filterAllow, KeyType: keyType, Concatenation: true},
		{Table: t, Name: filterRestricted, KeyType: keyType, Concatenation: true},
		{Table: t, Name: filterSources, Concatenation: true, Interval: true,
			KeyType: nftables.MustConcatSetType(addrType, nftables.TypeInetProto, nftables.TypeInetService, addrType)},
	}
	for _, set := range sets {
		if err := n.conn.AddSet(set, nil); err != nil {
			return fmt.Errorf("set %s: %w", set.Name, err)
		}
	}
	n.addSNATChain(t, sets[0], addrLen)
	n.addFilterChain(t, sets[1], sets[2], sets[3], sets[4], addrLen)
	n.addOutputChain(t, sets[3], sets[4], addrLen)
	if err := n.conn.Flush(); err != nil {
		return err
	}
	n.snat[i], n.vips[i], n.allow[i], n.restricted[i], n.sources[i] = sets[0], sets[1], sets[2], sets[3], sets[4]
	return nil
}

// Registers: an address goes to the first 32-bit registers (NFT_REG_1 =
// NFT_REG32_00..03), protocol and port to the next ones: the layout of a
// concatenated key.
const reg32 = 8 // NFT_REG32_00

// addSNATChain queues the postrouting chain and its masquerade rule.
func (n *nftTables) addSNATChain(t *nftables.Table, set *nftables.Set, addrLen uint32) {
	ch := n.conn.AddChain(&nftables.Chain{
		Name: snatChain, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource,
	})
	regProto := reg32 + addrLen/4
	n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeyDST, Direction: 0}, // original direction
		&expr.Ct{Register: regProto, Key: expr.CtKeyPROTOCOL},
		&expr.Ct{Register: regProto + 1, Key: expr.CtKeyPROTODST, Direction: 0},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
		&expr.Counter{},
		&expr.Masq{},
	}})
}

// existing reports whether table t (slot i) has every set and chain, and
// then keeps its sets.
func (n *nftTables) existing(i int, t *nftables.Table) bool {
	var sets [5]*nftables.Set
	for j, name := range []string{snatSet, filterVIPs, filterAllow, filterRestricted, filterSources} {
		set, err := n.conn.GetSetByName(t, name)
		if err != nil || set == nil {
			return false
		}
		sets[j] = set
	}
	if !sets[0].Concatenation || !sets[2].Concatenation || !sets[3].Concatenation || !sets[4].Concatenation || !sets[4].Interval {
		return false
	}
	for name, typ := range map[string]nftables.ChainType{snatChain: nftables.ChainTypeNAT, filterChain: nftables.ChainTypeFilter, outputChain: nftables.ChainTypeFilter} {
		ch, err := n.conn.ListChain(t, name)
		if err != nil || ch == nil || ch.Type != typ {
			return false
		}
	}
	// The table, its sets, chains and rules were made in one nftables
	// transaction, so a table that has them all has the rules too. (The
	// rules are not read back: google/nftables v0.3.0 cannot decode their
	// ct expressions.)
	n.snat[i], n.vips[i], n.allow[i], n.restricted[i], n.sources[i] = sets[0], sets[1], sets[2], sets[3], sets[4]
	return true
}

// dropTable queues the deletion of the vipcast table of family fam,
// reporting whether there is one.
func (n *nftTables) dropTable(fam nftables.TableFamily) (bool, error) {
	tables, err := n.conn.ListTablesOfFamily(fam)
	if err != nil {
		return false, err
	}
	found := false
	for _, t := range tables {
		if t.Name == snatTable {
			n.conn.DelTable(t)
			found = true
		}
	}
	return found, nil
}

// removeTables deletes both tables, with all they hold (Teardown), one
// transaction per family; a table already gone is fine.
func (n *nftTables) removeTables() error {
	var errs []error
	for _, fam := range tableFamilies {
		found, err := n.dropTable(fam)
		if err == nil && found {
			err = n.conn.Flush()
		}
		if err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("delete nftables table %s %s: %w", familyName(fam), snatTable, err))
		}
	}
	return errors.Join(errs...)
}

func (n *nftTables) close() {
	_ = n.conn.CloseLasting()
}

// snatElement encodes k as a key of a VIP . protocol . port set: address,
// then protocol and port each in a 32-bit register slot.
func snatElement(k Key) setElem {
	b := k.VIP.AsSlice()
	// IP protocol numbers are 8-bit (TCP 6, UDP 17, SCTP 132).
	b = append(b, byte(k.Protocol), 0, 0, 0) //nolint:gosec // see above
	b = binary.BigEndian.AppendUint16(b, k.Port)
	b = append(b, 0, 0)
	return setElem{v6: !k.VIP.Is4(), key: b, name: k.String()}
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

// readKeys reads the VIP . protocol . port elements of both families.
func (n *nftTables) readKeys(sets [2]*nftables.Set) (map[Key]struct{}, error) {
	out := map[Key]struct{}{}
	for _, set := range sets {
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

// setElem is one element of a set of both families.
type setElem struct {
	v6  bool
	key []byte
	// keyEnd is the last key of an interval set's element (nil for other
	// sets).
	keyEnd []byte
	name   string // for errors
}

// element is e as nftables sends it.
func (e setElem) element() nftables.SetElement {
	return nftables.SetElement{Key: e.key, KeyEnd: e.keyEnd}
}

func keyElems(keys []Key) []setElem {
	out := make([]setElem, len(keys))
	for i, k := range keys {
		out[i] = snatElement(k)
	}
	return out
}

// Limits of one nftables transaction. A transaction goes to the kernel in
// one netlink message, which must fit the socket's send buffer
// (net.core.wmem_default, 208 KiB by default), and a set's element list is
// one netlink attribute, whose length is 16 bits: past 64 KiB it wraps,
// and the kernel silently takes only the first part of the list (measured:
// 5,000 VIPs in one call left 904 in the set). So the elements go at most
// maxElemsPerCall to a list (an element takes at most 44 bytes) and
// maxElemsPerBatch to a transaction.
const (
	maxElemsPerCall  = 512
	maxElemsPerBatch = 2048
)

// queueElements queues fn (SetAddElements or SetDeleteElements) of els on
// set, maxElemsPerCall at a time.
func queueElements(fn func(*nftables.Set, []nftables.SetElement) error, set *nftables.Set, els []nftables.SetElement) error {
	for len(els) > 0 {
		k := min(len(els), maxElemsPerCall)
		if err := fn(set, els[:k]); err != nil {
			return err
		}
		els = els[k:]
	}
	return nil
}

// update adds and deletes elements of sets (ip, ip6), in transactions of
// at most maxElemsPerBatch elements. One bad element (say, a delete of one
// already gone) fails its whole transaction: update then redoes that
// transaction's elements one by one, ignoring deletes of absent elements,
// and returns the failures.
func (n *nftTables) update(sets [2]*nftables.Set, add, del []setElem) error {
	var errs []error
	for len(add) > 0 || len(del) > 0 {
		a := min(len(add), maxElemsPerBatch)
		d := min(len(del), maxElemsPerBatch-a)
		if err := n.updateBatch(sets, add[:a], del[:d]); err != nil {
			errs = append(errs, err)
		}
		add, del = add[a:], del[d:]
	}
	return errors.Join(errs...)
}

// updateBatch is update for at most maxElemsPerBatch elements: one
// transaction.
func (n *nftTables) updateBatch(sets [2]*nftables.Set, add, del []setElem) error {
	if len(add) == 0 && len(del) == 0 {
		return nil
	}
	var errs []error
	for _, op := range []struct {
		els []setElem
		fn  func(*nftables.Set, []nftables.SetElement) error
	}{{add, n.conn.SetAddElements}, {del, n.conn.SetDeleteElements}} {
		var byFam [2][]nftables.SetElement
		for _, e := range op.els {
			i := 0
			if e.v6 {
				i = 1
			}
			byFam[i] = append(byFam[i], e.element())
		}
		for i, els := range byFam {
			if len(els) > 0 {
				errs = append(errs, queueElements(op.fn, sets[i], els))
			}
		}
	}
	err := errors.Join(errs...)
	if err == nil {
		err = n.conn.Flush()
	}
	if err == nil {
		return nil
	}
	n.slowPaths++
	var errs2 []error
	for _, e := range add {
		if err := n.one(sets, e, true); err != nil {
			errs2 = append(errs2, fmt.Errorf("add %s: %w", e.name, err))
		}
	}
	for _, e := range del {
		if err := n.one(sets, e, false); err != nil && !isNotFound(err) {
			errs2 = append(errs2, fmt.Errorf("delete %s: %w", e.name, err))
		}
	}
	return errors.Join(errs2...)
}

func (n *nftTables) one(sets [2]*nftables.Set, e setElem, add bool) error {
	set := sets[0]
	if e.v6 {
		set = sets[1]
	}
	var err error
	if add {
		err = n.conn.SetAddElements(set, []nftables.SetElement{e.element()})
	} else {
		err = n.conn.SetDeleteElements(set, []nftables.SetElement{e.element()})
	}
	if err != nil {
		return err
	}
	return n.conn.Flush()
}
