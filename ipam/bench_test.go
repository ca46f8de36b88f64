package ipam

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
	"time"
)

// churnCase is a pool pre-filled to a level; the benchmarks then release one
// owner and allocate one, so the fill level stays constant.
type churnCase struct {
	name       string
	pool       Pool
	fam        Family
	fillPct    int // of the pool's capacity; used when count is 0
	count      int // absolute number of addresses in use
	fragmented bool
}

func churnCases() []churnCase {
	v4 := func(avoid bool) Pool {
		return Pool{Name: "p", Addresses: []string{"10.0.0.0/16"}, AutoAssign: true, AvoidBuggyIPs: avoid}
	}
	v6 := Pool{Name: "p", Addresses: []string{"2001:db8::/64"}, AutoAssign: true}
	return []churnCase{
		{name: "v4-slash16-fill1pct", pool: v4(false), fam: IPv4, fillPct: 1},
		{name: "v4-slash16-fill50pct", pool: v4(false), fam: IPv4, fillPct: 50},
		{name: "v4-slash16-fill99pct", pool: v4(false), fam: IPv4, fillPct: 99},
		{name: "v4-slash16-avoidbuggy-fill1pct", pool: v4(true), fam: IPv4, fillPct: 1},
		{name: "v4-slash16-avoidbuggy-fill50pct", pool: v4(true), fam: IPv4, fillPct: 50},
		{name: "v4-slash16-avoidbuggy-fill99pct", pool: v4(true), fam: IPv4, fillPct: 99},
		// Half the addresses in use at random positions (requested IPs):
		// about 16k separate runs in the free-run tree.
		{name: "v4-slash16-fill50pct-fragmented", pool: v4(true), fam: IPv4, fillPct: 50, fragmented: true},
		{name: "v6-slash64-100k", pool: v6, fam: IPv6, count: 100_000},
	}
}

type churn struct {
	a     *Allocator
	reqs  []Request // one per owner in use
	order []int     // owners to churn, in random order
}

