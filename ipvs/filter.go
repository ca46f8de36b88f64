package ipvs

import (
	"maps"
	"net/netip"
	"slices"
)

// The VIP filter: a VIP answers only on its Services' ports.
//
// A VIP is a local address of the node (it sits on the dummy link), so,
// left alone, every socket listening on a wildcard address — sshd, the
// kubelet, the speaker's own endpoints — would answer on every VIP. IPVS
// only takes the packets of its virtual servers; everything else addressed
// to a VIP would reach the node's own sockets.
//
// vipcast's nftables tables (see snat.go) hold two more sets and one more
// chain: the set "vips" (every VIP bound on the node) and the set "allow"
// (VIP . protocol . port, exactly the node's virtual servers), and a chain
// "input" (type filter, hook input, priority filter, policy accept):
//
//	ip daddr != @vips return
//	ip daddr . meta l4proto . th dport @allow accept
//	ct state established,related accept
//	icmp type destination-unreachable icmp code frag-needed accept
//	counter drop
//
// (ip6: ip6 daddr, and icmpv6 type packet-too-big). IPVS takes its packets
// at LOCAL_IN with priority 98, after the filter priority 0, so the filter
// sees a packet before IPVS does. Notes:
//
//   - A virtual server without real server is let through like any other:
//     IPVS answers for it (it refuses the connection) instead of a node's
//     socket on the same port.
//   - Path MTU discovery needs the ICMP "fragmentation needed" (IPv4) and
//     "packet too big" (ICMPv6) that routers send to the VIP: they are let
//     through. ICMP echo (ping) to a VIP is dropped: the answer would come
//     from the node's kernel whether or not any Service works, and it tells
//     a scanner which addresses are live. Probe a Service on its port.
//   - Established and related traffic (by conntrack) is let through: the
//     replies to a connection the node opened from a VIP, the ICMP errors
//     of a tracked flow, and a connection to a port that closes while it
//     is open (new connections to that port are dropped at once).
//   - The sets change element by element with the virtual servers, in the
//     same apply: nothing is flushed or rebuilt. A VIP enters "vips" before
//     it is bound and leaves it after it is unbound; a port enters "allow"
//     after its virtual server exists (one the kernel refuses is never let
//     through, so a refused virtual server does not expose the node's
//     socket on that port) and leaves it before the virtual server goes.
//   - The sets are vipcast's alone: a full Sync reads them back and repairs
//     them (an element deleted or added by hand), like the source NAT set.

// Filter is the content of the VIP filter: the VIPs whose traffic is
// filtered and the virtual servers (VIP, protocol, port) let through.
type Filter struct {
	VIPs  map[netip.Addr]struct{}
	Allow map[Key]struct{}
	// Restricted are the virtual servers that admit only their Sources
	// (sources.go).
	Restricted map[Key]struct{}
	// Sources are the client ranges each restricted virtual server
	// admits, normalized (normalizeRanges); a key without ranges has no
	// entry.
	Sources map[Key][]netip.Prefix
}

// NewFilter returns an empty Filter.
func NewFilter() Filter {
	return Filter{VIPs: map[netip.Addr]struct{}{}, Allow: map[Key]struct{}{},
		Restricted: map[Key]struct{}{}, Sources: map[Key][]netip.Prefix{}}
}

// FilterOf returns the filter a desired State needs: each of its VIPs (a
// VIP without virtual server too) is filtered, exactly its virtual servers
// are let through, and the restricted ones admit exactly their ranges.
func FilterOf(desired State) Filter {
	f := NewFilter()
	f.VIPs = desired.allVIPs()
	for _, s := range desired.Services {
		s = s.Normalize()
		k := s.Key()
		f.Allow[k] = struct{}{}
		if s.Restricted {
			f.Restricted[k] = struct{}{}
			if len(s.SourceRanges) > 0 {
				f.Sources[k] = s.SourceRanges
			}
		}
	}
	return f
}

// Clone returns a deep copy.
func (f Filter) Clone() Filter {
	c := Filter{VIPs: maps.Clone(orEmpty(f.VIPs)), Allow: maps.Clone(orEmpty(f.Allow)),
		Restricted: maps.Clone(orEmpty(f.Restricted)), Sources: make(map[Key][]netip.Prefix, len(f.Sources))}
	for k, rs := range f.Sources {
		c.Sources[k] = slices.Clone(rs)
	}
	return c
}

