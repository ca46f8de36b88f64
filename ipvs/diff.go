package ipvs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// BackendChange is a real server operation on the virtual server Key.
type BackendChange struct {
	Key     Key
	Backend Backend
	// Again, in Plan.AddBackends, marks a real server the kernel has:
	// Apply deletes it and at once adds it back (tier 1's order, see
	// diffService), so that it is away only between those two calls.
	Again bool
}

func (c BackendChange) String() string {
	s := c.Key.String() + " -> " + c.Backend.String()
	if c.Again {
		s += " (again)"
	}
	return s
}

// Plan is a set of kernel changes, in the order Apply performs them: filter
// new VIPs, bind VIPs, start source NAT, add virtual servers, let them
// through the VIP filter, update virtual servers, change the real servers
// make before break (add, raise, lower, delete: backendOps), stop letting
// through the virtual servers going, delete them (their real servers go
// with them), stop source NAT, unbind VIPs, stop filtering them. Every
// slice is sorted.
type Plan struct {
	AddVIPs []netip.Addr
	// AddSNAT: virtual servers whose connections become masqueraded. Done
	// before they get real servers: a connection whose first packet is
	// not masqueraded never is.
	AddSNAT        []Key
	AddServices    []Service // without backends: AddBackends holds them
	UpdateServices []Service // scheduler, flags or persistence changed
	AddBackends    []BackendChange
	// UpdateBackends: real servers whose weight rises or whose forwarding
	// changes; LowerBackends: those whose weight falls. Apply raises
	// before it lowers.
	UpdateBackends []BackendChange
	LowerBackends  []BackendChange
	DelBackends    []BackendChange
	DelServices    []Key
	DelSNAT        []Key
	DelVIPs        []netip.Addr
	// Filter are the VIP filter's changes (see filter.go). Diff and
	// DiffService leave it empty: the Dataplane fills it from what the
	// filter holds (Sync: DiffFilter of the desired state's FilterOf;
	// SyncService: the changes of that one virtual server).
	Filter FilterPlan
	// Tier2 are the two-tier dataplane's tier-2 map changes (tier2.go),
	// filled in by the Dataplane like Filter; applied before the real
	// servers change.
	Tier2 Tier2Plan
	// InCluster are the in-cluster map's changes (incluster.go), filled
	// in by the Dataplane like Tier2.
	InCluster Tier2Plan
	// StaleFlows are the UDP and SCTP flows of endpoints that leave a
	// virtual server's tier 2 for good (with their slots, or after they
	// drained without any), whose conntrack entries go right after the
	// map changes (staleflows.go). Filled in by the Dataplane with Tier2;
	// a consequence of the endpoints' change, not a kernel object, so Len
	// does not count it.
	StaleFlows []StaleFlow
	// Lost are virtual servers the Dataplane had programmed (its in-memory
	// state) that its kernel read found gone: removed by another program
	// (kube-proxy flushes IPVS when it starts in nftables mode). Sync
	// fills it with those it wants back, which AddServices restores;
	// SyncService's second read (see SyncService) with all it found. It is
	// a finding, not a kernel operation: Len does not count it. Diff and
	// DiffService leave it empty.
	Lost []Key
}

// serviceKeys returns the virtual servers p adds, changes or deletes, or
// whose real servers it changes (with repeats).
func (p Plan) serviceKeys() []Key {
	var out []Key
	for _, svcs := range [][]Service{p.AddServices, p.UpdateServices} {
		for _, s := range svcs {
			out = append(out, s.Key())
		}
	}
	for _, bcs := range [][]BackendChange{p.AddBackends, p.UpdateBackends, p.LowerBackends, p.DelBackends} {
		for _, b := range bcs {
			out = append(out, b.Key)
		}
	}
	return append(out, p.DelServices...)
}

// Len is the number of kernel operations in p.
func (p Plan) Len() int {
	return len(p.AddVIPs) + len(p.AddSNAT) + len(p.DelSNAT) + len(p.AddServices) + len(p.UpdateServices) + len(p.DelBackends) +
		len(p.UpdateBackends) + len(p.LowerBackends) + len(p.AddBackends) + len(p.DelServices) + len(p.DelVIPs) + p.Filter.Len() + p.Tier2.Len() + p.InCluster.Len()
}

