package ipvs

import (
	"cmp"
	"net/netip"
	"slices"
)

// Tier 2 of the two-tier dataplane (see tunnel.go): on the node tier 1
// chose, the packets the tunnel delivers to a VIP are NATed to one of the
// node's own endpoints, and conntrack keeps the flow on that endpoint.
//
// The choice is a map in vipcast's nftables table ip vipcast, "tier2",
// from VIP . protocol . port . slot to endpoint address . port, where the
// slot is a random number below Tier2Slots drawn for the first packet of a
// flow:
//
//	iifname "tunl0" dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 32 map @tier2
//
// A virtual server's Tier2Slots slots are shared among its endpoints by
// weight (Tier2SlotsOf), so one endpoint change rewrites only that virtual
// server's elements, in one nftables transaction, whatever the number of
// Services. A slot only chooses the endpoint of a new flow: an established
// flow keeps its conntrack entry when its slot moves, and so an endpoint
// that terminates (weight 0: no slot) keeps its flows.
//
// A virtual server with client affinity (Service.Affinity, from
// sessionAffinity ClientIP) keeps its slots at Tier2Slots and above
// instead, and a rule before the random one draws those from a hash of
// the client's address alone, so that every connection of one client
// reaches the same endpoint, as tier 1's mh without port hashing sends
// them all to the same node:
//
//	iifname "tunl0" dnat ip to ip daddr . meta l4proto . th dport . jhash ip saddr mod 32 offset 32 map @tier2
//
// A virtual server without affinity has no element there, so the lookup
// misses and the random rule takes its flows.

// Tier2Slots is the number of slots of a virtual server in the tier-2
// map: its endpoints on one node share them by weight. With more than
// Tier2Slots endpoints of one Service on one node, the endpoints past it
// get no new flows through tier 2.
const Tier2Slots = 32

// tier2Space is the slot numbers of one virtual server in the tier-2 map:
// Tier2Slots drawn at random, then Tier2Slots drawn by a hash of the
// client's address (client affinity).
const tier2Space = 2 * Tier2Slots

// affinitySeed is the seed of the hash of the client's address: fixed, so
// that a client keeps its endpoint when the speaker rewrites the rule (the
// kernel draws a random seed when none is given).
const affinitySeed = 0x76697063 // "vipc"

// Tier2 is the content of the tier-2 map: for each virtual server, the
// endpoint each slot sends new flows to (tier2Space entries, an invalid
// AddrPort is an empty slot: a virtual server's endpoints fill the first
// Tier2Slots, or with client affinity the last).
type Tier2 map[Key][]netip.AddrPort

// Tier2Of returns the tier-2 map a desired State needs: the slots of each
// virtual server with Local endpoints.
func Tier2Of(desired State) Tier2 { return slotMapOf(desired, tier2Want) }

// slotMapOf returns the slot map (the tier-2 map, or the in-cluster one)
// of desired: want gives each virtual server's slots (nil: none).
func slotMapOf(desired State, want func(Service) []netip.AddrPort) Tier2 {
	t := Tier2{}
	for k, svc := range desired.Services {
		if slots := want(svc); slots != nil {
			k.VIP = k.VIP.Unmap()
			t[k] = slots
		}
	}
	return t
}

// tier2Want returns the tier2Space slots of svc: Tier2SlotsOf its Local
// endpoints, at the random slots or, with client affinity, at the hashed
// ones; nil without endpoints.
func tier2Want(svc Service) []netip.AddrPort { return slotsWant(svc.Local, svc.Affinity) }

// slotsWant returns the tier2Space slots of the endpoints eps: Tier2SlotsOf
// them, at the random slots or, with affinity, at the hashed ones; nil
// without endpoints.
func slotsWant(eps []Backend, affinity bool) []netip.AddrPort {
	slots := Tier2SlotsOf(eps)
	if slots == nil {
		return nil
	}
	out := make([]netip.AddrPort, tier2Space)
	off := 0
	if affinity {
		off = Tier2Slots
	}
	copy(out[off:], slots)
	return out
}

// Tier2SlotsOf shares Tier2Slots slots among the endpoints with a weight
// above 0, in proportion to their weights (smooth weighted round robin
// over the endpoints in address order, so the result depends only on the
// set of endpoints and their weights). It returns nil when no endpoint has
// a weight.
func Tier2SlotsOf(local []Backend) []netip.AddrPort {
	var bs []Backend
	total := 0
	for _, b := range local {
		if b.Weight > 0 {
			b.Addr = b.Addr.Unmap()
			bs = append(bs, b)
			total += b.Weight
		}
	}
	if len(bs) == 0 {
		return nil
	}
	slices.SortFunc(bs, func(a, b Backend) int { return a.AddrPort().Compare(b.AddrPort()) })
	bs = slices.CompactFunc(bs, func(a, b Backend) bool { return a.AddrPort() == b.AddrPort() })
	current := make([]int, len(bs))
	slots := make([]netip.AddrPort, Tier2Slots)
	for s := range slots {
		best := 0
		for i, b := range bs {
			current[i] += b.Weight
			if current[i] > current[best] {
				best = i
			}
		}
		current[best] -= total
		slots[s] = bs[best].AddrPort()
	}
	return slots
}

