package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"golang.org/x/sys/unix"
)

// The slot maps: tier 2's (tier2.go) and the in-cluster map (incluster.go)
// share their layout (VIP . protocol . port . slot → endpoint address .
// port), their planning and their nftables code. A Dataplane keeps one
// slotMap of each, on or off; an off map reads and plans nothing, so Sync
// and SyncService treat both alike and ask no option.

// slotMap is one slot map as the Dataplane knows it.
type slotMap struct {
	// what names the map in errors; name is its nftables name, and
	// familyOff says why a family has none (the map is on for the other).
	what, name, familyOff string
	// want gives a virtual server's slots.
	want func(Service) []netip.AddrPort
	// sets picks the map's sets (one per family) out of vipcast's tables.
	sets func(*nftTables) [2]*nftables.Set
	// off says why the map is off (nil: it is on).
	off error
	// have is the map as last read, plus what was applied since.
	have Tier2
}

// newTier2Map returns the tier-2 map, on with the two tiers.
func newTier2Map(on bool) *slotMap {
	m := &slotMap{what: "tier 2", name: tier2Map, familyOff: "the two tiers are off for that family", want: tier2Want,
		sets: func(n *nftTables) [2]*nftables.Set { return n.tier2 }}
	return m.init(on, "the two-tier dataplane is off (Options.Tunnel)")
}

// newInClusterMap returns the in-cluster map, on with source NAT.
func newInClusterMap(on bool) *slotMap {
	m := &slotMap{what: "in-cluster map", name: inClusterMap, familyOff: "the in-cluster map is off", want: inClusterWant,
		sets: func(n *nftTables) [2]*nftables.Set { return n.incluster }}
	return m.init(on, "source NAT is off (Options.NoSNAT)")
}

// init empties m and turns it on, or off for the reason off.
func (m *slotMap) init(on bool, off string) *slotMap {
	m.have = Tier2{}
	if !on {
		m.off = errors.New(off)
	}
	return m
}

// on reports whether the map is on.
func (m *slotMap) on() bool { return m.off == nil }

// read returns the map as the kernel has it (empty when it is off).
func (m *slotMap) read(n *nftTables) (Tier2, error) {
	if !m.on() {
		return Tier2{}, nil
	}
	t, err := n.readSlots(m.sets(n), m.name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", m.what, err)
	}
	return t, nil
}

// diff returns the changes from have, the map as read, to what desired
// needs (none when the map is off).
func (m *slotMap) diff(desired State, have Tier2) Tier2Plan {
	if !m.on() {
		return Tier2Plan{}
	}
	return DiffTier2(slotMapOf(desired, m.want), have)
}

// step returns the changes of the one virtual server key (desired nil:
// deleted) from the map as the Dataplane knows it (none when it is off).
func (m *slotMap) step(key Key, desired *Service) Tier2Plan {
	if !m.on() {
		return Tier2Plan{}
	}
	return slotStep(key, desired, m.have, m.want)
}

// apply performs p on the map of n, before tier 1 gets its real servers
// (a node's endpoints are in its tier 2 before its own tier 1 sends to
// it). A failure counts against each virtual server p changes.
func (m *slotMap) apply(n *nftTables, p Tier2Plan, f *failures) {
	if p.Len() == 0 {
		return
	}
	if !m.on() {
		f.add(m.what, m.off)
		return
	}
	err := n.updateSlots(m.sets(n), m.name, m.familyOff, p)
	if err == nil {
		return
	}
	keys := map[Key]bool{}
	for _, s := range append(slices.Clone(p.Del), p.Add...) {
		if !keys[s.Key] {
			keys[s.Key] = true
			f.addKey(s.Key, m.what+" of "+s.Key.String(), err)
		}
	}
}