// Empty reports whether p changes nothing.
func (p Plan) Empty() bool { return p.Len() == 0 }

// String summarises p, e.g. "+vip 1, +svc 1, +rs 3".
func (p Plan) String() string {
	var parts []string
	add := func(name string, n int) {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", name, n))
		}
	}
	add("+vip", len(p.AddVIPs))
	add("+snat", len(p.AddSNAT))
	add("+svc", len(p.AddServices))
	add("~svc", len(p.UpdateServices))
	add("-rs", len(p.DelBackends))
	add("~rs", len(p.UpdateBackends)+len(p.LowerBackends))
	add("+rs", len(p.AddBackends))
	add("-svc", len(p.DelServices))
	add("-snat", len(p.DelSNAT))
	add("-vip", len(p.DelVIPs))
	add("+filter", len(p.Filter.AddVIPs))
	add("+allow", len(p.Filter.AddAllow))
	add("-allow", len(p.Filter.DelAllow))
	add("-filter", len(p.Filter.DelVIPs))
	add("-tier2", len(p.Tier2.Del))
	add("+tier2", len(p.Tier2.Add))
	add("-incluster", len(p.InCluster.Del))
	add("+incluster", len(p.InCluster.Add))
	if len(parts) == 0 {
		return "no changes"
	}
	return strings.Join(parts, ", ")
}

// Merge appends q's changes to p (for plans over disjoint services).
func (p *Plan) Merge(q Plan) {
	p.AddVIPs = append(p.AddVIPs, q.AddVIPs...)
	p.AddSNAT = append(p.AddSNAT, q.AddSNAT...)
	p.DelSNAT = append(p.DelSNAT, q.DelSNAT...)
	p.AddServices = append(p.AddServices, q.AddServices...)
	p.UpdateServices = append(p.UpdateServices, q.UpdateServices...)
	p.DelBackends = append(p.DelBackends, q.DelBackends...)
	p.UpdateBackends = append(p.UpdateBackends, q.UpdateBackends...)
	p.LowerBackends = append(p.LowerBackends, q.LowerBackends...)
	p.AddBackends = append(p.AddBackends, q.AddBackends...)
	p.DelServices = append(p.DelServices, q.DelServices...)
	p.DelVIPs = append(p.DelVIPs, q.DelVIPs...)
	p.Filter.merge(q.Filter)
	p.Tier2.merge(q.Tier2)
	p.InCluster.merge(q.InCluster)
	p.StaleFlows = append(p.StaleFlows, q.StaleFlows...)
}

func (p *Plan) sort() {
	slices.SortFunc(p.AddVIPs, netip.Addr.Compare)
	slices.SortFunc(p.DelVIPs, netip.Addr.Compare)
	bySvc := func(a, b Service) int { return a.Key().compare(b.Key()) }
	slices.SortFunc(p.AddServices, bySvc)
	slices.SortFunc(p.UpdateServices, bySvc)
	slices.SortFunc(p.DelServices, Key.compare)
	slices.SortFunc(p.AddSNAT, Key.compare)
	slices.SortFunc(p.DelSNAT, Key.compare)
	byChange := func(a, b BackendChange) int {
		if c := a.Key.compare(b.Key); c != 0 {
			return c
		}
		return a.Backend.AddrPort().Compare(b.Backend.AddrPort())
	}
	slices.SortFunc(p.DelBackends, byChange)
	slices.SortFunc(p.UpdateBackends, byChange)
	slices.SortFunc(p.LowerBackends, byChange)
	slices.SortFunc(p.AddBackends, byChange)
	p.Filter.sort()
	p.Tier2.sort()
	p.InCluster.sort()
}