// Tier2Slot is one element of the tier-2 map.
type Tier2Slot struct {
	Key  Key
	Slot int
	To   netip.AddrPort
}

func (s Tier2Slot) compare(o Tier2Slot) int {
	if c := s.Key.compare(o.Key); c != 0 {
		return c
	}
	return cmp.Compare(s.Slot, o.Slot)
}

// Tier2Plan is a set of changes to the tier-2 map, applied in one
// nftables transaction: Del first, then Add (a slot that changes endpoint
// is in both). Both are sorted.
type Tier2Plan struct {
	Del []Tier2Slot
	Add []Tier2Slot
}

// Len is the number of map elements p deletes or adds.
func (p Tier2Plan) Len() int { return len(p.Del) + len(p.Add) }

func (p *Tier2Plan) merge(q Tier2Plan) {
	p.Del = append(p.Del, q.Del...)
	p.Add = append(p.Add, q.Add...)
}

func (p *Tier2Plan) sort() {
	slices.SortFunc(p.Del, Tier2Slot.compare)
	slices.SortFunc(p.Add, Tier2Slot.compare)
}

// ApplyTo performs p on t in memory. A virtual server's slots are copied
// once, on its first change (t may share them with another Tier2), and a
// virtual server left with no endpoint is removed: the cost is one copy per
// virtual server changed, not per element (readSlots builds the whole map
// this way).
func (p Tier2Plan) ApplyTo(t Tier2) {
	touched := map[Key]bool{}
	slotsOf := func(k Key) []netip.AddrPort {
		slots, ok := t[k]
		switch {
		case !ok:
			slots = make([]netip.AddrPort, tier2Space)
		case !touched[k]:
			slots = slices.Clone(slots)
		}
		touched[k] = true
		t[k] = slots
		return slots
	}
	for _, s := range p.Del {
		if _, ok := t[s.Key]; ok && s.Slot < tier2Space {
			slotsOf(s.Key)[s.Slot] = netip.AddrPort{}
		}
	}
	for _, s := range p.Add {
		if s.Slot < tier2Space {
			slotsOf(s.Key)[s.Slot] = s.To
		}
	}
	for k := range touched {
		if !slices.ContainsFunc(t[k], netip.AddrPort.IsValid) {
			delete(t, k)
		}
	}
}

// DiffTier2 returns the element changes that turn have into want. The map
// is vipcast's alone: whatever want lacks is deleted.
func DiffTier2(want, have Tier2) Tier2Plan {
	var p Tier2Plan
	for k, w := range want {
		diffSlots(&p, k, w, have[k])
	}
	for k, h := range have {
		if _, ok := want[k]; !ok {
			diffSlots(&p, k, nil, h)
		}
	}
	p.sort()
	return p
}

// tier2Step returns the tier-2 changes of the one virtual server key
// (desired nil: deleted), given the map have: work for that virtual
// server only.
func tier2Step(key Key, desired *Service, have Tier2) Tier2Plan {
	return slotStep(key, desired, have, tier2Want)
}

// slotStep returns the changes of the one virtual server key (desired
// nil: deleted) to the slot map have, whose slots want gives.
func slotStep(key Key, desired *Service, have Tier2, slotsOf func(Service) []netip.AddrPort) Tier2Plan {
	var p Tier2Plan
	var want []netip.AddrPort
	if desired != nil {
		key = desired.Normalize().Key()
		want = slotsOf(*desired)
	}
	key.VIP = key.VIP.Unmap()
	diffSlots(&p, key, want, have[key])
	p.sort()
	return p
}

// diffSlots adds to p the changes from the slots have to want (either may
// be nil: no slots).
func diffSlots(p *Tier2Plan, k Key, want, have []netip.AddrPort) {
	at := func(slots []netip.AddrPort, i int) netip.AddrPort {
		if i < len(slots) {
			return slots[i]
		}
		return netip.AddrPort{}
	}
	for i := range tier2Space {
		w, h := at(want, i), at(have, i)
		if w == h {
			continue
		}
		if h.IsValid() {
			p.Del = append(p.Del, Tier2Slot{Key: k, Slot: i, To: h})
		}
		if w.IsValid() {
			p.Add = append(p.Add, Tier2Slot{Key: k, Slot: i, To: w})
		}
	}
}