// ensureSlotMap queues, in table t of family fam, the slot map name (tier2Map,
// inClusterMap) made afresh, unless it exists with the expected types: then
// it is kept with its elements.
func (n *nftTables) ensureSlotMap(t *nftables.Table, fam tier2Family, name string) (*nftables.Set, error) {
	keyType, dataType := fam.keyType(), fam.dataType()
	set, err := n.conn.GetSetByName(t, name)
	if err == nil && set != nil && set.IsMap && sameType(set.KeyType, keyType) && sameType(set.DataType, dataType) {
		return set, nil
	}
	if set != nil {
		n.conn.DelSet(set)
	}
	set = &nftables.Set{Table: t, Name: name, IsMap: true, Concatenation: true, KeyType: keyType, DataType: dataType}
	if err := n.conn.AddSet(set, nil); err != nil {
		return nil, fmt.Errorf("map %s %s: %w", familyName(t.Family), name, err)
	}
	return set, nil
}

// slotExprHint adds to err, when the kernel refused an expression of the
// slot maps' rules (ENOENT), which modules those are.
func slotExprHint(err error) error {
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%w (the kernel lacks an nftables expression they use: numgen and jhash are modules nft_numgen and nft_hash, which the kernel loads on first use unless module autoloading is off; then load them at boot, /etc/modules-load.d)", err)
	}
	return err
}

// sameType reports whether the type of a set read from the kernel, have,
// is want: its name (nftables' type numbers, each component's in a
// concatenation) and length. A type renamed (the tier-2 slot, integer
// before mark) makes the set be made again.
func sameType(have, want nftables.SetDatatype) bool {
	return have.Name == want.Name && have.Bytes == want.Bytes
}

// tier2Elem encodes s as a tier-2 map element: the key as snatElement's
// with the slot (host byte order, as numgen writes it) after it, the value
// the endpoint's address and port.
func tier2Elem(s Tier2Slot) nftables.SetElement {
	key := snatElement(s.Key).key
	key = append(key, binaryutil.NativeEndian.PutUint32(uint32(s.Slot))...) //nolint:gosec // below tier2Space
	val := s.To.Addr().AsSlice()
	val = binary.BigEndian.AppendUint16(val, s.To.Port())
	val = append(val, 0, 0)
	return nftables.SetElement{Key: key, Val: val}
}

// parseTier2Elem decodes a tier-2 map element of either family.
func parseTier2Elem(e nftables.SetElement) (Tier2Slot, bool) {
	if (len(e.Key) != 16 || len(e.Val) != 8) && (len(e.Key) != 28 || len(e.Val) != 20) {
		return Tier2Slot{}, false
	}
	k, ok := parseSNATElement(e.Key[:len(e.Key)-4])
	if !ok {
		return Tier2Slot{}, false
	}
	slot := int(binaryutil.NativeEndian.Uint32(e.Key[len(e.Key)-4:]))
	a, _ := netip.AddrFromSlice(e.Val[:len(e.Val)-4])
	to := netip.AddrPortFrom(a, binary.BigEndian.Uint16(e.Val[len(e.Val)-4:]))
	if slot >= tier2Space {
		return Tier2Slot{}, false
	}
	return Tier2Slot{Key: k, Slot: slot, To: to}, true
}

// readSlots reads a slot map (tier2Map, inClusterMap) of both families
// (sets; nil: the family has none).
func (n *nftTables) readSlots(sets [2]*nftables.Set, name string) (Tier2, error) {
	var p Tier2Plan
	for _, set := range sets {
		if set == nil {
			continue
		}
		els, err := n.conn.GetSetElements(set)
		if err != nil {
			return nil, fmt.Errorf("nftables map %s %s %s: %w", familyName(set.Table.Family), snatTable, name, err)
		}
		for _, e := range els {
			if s, ok := parseTier2Elem(e); ok {
				p.Add = append(p.Add, s)
			}
		}
	}
	t := Tier2{}
	p.ApplyTo(t)
	return t, nil
}