// Diff returns the minimal changes that turn actual into desired.
//
// Ownership: a virtual server belongs to vipcast when its VIP is one of
// vipcast's VIPs, that is a VIP of desired (its VIPs and its services'
// VIPs) or one bound to vipcast's dummy link in actual (vipcast bound it, so
// it is a VIP vipcast served before). Diff only adds, changes or deletes
// virtual servers it owns; any other virtual server in actual (kube-proxy's
// ClusterIPs, an operator's own) is left alone, whatever desired says.
// Nothing is ever flushed.
func Diff(desired, actual State) Plan {
	want := desired.allVIPs()
	var p Plan
	for a := range want {
		if _, ok := actual.VIPs[a]; !ok {
			p.AddVIPs = append(p.AddVIPs, a)
		}
	}
	for a := range actual.VIPs {
		if _, ok := want[a]; !ok {
			p.DelVIPs = append(p.DelVIPs, a)
		}
	}
	owned := func(k Key) bool {
		if _, ok := want[k.VIP]; ok {
			return true
		}
		_, ok := actual.VIPs[k.VIP]
		return ok
	}
	wantKeys := make(map[Key]struct{}, len(desired.Services))
	for _, svc := range desired.Services {
		svc = svc.Normalize()
		k := svc.Key()
		wantKeys[k] = struct{}{}
		if have, ok := actual.Services[k]; ok {
			diffService(&p, &svc, &have)
		} else {
			diffService(&p, &svc, nil)
		}
	}
	for k, have := range actual.Services {
		if _, ok := wantKeys[k]; ok {
			continue
		}
		if owned(k) {
			p.DelServices = append(p.DelServices, k)
		}
		if have.SNAT {
			// The source NAT set is vipcast's alone, whoever owns the
			// virtual server.
			p.DelSNAT = append(p.DelSNAT, k)
		}
	}
	p.sort()
	return p
}

// DiffService returns the changes for the one virtual server key: desired
// nil deletes it. actual is only read. VIPs: the service's VIP is bound when
// missing; when desired is nil and no other service of actual uses the VIP,
// the VIP is unbound. Foreign virtual servers (VIP not in actual.VIPs and not
// desired's) are not touched.
func DiffService(key Key, desired *Service, actual State) Plan {
	var p Plan
	if desired != nil {
		svc := desired.Normalize()
		key = svc.Key()
		if _, ok := actual.VIPs[key.VIP]; !ok {
			p.AddVIPs = append(p.AddVIPs, key.VIP)
		}
		if have, ok := actual.Services[key]; ok {
			diffService(&p, &svc, &have)
		} else {
			diffService(&p, &svc, nil)
		}
		p.sort()
		return p
	}
	key.VIP = key.VIP.Unmap()
	if _, ours := actual.VIPs[key.VIP]; !ours {
		return p
	}
	if have, ok := actual.Services[key]; ok {
		p.DelServices = append(p.DelServices, key)
		if have.SNAT {
			p.DelSNAT = append(p.DelSNAT, key)
		}
	}
	// Unbind the VIP when no other virtual server uses it (a scan of the
	// in-memory table: no kernel work).
	for k := range actual.Services {
		if k.VIP == key.VIP && k != key {
			return p
		}
	}
	p.DelVIPs = append(p.DelVIPs, key.VIP)
	return p
}

// diffService adds the changes from have (nil: absent) to want, both
// normalized, to p.
func diffService(p *Plan, want, have *Service) {
	k := want.Key()
	if want.SNAT && (have == nil || !have.SNAT) {
		p.AddSNAT = append(p.AddSNAT, k)
	}
	if !want.SNAT && have != nil && have.SNAT {
		p.DelSNAT = append(p.DelSNAT, k)
	}
	if have == nil {
		p.AddServices = append(p.AddServices, want.withoutBackends())
		for _, b := range want.Backends {
			p.AddBackends = append(p.AddBackends, BackendChange{Key: k, Backend: b})
		}
		return
	}
	if !want.sameAttrs(*have) {
		p.UpdateServices = append(p.UpdateServices, want.withoutBackends())
	}
	// Both backend lists are sorted by address and port: merge them.
	w, h := want.Backends, have.Backends
	i, j := 0, 0
	added := len(p.AddBackends)
	var kept [][2]Backend // in both: want's, have's
	for i < len(w) || j < len(h) {
		var c int
		switch {
		case i == len(w):
			c = 1
		case j == len(h):
			c = -1
		default:
			c = w[i].AddrPort().Compare(h[j].AddrPort())
		}
		switch {
		case c < 0:
			p.AddBackends = append(p.AddBackends, BackendChange{Key: k, Backend: w[i]})
			i++
		case c > 0:
			p.DelBackends = append(p.DelBackends, BackendChange{Key: k, Backend: h[j]})
			j++
		default:
			kept = append(kept, [2]Backend{w[i], h[j]})
			i++
			j++
		}
	}
	var first netip.AddrPort // the first real server added, tier 1
	if len(p.AddBackends) > added && tunnelled(w) {
		first = p.AddBackends[added].Backend.AddrPort()
	}
	diffKept(p, k, kept, first)
}

