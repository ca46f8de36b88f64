package ipam

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// The fuzz world: a few small pool configurations to switch between, six
// owners, and a universe of addresses to request and restore, inside and
// outside the pools (including buggy ones).
var (
	fuzzOwners = []string{"n1/a", "n1/b", "n1/c", "n1/d", "n1/e", "n2/f", "n2/g", "n2/h", "n2/i", "n2/j"}
	fuzzKeys   = []string{"", "", "k1", "k2"}
	fuzzPorts  = [][]Port{{tcp(80)}, {tcp(443)}, {tcp(80), tcp(443)}, {udp(53)}}
	fuzzPools  = []string{"", "", "", "a", "b", "c", "m", "zz"}
	fuzzFams   = []struct {
		fams    []Family
		require bool
	}{
		{[]Family{IPv4}, false}, {[]Family{IPv6}, false}, {[]Family{IPv4, IPv6}, false},
		{[]Family{IPv6, IPv4}, false}, {[]Family{IPv4, IPv6}, true},
	}
	fuzzAddrs = addrs(
		"10.0.0.0", "10.0.0.1", "10.0.0.3", "10.0.0.5", "10.0.0.7", "10.0.0.254", "10.0.0.255",
		"10.0.1.0", "10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.2.3", "192.0.2.1",
		"2001:db8::", "2001:db8::1", "2001:db8::3", "2001:db8::6", "2001:db8::9",
	)
)

func fuzzConfigs() [][]Pool {
	return [][]Pool{
		{
			{Name: "a", Addresses: []string{"10.0.0.0/29", "2001:db8::/126"}, AutoAssign: true},
			{Name: "b", Addresses: []string{"10.0.0.254-10.0.1.2"}, AutoAssign: true, AvoidBuggyIPs: true, Priority: 1},
			{Name: "m", Addresses: []string{"10.0.2.0/30"}},
		},
		{
			{Name: "a", Addresses: []string{"10.0.0.0/30"}, AutoAssign: true, Priority: 2},
			{Name: "b", Addresses: []string{"10.0.0.254-10.0.1.2"}, AutoAssign: true, Priority: 1},
			{Name: "c", Addresses: []string{"2001:db8::/125", "10.0.2.0/31"}, AutoAssign: true, Priority: 1},
		},
		{},
		{
			{Name: "a", Addresses: []string{"10.0.0.0/29", "2001:db8::/124"}, AutoAssign: true, Namespaces: []string{"n1"}},
			{Name: "x", Addresses: []string{"10.0.0.4-10.0.0.9"}, AutoAssign: true}, // overlaps a: rejected
			{Name: "b", Addresses: []string{"10.0.0.255-10.0.1.1", "192.0.2.0/30"}, AutoAssign: true, AvoidBuggyIPs: true},
			{Name: "m", Addresses: []string{"10.0.2.0/30", "2001:db8::10-2001:db8::11"}},
		},
	}
}

// fuzzWorld holds the allocator and what the test knows independently of it.
type fuzzWorld struct {
	t       testing.TB
	a       *Allocator
	configs [][]Pool
	pools   []Pool              // installed configuration (accepted pools)
	ranges  map[string][]Range  // parsed ranges of the installed pools
	attrs   map[string]Request  // last successful request per owner
	outside map[netip.Addr]bool // may be held outside every pool
	counts  map[string]int      // outcomes, to see what a run covered
}

func newFuzzWorld(t testing.TB) *fuzzWorld {
	w := &fuzzWorld{t: t, a: New(), configs: fuzzConfigs(), attrs: map[string]Request{}, outside: map[netip.Addr]bool{}, counts: map[string]int{}}
	w.setPools(0)
	return w
}

func (w *fuzzWorld) setPools(i int) {
	cfg := w.configs[i%len(w.configs)]
	for _, o := range fuzzOwners {
		if as, ok := w.a.Assigned(o); ok {
			for _, ip := range as.IPs {
				w.outside[ip] = true
			}
		}
	}
	errs := w.a.SetPools(cfg)
	w.pools, w.ranges = nil, map[string][]Range{}
	for _, p := range cfg {
		if errs[p.Name] != nil {
			if ReasonOf(errs[p.Name]) == "" {
				w.t.Fatalf("SetPools error without reason: %v", errs[p.Name])
			}
			continue
		}
		rs, err := ParseAddresses(p.Addresses)
		if err != nil {
			w.t.Fatalf("accepted pool %q does not parse: %v", p.Name, err)
		}
		w.pools = append(w.pools, p)
		w.ranges[p.Name] = rs
	}
	if i%len(w.configs) == 3 && errs["x"] == nil {
		w.t.Fatal("overlapping pool x was accepted")
	}
}