func setupChurn(b *testing.B, c churnCase) *churn {
	b.Helper()
	a := newAlloc(b, c.pool)
	s, _ := a.Stats("p")
	capacity := s.IPv4.Capacity
	if c.fam == IPv6 {
		capacity = s.IPv6.Capacity
	}
	n := c.count
	if n == 0 {
		n = int(capacity.Int64()) * c.fillPct / 100
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ch := &churn{a: a, reqs: make([]Request, n)}
	var pick []netip.Addr
	if c.fragmented {
		// Choose n distinct usable addresses at random.
		r := a.pools["p"].ranges[0]
		perm := rng.Perm(int(capacity.Int64()))[:n]
		for _, i := range perm {
			pick = append(pick, r.addr(u64(uint64(i))))
		}
	}
	for i := range n {
		req := Request{Owner: fmt.Sprintf("ns/svc-%d", i), Namespace: "ns", Families: []Family{c.fam}}
		if pick != nil {
			req.IPs = []netip.Addr{pick[i]}
		}
		if _, err := a.Assign(req); err != nil {
			b.Fatal(err)
		}
		req.IPs = nil // churned owners allocate automatically
		ch.reqs[i] = req
	}
	ch.order = rng.Perm(n)
	if got, _ := a.Stats("p"); got.IPv4.InUse+got.IPv6.InUse != n {
		b.Fatalf("filled %d, want %d", got.IPv4.InUse+got.IPv6.InUse, n)
	}
	return ch
}

// run releases and reallocates owners in random order, timing only the
// allocation (alloc) or only the release, and reports that as ns/op.
// B/op and allocs/op cover the release+allocate pair.
func (ch *churn) run(b *testing.B, alloc bool) {
	var spent time.Duration
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		req := &ch.reqs[ch.order[i%len(ch.order)]]
		i++
		if alloc {
			ch.a.Release(req.Owner)
			t0 := time.Now()
			_, err := ch.a.Assign(*req)
			spent += time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			continue
		}
		t0 := time.Now()
		ch.a.Release(req.Owner)
		spent += time.Since(t0)
		if _, err := ch.a.Assign(*req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(spent.Nanoseconds())/float64(i), "ns/op")
}

// BenchmarkAllocate measures Assign of a new owner at a constant fill level.
func BenchmarkAllocate(b *testing.B) {
	for _, c := range churnCases() {
		b.Run(c.name, func(b *testing.B) { setupChurn(b, c).run(b, true) })
	}
}

// BenchmarkRelease measures Release at a constant fill level.
func BenchmarkRelease(b *testing.B) {
	for _, c := range churnCases() {
		b.Run(c.name, func(b *testing.B) { setupChurn(b, c).run(b, false) })
	}
}

// heapPerAddress fills pool with n single-address owners and returns the
// heap growth per address in use. Owner names are made beforehand: they
// belong to the caller.
func heapPerAddress(tb testing.TB, pool Pool, fam Family, n int) float64 {
	tb.Helper()
	reqs := make([]Request, n)
	for i := range reqs {
		reqs[i] = Request{Owner: fmt.Sprintf("ns/svc-%d", i), Namespace: "ns", Families: []Family{fam}}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	a := newAlloc(tb, pool)
	for _, r := range reqs {
		if _, err := a.Assign(r); err != nil {
			tb.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(a)
	runtime.KeepAlive(reqs)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

var memoryPools = []struct {
	name string
	pool Pool
	fam  Family
}{
	{"v4-slash16", Pool{Name: "p", Addresses: []string{"10.0.0.0/16"}, AutoAssign: true}, IPv4},
	{"v6-slash64", Pool{Name: "p", Addresses: []string{"2001:db8::/64"}, AutoAssign: true}, IPv6},
	{"v6-slash48", Pool{Name: "p", Addresses: []string{"2001:db8::/48"}, AutoAssign: true}, IPv6},
}

// BenchmarkMemory reports the heap bytes per address in use with 50,000
// addresses in use, for pools of very different sizes.
func BenchmarkMemory(b *testing.B) {
	for _, m := range memoryPools {
		b.Run(m.name+"-50k", func(b *testing.B) {
			var per float64
			for b.Loop() {
				per = heapPerAddress(b, m.pool, m.fam, 50_000)
			}
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(per, "heap-B/addr")
		})
	}
}

// TestMemoryIndependentOfPoolSize checks that memory follows the addresses
// in use, not the pool size: a /48 costs about what a /16 costs.
func TestMemoryIndependentOfPoolSize(t *testing.T) {
	if testing.Short() {
		t.Skip("measures the heap")
	}
	var got []float64
	for _, m := range memoryPools {
		got = append(got, heapPerAddress(t, m.pool, m.fam, 20_000))
	}
	lo, hi := got[0], got[0]
	for _, v := range got {
		lo, hi = min(lo, v), max(hi, v)
	}
	t.Logf("heap bytes per address in use: /16 %.0f, /64 %.0f, /48 %.0f", got[0], got[1], got[2])
	if lo <= 0 || hi/lo > 1.3 || hi > 1024 {
		t.Fatalf("memory per address depends on pool size or is too large: %v", got)
	}
}

// manyPorts returns n ports of protocol proto starting at first.
func manyPorts(proto string, first int32, n int) []Port {
	out := make([]Port, n)
	for i := range out {
		out[i] = Port{Protocol: proto, Port: first + int32(i)}
	}
	return out
}

// sharersWithManyPorts returns an allocator where owner ns/a holds an
// address under sharing key "k" with n TCP ports, and the request of a
// second owner, ns/b, with n UDP ports (the same numbers, so nothing
// clashes) under the same key.
func sharersWithManyPorts(tb testing.TB, n int) (*Allocator, Request) {
	tb.Helper()
	a := newAlloc(tb, Pool{Name: "p", Addresses: []string{"10.0.0.0/24"}, AutoAssign: true})
	first := Request{Owner: "ns/a", Namespace: "ns", Families: []Family{IPv4}, SharingKey: "k", Ports: manyPorts("TCP", 1, n)}
	if _, err := a.Assign(first); err != nil {
		tb.Fatal(err)
	}
	second := first
	second.Owner, second.Ports = "ns/b", manyPorts("UDP", 1, n)
	return a, second
}

// BenchmarkShareManyPorts measures Assign (join, then keep) of a Service
// sharing an address with another, each with 20,000 ports: the port-clash
// check runs under the allocator's lock.
func BenchmarkShareManyPorts(b *testing.B) {
	a, second := sharersWithManyPorts(b, 20_000)
	b.ReportAllocs()
	for b.Loop() {
		got, err := a.Assign(second)
		if err != nil || len(got.IPs) != 1 || got.IPs[0].String() != "10.0.0.0" {
			b.Fatalf("Assign = %v, %v; want the shared 10.0.0.0", got, err)
		}
	}
}

// TestShareManyPorts: two sharers with 60,000 distinct ports each (TCP,
// UDP and SCTP, as a Service may have) share one VIP. How long the port
// check takes is BenchmarkShareManyPorts's to show (make bench), not a
// timed assertion's.
func TestShareManyPorts(t *testing.T) {
	a, second := sharersWithManyPorts(t, 60_000)
	got, err := a.Assign(second)
	if err != nil || len(got.IPs) != 1 || got.IPs[0].String() != "10.0.0.0" {
		t.Fatalf("Assign = %v, %v; want the shared 10.0.0.0", got, err)
	}
}