// diffKept adds to p the changes of the real servers of virtual server k
// in both lists (kept: want's, have's); first is the first real server of
// tier 1 that p adds (invalid: none).
func diffKept(p *Plan, k Key, kept [][2]Backend, first netip.AddrPort) {
	for _, b := range kept {
		if first.IsValid() && b[0].AddrPort().Compare(first) > 0 {
			// Tier 1 of the two-tier dataplane must pick the same node
			// for a flow on every node. IPVS mh builds its table from the
			// real servers in the kernel's list order, the order they
			// were added, each new one first: every node adds them in
			// ascending order whatever its history, so that the list is
			// in descending order. A real server added goes first, so
			// those that sort after it are added again, after it and in
			// order; those before it keep their place. Their connections
			// keep going: a real server added again is the same one, back
			// from IPVS's trash, deleted and added back in one netlink
			// message (againDest). It comes back with the higher of its
			// two weights, lowered afterwards like any other (see
			// backendOps).
			again := b[0]
			again.Weight = max(b[0].Weight, b[1].Weight)
			p.AddBackends = append(p.AddBackends, BackendChange{Key: k, Backend: again, Again: true})
			if b[0].Weight < b[1].Weight {
				p.LowerBackends = append(p.LowerBackends, BackendChange{Key: k, Backend: b[0]})
			}
			continue
		}
		switch {
		case b[0].Weight < b[1].Weight:
			p.LowerBackends = append(p.LowerBackends, BackendChange{Key: k, Backend: b[0]})
		case b[0].Weight != b[1].Weight || b[0].Tunnel != b[1].Tunnel:
			p.UpdateBackends = append(p.UpdateBackends, BackendChange{Key: k, Backend: b[0]})
		}
	}
}

// backendOp is one real-server command of a Plan: cmd is ipvsCmdNewDest
// (with Again, the deletion and addition of againDest), ipvsCmdSetDest or
// ipvsCmdDelDest.
type backendOp struct {
	cmd uint8
	BackendChange
}

// backendOps returns p's real-server commands in the order Apply runs
// them, make before break: add (and add again), raise, lower, delete. A
// virtual server that has a real server with weight before and after p
// has one at every step in between: with deletions or lowered weights
// first, one whose only ready real server moves (a Local handover: one
// node drains, another gains its first endpoint) would have none for a
// moment, and IPVS answers a new connection that finds no real server
// with ICMP port unreachable, which the client reads as a refused
// connection.
func (p Plan) backendOps() []backendOp {
	ops := make([]backendOp, 0, len(p.AddBackends)+len(p.UpdateBackends)+len(p.LowerBackends)+len(p.DelBackends))
	for _, step := range []struct {
		cmd uint8
		cs  []BackendChange
	}{{ipvsCmdNewDest, p.AddBackends}, {ipvsCmdSetDest, p.UpdateBackends}, {ipvsCmdSetDest, p.LowerBackends}, {ipvsCmdDelDest, p.DelBackends}} {
		for _, c := range step.cs {
			ops = append(ops, backendOp{cmd: step.cmd, BackendChange: c})
		}
	}
	return ops
}