// orEmpty returns m, or an empty map when m is nil.
func orEmpty[K comparable](m map[K]struct{}) map[K]struct{} {
	if m == nil {
		return map[K]struct{}{}
	}
	return m
}

// FilterPlan is a set of changes to the VIP filter. Dataplane applies them
// in this order, around the other steps of a Plan: filter new VIPs (before
// they are bound), let new virtual servers through (after they exist),
// stop letting through those going (before they are deleted), stop
// filtering VIPs (after they are unbound). Every slice is sorted.
//
// Restrictions go around the ports: a virtual server's ranges (AddSources,
// and DelSources of the ones it keeps restricted, in one transaction) and
// its restriction (AddRestricted) are in place before its port is let
// through; a restriction is lifted (DelRestricted, then the rest of
// DelSources) after the port is closed. Source ranges are on with the VIP
// filter only.
type FilterPlan struct {
	AddVIPs       []netip.Addr
	AddSources    []SourceRange
	AddRestricted []Key
	AddAllow      []Key
	DelAllow      []Key
	DelRestricted []Key
	DelSources    []SourceRange
	DelVIPs       []netip.Addr
}

// Len is the number of set elements p adds or deletes.
func (p FilterPlan) Len() int {
	return len(p.AddVIPs) + len(p.AddAllow) + len(p.DelAllow) + len(p.DelVIPs) +
		len(p.AddSources) + len(p.AddRestricted) + len(p.DelRestricted) + len(p.DelSources)
}

func (p *FilterPlan) merge(q FilterPlan) {
	p.AddVIPs = append(p.AddVIPs, q.AddVIPs...)
	p.AddSources = append(p.AddSources, q.AddSources...)
	p.AddRestricted = append(p.AddRestricted, q.AddRestricted...)
	p.AddAllow = append(p.AddAllow, q.AddAllow...)
	p.DelAllow = append(p.DelAllow, q.DelAllow...)
	p.DelRestricted = append(p.DelRestricted, q.DelRestricted...)
	p.DelSources = append(p.DelSources, q.DelSources...)
	p.DelVIPs = append(p.DelVIPs, q.DelVIPs...)
}

func (p *FilterPlan) sort() {
	slices.SortFunc(p.AddVIPs, netip.Addr.Compare)
	slices.SortFunc(p.DelVIPs, netip.Addr.Compare)
	slices.SortFunc(p.AddAllow, Key.compare)
	slices.SortFunc(p.DelAllow, Key.compare)
	slices.SortFunc(p.AddRestricted, Key.compare)
	slices.SortFunc(p.DelRestricted, Key.compare)
	slices.SortFunc(p.AddSources, SourceRange.compare)
	slices.SortFunc(p.DelSources, SourceRange.compare)
}

// ApplyTo performs p on f in memory.
func (p FilterPlan) ApplyTo(f *Filter) {
	f.VIPs, f.Allow = orEmpty(f.VIPs), orEmpty(f.Allow)
	f.Restricted = orEmpty(f.Restricted)
	if f.Sources == nil {
		f.Sources = map[Key][]netip.Prefix{}
	}
	for _, a := range p.AddVIPs {
		f.VIPs[a] = struct{}{}
	}
	for _, r := range p.AddSources {
		f.Sources[r.Key] = append(f.Sources[r.Key], r.Range)
		slices.SortFunc(f.Sources[r.Key], comparePrefix)
	}
	for _, k := range p.AddRestricted {
		f.Restricted[k] = struct{}{}
	}
	for _, k := range p.AddAllow {
		f.Allow[k] = struct{}{}
	}
	for _, k := range p.DelAllow {
		delete(f.Allow, k)
	}
	for _, k := range p.DelRestricted {
		delete(f.Restricted, k)
	}
	for _, r := range p.DelSources {
		rs := slices.DeleteFunc(f.Sources[r.Key], func(q netip.Prefix) bool { return q == r.Range })
		if len(rs) == 0 {
			delete(f.Sources, r.Key)
		} else {
			f.Sources[r.Key] = rs
		}
	}
	for _, a := range p.DelVIPs {
		delete(f.VIPs, a)
	}
}