// poolOf returns the installed pool whose usable addresses include ip.
func (w *fuzzWorld) poolOf(ip netip.Addr) (Pool, bool) {
	for _, p := range w.pools {
		for _, r := range w.ranges[p.Name] {
			if r.Contains(ip) && !(p.AvoidBuggyIPs && isBuggy(ip)) {
				return p, true
			}
		}
	}
	return Pool{}, false
}

// expectLowest is the reference for a fresh single-family automatic
// allocation: the first free usable address of the first eligible pool.
func (w *fuzzWorld) expectLowest(req Request) (netip.Addr, bool) {
	ps := slices.Clone(w.pools)
	slices.SortStableFunc(ps, func(x, y Pool) int {
		if x.Priority != y.Priority {
			return x.Priority - y.Priority
		}
		return compareStrings(x.Name, y.Name)
	})
	f := req.Families[0]
	for _, p := range ps {
		if !p.AutoAssign || (len(p.Namespaces) > 0 && !slices.Contains(p.Namespaces, req.Namespace)) {
			continue
		}
		for _, r := range w.ranges[p.Name] {
			if r.Family() != f {
				continue
			}
			for ip := r.First; ; ip = ip.Next() {
				if !(p.AvoidBuggyIPs && isBuggy(ip)) && len(w.a.Holders(ip)) == 0 {
					return ip, true
				}
				if ip == r.Last {
					break
				}
			}
		}
	}
	return netip.Addr{}, false
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// byteReader hands out bytes of the fuzz input, zeros once exhausted.
type byteReader struct {
	data []byte
}

func (r *byteReader) next() int {
	if len(r.data) == 0 {
		return 0
	}
	b := r.data[0]
	r.data = r.data[1:]
	return int(b)
}

func (r *byteReader) pick(n int) int { return r.next() % n }

func (w *fuzzWorld) request(r *byteReader) Request {
	owner := fuzzOwners[r.pick(len(fuzzOwners))]
	fm := fuzzFams[r.pick(len(fuzzFams))]
	flags := r.next()
	req := Request{
		Owner:              owner,
		Namespace:          owner[:2],
		Families:           fm.fams,
		RequireAllFamilies: fm.require,
		Pool:               fuzzPools[r.pick(len(fuzzPools))],
		SharingKey:         fuzzKeys[r.pick(len(fuzzKeys))],
		Ports:              fuzzPorts[r.pick(len(fuzzPorts))],
		LocalTrafficPolicy: flags&1 != 0,
		PodSelector:        []string{"app=x", "app=y"}[flags>>1&1],
		// Mostly naming the other namespace, so that cross-namespace
		// shares happen; sometimes naming one that does not hold owners.
		ShareWithNamespaces: [][]string{nil, {otherNamespace(owner[:2])}, {"n1", "n2"}, {"n3"}}[flags>>4&3],
	}
	if req.Pool == "zz" && flags&12 != 12 {
		req.Pool = "" // keep unknown pools rare
	}
	switch r.pick(6) {
	case 4:
		req.IPs = []netip.Addr{fuzzAddrs[r.pick(len(fuzzAddrs))]}
	case 5:
		x, y := fuzzAddrs[r.pick(len(fuzzAddrs))], fuzzAddrs[r.pick(len(fuzzAddrs))]
		if flags&8 == 0 { // mostly one address per family
			for FamilyOf(y) == FamilyOf(x) {
				y = fuzzAddrs[r.pick(len(fuzzAddrs))]
				if len(r.data) == 0 {
					break
				}
			}
		}
		req.IPs = []netip.Addr{x, y}
		req.Families = []Family{FamilyOf(x), FamilyOf(y)}
		if FamilyOf(x) == FamilyOf(y) {
			req.Families = req.Families[:1]
		}
	}
	return req
}

// step applies one operation decoded from r and checks the invariants.
func (w *fuzzWorld) step(r *byteReader) {
	t := w.t
	switch op := r.pick(8); op {
	case 0, 1, 2:
		req := w.request(r)
		before, had := w.a.Assigned(req.Owner)
		fresh := !had && len(req.IPs) == 0 && req.Pool == "" && req.SharingKey == "" && len(req.Families) == 1
		var want netip.Addr
		var wantOK bool
		if fresh {
			want, wantOK = w.expectLowest(req)
		}
		got, err := w.a.Assign(req)
		if err != nil {
			w.counts["assign error "+string(ReasonOf(err))]++
			if ReasonOf(err) == "" {
				t.Fatalf("Assign(%+v): error without reason: %v", req, err)
			}
			after, has := w.a.Assigned(req.Owner)
			if ReasonOf(err) == ReasonInvalid {
				if had != has || before.Pool != after.Pool || !slices.Equal(before.IPs, after.IPs) {
					t.Fatalf("invalid Assign(%+v) changed %v to %v: %v", req, before, after, err)
				}
			} else {
				// A failed request keeps the owner's addresses but those it
				// may no longer share with their other holders; checkWorld
				// checks what it keeps against req.
				for _, ip := range after.IPs {
					if !slices.Contains(before.IPs, ip) {
						t.Fatalf("failed Assign(%+v) added %s: %v to %v: %v", req, ip, before, after, err)
					}
				}
				for _, ip := range before.IPs {
					if !slices.Contains(after.IPs, ip) && len(w.a.Holders(ip)) == 0 {
						t.Fatalf("failed Assign(%+v) gave up %s, which nobody else holds: %v to %v: %v", req, ip, before, after, err)
					}
				}
				if len(after.IPs) < len(before.IPs) {
					w.counts["assign error, gave up a shared address"]++
				}
				if has {
					w.attrs[req.Owner] = req
				} else {
					delete(w.attrs, req.Owner)
				}
			}
			if fresh && wantOK && ReasonOf(err) != ReasonInvalid {
				t.Fatalf("Assign(%+v) failed (%v) though %s is free", req, err, want)
			}
			break
		}
		w.counts["assign ok"]++
		for _, ip := range got.IPs {
			if len(w.a.Holders(ip)) > 1 {
				w.counts["assign shared"]++
			}
		}
		w.checkAssignment(req, got)
		if fresh {
			w.counts["assign fresh checked"]++
			if !wantOK || got.IPs[0] != want {
				t.Fatalf("fresh Assign(%+v) = %v, want lowest free %s (%v)", req, got.IPs, want, wantOK)
			}
		}
		w.checkJoins(req, before.IPs, got.IPs)
		w.attrs[req.Owner] = req
		if had {
			w.checkFreed(before.IPs, got.IPs)
		}
	case 3:
		owner := fuzzOwners[r.pick(len(fuzzOwners))]
		before, _ := w.a.Assigned(owner)
		w.a.Release(owner)
		delete(w.attrs, owner)
		if _, ok := w.a.Assigned(owner); ok {
			t.Fatalf("Release(%s) left an assignment", owner)
		}
		w.checkFreed(before.IPs, nil)
	case 4:
		req := w.request(r)
		ips := []netip.Addr{fuzzAddrs[r.pick(len(fuzzAddrs))]}
		if r.pick(3) == 0 {
			ips = append(ips, fuzzAddrs[r.pick(len(fuzzAddrs))])
		}
		before, _ := w.a.Assigned(req.Owner)
		if err := w.a.Restore(req, ips); err != nil {
			if ReasonOf(err) == "" {
				t.Fatalf("Restore: error without reason: %v", err)
			}
			w.counts["restore error "+string(ReasonOf(err))]++
			break
		}
		got, ok := w.a.Assigned(req.Owner)
		if !ok || len(got.IPs) != len(ips) {
			t.Fatalf("Restore(%s, %v) recorded %v", req.Owner, ips, got)
		}
		w.counts["restore ok"]++
		if w.a.LegacyShare(req.Owner) != "" {
			w.counts["restore ok, legacy share"]++
		}
		for _, ip := range ips {
			w.outside[ip] = true
		}
		w.attrs[req.Owner] = req
		w.checkFreed(before.IPs, got.IPs)
	case 5:
		// The empty configuration is rarer than the others.
		w.setPools([]int{0, 0, 1, 1, 3, 3, 2}[r.pick(7)])
	default:
		// Idempotence: repeating the last successful request changes nothing.
		owner := fuzzOwners[r.pick(len(fuzzOwners))]
		req, ok := w.attrs[owner]
		before, had := w.a.Assigned(owner)
		if !ok || !had {
			break
		}
		got, err := w.a.Assign(req)
		if err != nil {
			// Possible after SetPools (pool gone, constraints changed) or
			// when another owner took what this one asked for before a
			// Restore replaced it.
			break
		}
		if len(req.IPs) > 0 && !slices.Equal(got.IPs, before.IPs) && slices.Equal(sortedAddrs(before.IPs), sortedAddrs(req.IPs)) {
			t.Fatalf("repeated Assign(%s) moved %v to %v", owner, before.IPs, got.IPs)
		}
		w.checkAssignment(req, got)
		w.checkFreed(before.IPs, got.IPs)
	}
	w.checkWorld()
}

func sortedAddrs(ips []netip.Addr) []netip.Addr {
	out := slices.Clone(ips)
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// checkAssignment checks a successful Assign against its request.
func (w *fuzzWorld) checkAssignment(req Request, got Assignment) {
	t := w.t
	if len(got.IPs) == 0 {
		t.Fatalf("Assign(%+v) returned no address", req)
	}
	var fams []Family
	for _, ip := range got.IPs {
		f := FamilyOf(ip)
		if slices.Contains(fams, f) {
			t.Fatalf("Assign(%+v) returned two %s addresses: %v", req, f, got.IPs)
		}
		fams = append(fams, f)
		if !slices.Contains(w.a.Holders(ip), req.Owner) {
			t.Fatalf("Assign(%+v) returned %s which it does not hold", req, ip)
		}
	}
	if len(req.IPs) > 0 {
		if !slices.Equal(sortedAddrs(got.IPs), sortedAddrs(req.IPs)) {
			t.Fatalf("Assign(%+v) = %v, not the requested addresses", req, got.IPs)
		}
		return
	}
	for i, f := range fams {
		if k := slices.Index(req.Families, f); k < 0 || (i > 0 && k < slices.Index(req.Families, fams[i-1])) {
			t.Fatalf("Assign(%+v) = %v: families not as wanted", req, got.IPs)
		}
	}
	if fams[0] != req.Families[0] && len(req.Families) > 0 {
		// Only a kept address may lack the first family (PreferDualStack).
		if req.RequireAllFamilies || len(req.Families) == 1 {
			t.Fatalf("Assign(%+v) = %v lacks the first family", req, got.IPs)
		}
	}
	if req.RequireAllFamilies && len(fams) != len(req.Families) {
		t.Fatalf("Assign(%+v) = %v: RequireDualStack not served", req, got.IPs)
	}
	if req.Pool != "" {
		for _, ip := range got.IPs {
			if p, ok := w.poolOf(ip); !ok || p.Name != req.Pool {
				t.Fatalf("Assign(%+v) = %v: %s is not in pool %q", req, got.IPs, ip, req.Pool)
			}
		}
	}
}

// checkJoins checks that an owner joined only holders it may share with
// under today's rules: whatever Restore admitted from older releases, a new
// holder of an address meets today's rules with every holder.
func (w *fuzzWorld) checkJoins(req Request, before, after []netip.Addr) {
	for _, ip := range after {
		if slices.Contains(before, ip) {
			continue
		}
		for _, h := range w.a.Holders(ip) {
			if h == req.Owner {
				continue
			}
			other := w.attrs[h]
			if why := joinRefused(req, other); why != "" {
				w.t.Fatalf("Assign(%+v) joined %s held by %s (%+v): %s", req, ip, h, other, why)
			}
			w.counts["assign joined a sharer"]++
			if other.Namespace != req.Namespace {
				w.counts["assign joined across namespaces"]++
			}
		}
	}
}

// otherNamespace is the fuzz owners' namespace that is not ns.
func otherNamespace(ns string) string {
	if ns == "n1" {
		return "n2"
	}
	return "n1"
}

// joinRefused is the reference for today's sharing rules beyond the key
// and the ports (which checkWorld checks for every holder).
func joinRefused(req, other Request) string {
	if req.Namespace != other.Namespace {
		if !slices.Contains(req.ShareWithNamespaces, other.Namespace) || !slices.Contains(other.ShareWithNamespaces, req.Namespace) {
			return "Services of different namespaces share without each naming the other's namespace"
		}
		if req.LocalTrafficPolicy || other.LocalTrafficPolicy {
			return "Local Services of different namespaces share"
		}
	}
	if req.LocalTrafficPolicy != other.LocalTrafficPolicy {
		return "a Local and a Cluster Service share"
	}
	return ""
}

// checkFreed checks that addresses the owner gave up and nobody else holds
// are allocatable again.
func (w *fuzzWorld) checkFreed(before, after []netip.Addr) {
	for _, ip := range before {
		if slices.Contains(after, ip) || len(w.a.Holders(ip)) > 0 {
			continue
		}
		p, ok := w.poolOf(ip)
		if !ok {
			continue
		}
		probe := Request{Owner: "probe/p", Namespace: "n1", IPs: []netip.Addr{ip}}
		if len(p.Namespaces) > 0 {
			probe.Namespace = p.Namespaces[0]
		}
		if _, err := w.a.Assign(probe); err != nil {
			w.t.Fatalf("released %s is not allocatable again: %v", ip, err)
		}
		w.a.Release("probe/p")
		w.counts["freed address re-allocated"]++
	}
}

// checkWorld checks the invariants visible through the public API, then the
// internal ones.
func (w *fuzzWorld) checkWorld() {
	t := w.t
	held := map[netip.Addr][]string{}
	for _, o := range fuzzOwners {
		as, ok := w.a.Assigned(o)
		if !ok {
			continue
		}
		for _, ip := range as.IPs {
			held[ip] = append(held[ip], o)
		}
	}
	perPool := map[string][2]int{}
	for ip, owners := range held {
		if hs := w.a.Holders(ip); !slices.Equal(hs, owners) {
			t.Fatalf("Holders(%s) = %v, assignments say %v", ip, hs, owners)
		}
		if len(owners) > 1 {
			key := w.attrs[owners[0]].SharingKey
			var ports []Port
			for _, o := range owners {
				req := w.attrs[o]
				if key == "" || req.SharingKey != key {
					t.Fatalf("%s held by %v with sharing keys %q/%q", ip, owners, key, req.SharingKey)
				}
				for _, p := range req.Ports {
					if slices.Contains(ports, p) {
						t.Fatalf("%s held by %v with clashing port %s", ip, owners, p)
					}
					ports = append(ports, p)
				}
			}
		}
		if p, ok := w.poolOf(ip); ok {
			c := perPool[p.Name]
			c[FamilyOf(ip).slot()]++
			perPool[p.Name] = c
		} else if !w.outside[ip] {
			t.Fatalf("%s is held by %v but lies in no pool and was never restored or orphaned", ip, owners)
		}
	}
	for _, p := range w.pools {
		s, ok := w.a.Stats(p.Name)
		if !ok {
			t.Fatalf("installed pool %q has no stats", p.Name)
		}
		if c := perPool[p.Name]; s.IPv4.InUse != c[0] || s.IPv6.InUse != c[1] {
			t.Fatalf("Stats(%s) in use %d/%d, held %d/%d", p.Name, s.IPv4.InUse, s.IPv6.InUse, c[0], c[1])
		}
	}
	if err := w.a.checkInvariants(); err != nil {
		t.Fatal(err)
	}
}

func runOps(t testing.TB, data []byte) map[string]int {
	w := newFuzzWorld(t)
	r := &byteReader{data: data}
	for len(r.data) > 0 {
		w.step(r)
		w.counts["steps"]++
	}
	return w.counts
}

// FuzzAllocator drives random operation sequences against small pools and
// checks the invariants after every step.
func FuzzAllocator(f *testing.F) {
	rng := rand.New(rand.NewPCG(42, 1))
	for range 8 {
		b := make([]byte, 200)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		f.Add(b)
	}
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 5, 1, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			data = data[:4096]
		}
		runOps(t, data)
	})
}

// TestRandomOps is the property test: seeded random operation sequences
// checked with the same invariants as FuzzAllocator.
func TestRandomOps(t *testing.T) {
	n := 20
	if testing.Short() {
		n = 4
	}
	total := map[string]int{}
	for seed := range n {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 99))
			b := make([]byte, 3000)
			for i := range b {
				b[i] = byte(rng.UintN(256))
			}
			for k, v := range runOps(t, b) {
				total[k] += v
			}
		})
	}
	keys := slices.Sorted(maps.Keys(total))
	for _, k := range keys {
		t.Logf("%-40s %d", k, total[k])
	}
}