// updateSlots performs p on a slot map (sets, of each family, named name;
// off says why a family has none): a virtual server's deletes and adds in
// one transaction, so that no slot is ever missing while it changes
// endpoint, and as many virtual servers per transaction as fit in
// maxElemsPerBatch elements (see update).
func (n *nftTables) updateSlots(sets [2]*nftables.Set, name, off string, p Tier2Plan) error {
	var errs []error
	for i, fp := range p.byFamily() {
		if fp.Len() > 0 && sets[i] == nil {
			errs = append(errs, fmt.Errorf("map %s of table %s %s: %s", name, familyName(tableFamilies[i]), snatTable, off))
			continue
		}
		for _, chunk := range tier2Chunks(fp, maxElemsPerBatch) {
			if err := n.updateSlotsBatch(sets[i], chunk); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// byFamily splits p into the changes of IPv4 VIPs and those of IPv6 VIPs,
// each still sorted.
func (p Tier2Plan) byFamily() [2]Tier2Plan {
	var out [2]Tier2Plan
	fam := func(s Tier2Slot) int {
		if s.Key.VIP.Unmap().Is4() {
			return 0
		}
		return 1
	}
	for _, s := range p.Del {
		out[fam(s)].Del = append(out[fam(s)].Del, s)
	}
	for _, s := range p.Add {
		out[fam(s)].Add = append(out[fam(s)].Add, s)
	}
	return out
}

// tier2Chunks splits p, whose slices are sorted by key, into plans of at
// most limit elements each, never splitting one virtual server's changes
// (a virtual server has at most 2*Tier2Slots of them).
func tier2Chunks(p Tier2Plan, limit int) []Tier2Plan {
	if p.Len() <= limit {
		return []Tier2Plan{p}
	}
	var out []Tier2Plan
	var cur Tier2Plan
	i, j := 0, 0
	for i < len(p.Del) || j < len(p.Add) {
		// The next key in order, and all of its changes.
		var k Key
		switch {
		case i == len(p.Del):
			k = p.Add[j].Key
		case j == len(p.Add) || p.Del[i].Key.compare(p.Add[j].Key) <= 0:
			k = p.Del[i].Key
		default:
			k = p.Add[j].Key
		}
		i2, j2 := i, j
		for i2 < len(p.Del) && p.Del[i2].Key == k {
			i2++
		}
		for j2 < len(p.Add) && p.Add[j2].Key == k {
			j2++
		}
		if cur.Len() > 0 && cur.Len()+(i2-i)+(j2-j) > limit {
			out = append(out, cur)
			cur = Tier2Plan{}
		}
		cur.Del = append(cur.Del, p.Del[i:i2]...)
		cur.Add = append(cur.Add, p.Add[j:j2]...)
		i, j = i2, j2
	}
	if cur.Len() > 0 {
		out = append(out, cur)
	}
	return out
}

// updateSlotsBatch performs p on the map set in one transaction. When that fails (an
// element deleted by hand, say), it redoes each element alone: a delete of
// an absent element is skipped, an add replaces what the slot holds.
func (n *nftTables) updateSlotsBatch(set *nftables.Set, p Tier2Plan) error {
	if p.Len() == 0 {
		return nil
	}
	del := make([]nftables.SetElement, len(p.Del))
	for i, s := range p.Del {
		del[i] = nftables.SetElement{Key: tier2Elem(s).Key}
	}
	add := make([]nftables.SetElement, len(p.Add))
	for i, s := range p.Add {
		add[i] = tier2Elem(s)
	}
	err := errors.Join(queueElements(n.conn.SetDeleteElements, set, del), queueElements(n.conn.SetAddElements, set, add))
	if err == nil {
		if err = n.conn.Flush(); err == nil {
			return nil
		}
	}
	n.slowPaths++
	var errs []error
	for i, e := range del {
		if err := n.conn.SetDeleteElements(set, []nftables.SetElement{e}); err == nil {
			if err := n.conn.Flush(); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("delete slot %s #%d of map %s: %w", p.Del[i].Key, p.Del[i].Slot, set.Name, err))
			}
		}
	}
	for i, e := range add {
		// Whatever the slot holds goes first (an absent slot: nothing to
		// delete, and the error says so).
		_ = n.conn.SetDeleteElements(set, []nftables.SetElement{{Key: e.Key}})
		_ = n.conn.Flush()
		if err := n.conn.SetAddElements(set, []nftables.SetElement{e}); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := n.conn.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("set slot %s #%d of map %s to %s: %w", p.Add[i].Key, p.Add[i].Slot, set.Name, p.Add[i].To, err))
		}
	}
	return errors.Join(errs...)
}