// tunnelled reports whether bs are tier 1 of the two-tier dataplane (they
// forward by tunnel).
func tunnelled(bs []Backend) bool {
	return slices.ContainsFunc(bs, func(b Backend) bool { return b.Tunnel })
}

// ApplyTo performs p on s in memory, the way Apply performs it on the
// kernel (p.Filter aside: FilterPlan.ApplyTo performs it on a Filter).
// Dataplane keeps its view of the kernel this way; tests check plans with
// it.
func (p Plan) ApplyTo(s *State) {
	if s.Services == nil {
		s.Services = map[Key]Service{}
	}
	if s.VIPs == nil {
		s.VIPs = map[netip.Addr]struct{}{}
	}
	for _, a := range p.AddVIPs {
		s.VIPs[a] = struct{}{}
	}
	p.applyServices(s)
	p.applyBackends(s)
	for _, k := range p.DelServices {
		delete(s.Services, k)
	}
	for _, a := range p.DelVIPs {
		delete(s.VIPs, a)
	}
}

// applyServices adds p's new virtual servers to s (without real servers:
// AddBackends holds them), updates the changed ones, keeping their real
// servers, then starts and stops their source NAT.
func (p Plan) applyServices(s *State) {
	for _, svc := range p.AddServices {
		svc = svc.withoutBackends()
		svc.SNAT = false // AddSNAT sets it
		s.Services[svc.Key()] = svc
	}
	for _, svc := range p.UpdateServices {
		old := s.Services[svc.Key()]
		svc.Backends, svc.SNAT = old.Backends, old.SNAT
		s.Services[svc.Key()] = svc
	}
	setSNAT := func(keys []Key, on bool) {
		for _, k := range keys {
			if svc, ok := s.Services[k]; ok {
				svc.SNAT = on
				s.Services[k] = svc
			}
		}
	}
	setSNAT(p.AddSNAT, true)
	setSNAT(p.DelSNAT, false)
}

// applyBackends changes p's real servers in s, in the order of backendOps.
// Changes to a virtual server s does not hold are skipped.
func (p Plan) applyBackends(s *State) {
	touched := map[Key]bool{}
	edit := func(c BackendChange, fn func(bs []Backend, b Backend) []Backend) {
		svc, ok := s.Services[c.Key]
		if !ok {
			return
		}
		if !touched[c.Key] {
			// Copy on first write: s may share backing arrays with a
			// clone or with the desired state.
			svc.Backends = slices.Clone(svc.Backends)
			touched[c.Key] = true
		}
		svc.Backends = fn(svc.Backends, c.Backend)
		s.Services[c.Key] = svc
	}
	for _, op := range p.backendOps() {
		op.applyTo(edit)
	}
}

// applyTo performs op in memory through edit (see applyBackends).
func (op backendOp) applyTo(edit func(BackendChange, func([]Backend, Backend) []Backend)) {
	switch op.cmd {
	case ipvsCmdNewDest:
		edit(op.BackendChange, withBackend)
	case ipvsCmdSetDest:
		edit(op.BackendChange, withWeight)
	default:
		edit(op.BackendChange, withoutBackend)
	}
}

// withoutBackend removes the real server at b's address and port from bs.
func withoutBackend(bs []Backend, b Backend) []Backend {
	return slices.DeleteFunc(bs, func(x Backend) bool { return x.AddrPort() == b.AddrPort() })
}

// withWeight gives the real server at b's address and port in bs b's
// weight and forwarding.
func withWeight(bs []Backend, b Backend) []Backend {
	for i := range bs {
		if bs[i].AddrPort() == b.AddrPort() {
			bs[i].Weight, bs[i].Tunnel = b.Weight, b.Tunnel
		}
	}
	return bs
}

// withBackend inserts b into bs, which is sorted by address and port, or
// replaces the real server at b's address and port.
func withBackend(bs []Backend, b Backend) []Backend {
	i, found := slices.BinarySearchFunc(bs, b.AddrPort(), func(x Backend, t netip.AddrPort) int { return x.AddrPort().Compare(t) })
	if found {
		bs[i] = b
		return bs
	}
	return slices.Insert(bs, i, b)
}
