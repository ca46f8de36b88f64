package ipvs

import (
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
}

// NewFilter returns an empty Filter.
func NewFilter() Filter {
	return Filter{VIPs: map[netip.Addr]struct{}{}, Allow: map[Key]struct{}{}}
}

// FilterOf returns the filter a desired State needs: each of its VIPs (a
// VIP without virtual server too) is filtered, and exactly its virtual
// servers are let through.
func FilterOf(desired State) Filter {
	f := Filter{VIPs: desired.allVIPs(), Allow: make(map[Key]struct{}, len(desired.Services))}
	for k := range desired.Services {
		k.VIP = k.VIP.Unmap()
		f.Allow[k] = struct{}{}
	}
	return f
}

// Clone returns a deep copy.
func (f Filter) Clone() Filter {
	c := NewFilter()
	for a := range f.VIPs {
		c.VIPs[a] = struct{}{}
	}
	for k := range f.Allow {
		c.Allow[k] = struct{}{}
	}
	return c
}

// FilterPlan is a set of changes to the VIP filter. Dataplane applies them
// in this order, around the other steps of a Plan: filter new VIPs (before
// they are bound), let new virtual servers through (after they exist),
// stop letting through those going (before they are deleted), stop
// filtering VIPs (after they are unbound). Every slice is sorted.
type FilterPlan struct {
	AddVIPs  []netip.Addr
	AddAllow []Key
	DelAllow []Key
	DelVIPs  []netip.Addr
}

// Len is the number of set elements p adds or deletes.
func (p FilterPlan) Len() int {
	return len(p.AddVIPs) + len(p.AddAllow) + len(p.DelAllow) + len(p.DelVIPs)
}

func (p *FilterPlan) merge(q FilterPlan) {
	p.AddVIPs = append(p.AddVIPs, q.AddVIPs...)
	p.AddAllow = append(p.AddAllow, q.AddAllow...)
	p.DelAllow = append(p.DelAllow, q.DelAllow...)
	p.DelVIPs = append(p.DelVIPs, q.DelVIPs...)
}

func (p *FilterPlan) sort() {
	slices.SortFunc(p.AddVIPs, netip.Addr.Compare)
	slices.SortFunc(p.DelVIPs, netip.Addr.Compare)
	slices.SortFunc(p.AddAllow, Key.compare)
	slices.SortFunc(p.DelAllow, Key.compare)
}

// ApplyTo performs p on f in memory.
func (p FilterPlan) ApplyTo(f *Filter) {
	if f.VIPs == nil {
		f.VIPs = map[netip.Addr]struct{}{}
	}
	if f.Allow == nil {
		f.Allow = map[Key]struct{}{}
	}
	for _, a := range p.AddVIPs {
		f.VIPs[a] = struct{}{}
	}
	for _, k := range p.AddAllow {
		f.Allow[k] = struct{}{}
	}
	for _, k := range p.DelAllow {
		delete(f.Allow, k)
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
	}
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
	if desired != nil {
		k := desired.Normalize().Key()
		if _, ok := have.VIPs[k.VIP]; !ok {
			fp.AddVIPs = append(fp.AddVIPs, k.VIP)
		}
		if _, ok := have.Allow[k]; !ok {
			fp.AddAllow = append(fp.AddAllow, k)
		}
		return fp
	}
	key.VIP = key.VIP.Unmap()
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