// DiffFilter returns the element changes that turn have into want. The
// filter's sets are vipcast's alone: whatever want lacks is deleted.
func DiffFilter(want, have Filter) FilterPlan {
	p := FilterPlan{
		AddVIPs: missing(want.VIPs, have.VIPs), DelVIPs: missing(have.VIPs, want.VIPs),
		AddAllow: missing(want.Allow, have.Allow), DelAllow: missing(have.Allow, want.Allow),
		AddRestricted: missing(want.Restricted, have.Restricted), DelRestricted: missing(have.Restricted, want.Restricted),
	}
	w, h := flatSources(want.Sources), flatSources(have.Sources)
	p.AddSources, p.DelSources = missing(w, h), missing(h, w)
	p.sort()
	return p
}

// missing returns the elements of set that in lacks, in no order.
func missing[K comparable](set, in map[K]struct{}) []K {
	var out []K
	for k := range set {
		if _, ok := in[k]; !ok {
			out = append(out, k)
		}
	}
	return out
}

// filterStep returns the filter changes that go with p, the plan of
// DiffService(key, desired, ...), given the filter have: desired's VIP is
// filtered and desired is let through; a deleted virtual server is no
// longer let through and an unbound VIP no longer filtered. It costs work
// for that one virtual server only.
func filterStep(key Key, desired *Service, p Plan, have Filter) FilterPlan {
	var fp FilterPlan
	key.VIP = key.VIP.Unmap()
	var want []SourceRange
	if desired != nil {
		d := desired.Normalize()
		want = sourceRanges(d)
		k := d.Key()
		if _, ok := have.VIPs[k.VIP]; !ok {
			fp.AddVIPs = append(fp.AddVIPs, k.VIP)
		}
		if _, ok := have.Allow[k]; !ok {
			fp.AddAllow = append(fp.AddAllow, k)
		}
		_, was := have.Restricted[k]
		switch {
		case d.Restricted && !was:
			fp.AddRestricted = append(fp.AddRestricted, k)
		case !d.Restricted && was:
			fp.DelRestricted = append(fp.DelRestricted, k)
		}
	} else if _, ok := have.Restricted[key]; ok {
		fp.DelRestricted = append(fp.DelRestricted, key)
	}
	fp.AddSources, fp.DelSources = diffSources(key, want, have.Sources[key])
	if desired != nil {
		return fp
	}
	if _, ok := have.Allow[key]; ok {
		fp.DelAllow = append(fp.DelAllow, key)
	}
	for _, a := range p.DelVIPs {
		if _, ok := have.VIPs[a]; ok {
			fp.DelVIPs = append(fp.DelVIPs, a)
		}
	}
	return fp
}

// diffSources returns the ranges of the virtual server key that want adds
// to have (key's ranges as the filter holds them), and those of have it
// lacks: work for that one virtual server only.
func diffSources(key Key, want []SourceRange, have []netip.Prefix) (add, del []SourceRange) {
	for _, r := range want {
		if !slices.Contains(have, r.Range) {
			add = append(add, r)
		}
	}
	for _, q := range have {
		if !slices.ContainsFunc(want, func(r SourceRange) bool { return r.Range == q }) {
			del = append(del, SourceRange{Key: key, Range: q})
		}
	}
	return add, del
}

// flatSources returns the elements of the "sources" set that m holds.
func flatSources(m map[Key][]netip.Prefix) map[SourceRange]struct{} {
	out := map[SourceRange]struct{}{}
	for k, rs := range m {
		for _, r := range rs {
			out[SourceRange{Key: k, Range: r}] = struct{}{}
		}
	}
	return out
}

// splitDelSources splits p.DelSources into the ranges of virtual servers
// that stay restricted (narrowed, taken out before the ports open) and
// those whose restriction p lifts (taken out after the ports close).
func (p FilterPlan) splitDelSources() (narrowed, lifted []SourceRange) {
	for _, r := range p.DelSources {
		if slices.Contains(p.DelRestricted, r.Key) {
			lifted = append(lifted, r)
		} else {
			narrowed = append(narrowed, r)
		}
	}
	return narrowed, lifted
}
