//go:build routing

package bgp

import (
	"context"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/klog/v2/ktesting"

	"github.com/vipcast/vipcast/test/routers"
)

// leaked is how many prefixes the leaking router sends: a tenth of a full
// table, ten times DefaultMaxPrefixes.
const leaked = 100_000

// TestPrefixLimitLeak checks that a router leaking 100,000 prefixes cannot
// make the speaker hold them: gobgp shuts the session down past
// DefaultMaxPrefixes, the speaker reopens it after a wait that doubles
// while the router goes on, the other peer's session is never touched, and
// once the router stops leaking the session comes back with vipcast's
// routes. It measures the live heap (after GC) the leak costs with and
// without the limit, in the same process.
func TestPrefixLimitLeak(t *testing.T) {
	self := netip.MustParseAddr("127.0.10.2")
	frr := routers.StartFRR(t, routers.FRRConfig{ASN: 65001, ListenAddress: netip.MustParseAddr("127.0.10.1"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: 64512}}})
	bird := routers.StartBIRD(t, routers.BIRDConfig{ASN: 65002, ListenAddress: netip.MustParseAddr("127.0.10.3"),
		Neighbors: []routers.BIRDNeighbor{{Name: "speaker", Address: self, ASN: 64512}}, Leak: leaked})
	if err := bird.DisableProtocol(routers.LeakProtocol); err != nil {
		t.Fatal(err)
	}
	ev := &peerEvents{}
	g, err := New(Config{RouterID: self, ListenPort: -1, PrefixLimitRestart: time.Second, OnSessionChange: ev.add,
		Logger: ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(0)))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() { _ = g.Stop(ctx) })
	peers := func(birdMax uint32) []Peer {
		return []Peer{
			{Name: "frr", Address: frr.Address, Port: uint16(frr.Port), ASN: 65001, LocalASN: 64512, SourceAddress: self,
				Families: []Family{IPv4Unicast}},
			{Name: "bird", Address: bird.Address, Port: uint16(bird.Port), ASN: 65002, LocalASN: 64512, SourceAddress: self,
				Families: []Family{IPv4Unicast}, MaxPrefixes: birdMax},
		}
	}
	// First without a limit worth the name: what holding the leak costs.
	if err := g.SetPeers(ctx, peers(1<<30)); err != nil {
		t.Fatal(err)
	}
	own := netip.MustParsePrefix("10.10.0.1/32")
	if err := g.Apply(ctx, []Route{{Prefix: own, NextHop: netip.MustParseAddr("10.0.0.2")}}, nil); err != nil {
		t.Fatal(err)
	}
	waitOwnRoute(t, frr, bird, self, own)
	frrBefore, err := frr.Neighbor(self)
	if err != nil {
		t.Fatal(err)
	}
	base, baseRSS := liveHeap(), rss(t)
	t.Logf("live heap: base %s; process RSS %s", mib(base), mib(baseRSS))

	if err := bird.EnableProtocol(routers.LeakProtocol); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "gobgp holding all the leaked prefixes without a limit", func() bool {
		return received(t, g, bird.Address) == leaked
	})
	unlimited := liveHeap() - base
	assertOnlyOwnPaths(t, g, own)
	t.Logf("live heap: base %s, holding %d leaked paths without a limit +%s (%d B a path); process RSS %s",
		mib(base), leaked, mib(unlimited), unlimited/leaked, mib(rss(t)))

	// With the default limit: the session resets (dropping what it held),
	// comes up, and is shut down while BIRD goes on leaking.
	start := time.Now()
	sampler := startSampler(t, g, bird.Address)
	if err := g.SetPeers(ctx, peers(0)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "three prefix-limit shutdowns", func() bool {
		return session(t, g, "bird").PrefixLimitShutdowns >= 3
	})
	elapsed := time.Since(start)
	peakHeap, peakReceived := sampler.stop()
	ss := session(t, g, "bird")
	if ss.Established() || ss.ReopenAt.IsZero() || !strings.Contains(ss.Reason, "maximum number of prefixes") ||
		!strings.Contains(ss.Reason, "reopening at") {
		t.Fatalf("bird session while limited = %+v, want down, with a reopening time and the reason", ss)
	}
	if wait := time.Until(ss.ReopenAt); wait < 2*time.Second {
		t.Errorf("after the third consecutive shutdown the session is reopened in %s, want the doubled 4 s", wait)
	}
	if err := testutil.CollectAndCompare(NewCollector(g), strings.NewReader(`
# HELP vipcast_bgp_prefix_limit_shutdowns_total BGP sessions shut down because the peer sent more prefixes than its limit in an address family, since the peer was configured.
# TYPE vipcast_bgp_prefix_limit_shutdowns_total counter
vipcast_bgp_prefix_limit_shutdowns_total{peer="bird"} 3
vipcast_bgp_prefix_limit_shutdowns_total{peer="frr"} 0
`), "vipcast_bgp_prefix_limit_shutdowns_total"); err != nil {
		t.Errorf("metrics: %v", err)
	}
	held := max(liveHeap(), base) - base
	t.Logf("with the limit (%d): live heap while the session is down +%s (process RSS %s); "+
		"peak while the router sent: live heap +%s, Adj-RIB-In %d paths; 3 shutdowns in %s",
		DefaultMaxPrefixes, mib(held), mib(rss(t)), mib(max(peakHeap, base)-base), peakReceived, elapsed.Round(time.Millisecond))

	// What the speaker keeps from a leaking router: nothing, once the
	// session is shut down (gobgp drops the Adj-RIB-In), where the old
	// code held every path for as long as the router sent them. A quarter
	// of the unlimited cost is a generous margin over the ~0 expected
	// (GC timing, gobgp's per-session buffers) that holding the paths
	// cannot meet. The peak before gobgp acts is not bounded: see
	// docs/routers.md.
	if held > unlimited/4 {
		t.Errorf("with the limit the live heap stays %s above its base, want at most a quarter of the %s held without", mib(held), mib(unlimited))
	}
	// Waits of 1 s, then 2 s, then 4 s: no flapping loop. Each reopening
	// also costs gobgp's idle hold time (5 s) and BIRD's connect delay.
	if elapsed < 3*time.Second {
		t.Errorf("three shutdowns in %s: the session is reopened without backing off", elapsed)
	}

	// BIRD stops leaking: the session comes back for good, with vipcast's
	// route, and holds nothing.
	if err := bird.DisableProtocol(routers.LeakProtocol); err != nil {
		t.Fatal(err)
	}
	waitOwnRoute(t, frr, bird, self, own)
	time.Sleep(2 * time.Second)
	if ss := session(t, g, "bird"); !ss.Established() || !ss.ReopenAt.IsZero() || received(t, g, bird.Address) != 0 {
		t.Errorf("bird session after the leak = %+v, received %d; want Established, nothing held", ss, received(t, g, bird.Address))
	}
	assertOnlyOwnPaths(t, g, own)

	// The other router never noticed.
	frrAfter, err := frr.Neighbor(self)
	if err != nil {
		t.Fatal(err)
	}
	if frrAfter.State != "Established" || frrAfter.EstablishedCount != frrBefore.EstablishedCount {
		t.Errorf("FRR's session went from %+v to %+v, want untouched", frrBefore, frrAfter)
	}
	up := false
	for _, e := range ev.of("frr") {
		if up && !e.Established() {
			t.Errorf("frr session left Established: %+v", e)
		}
		up = up || e.Established()
	}
}

// waitOwnRoute waits until both routers are Established with self and
// hold the route own.
func waitOwnRoute(t *testing.T, frr *routers.FRR, bird *routers.BIRD, self netip.Addr, own netip.Prefix) {
	t.Helper()
	if err := frr.WaitEstablished(self, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "BIRD Established and holding vipcast's route", func() bool {
		r, err := bird.Routes()
		return err == nil && len(r[own]) == 1
	})
	waitUntil(t, 10*time.Second, "FRR holding vipcast's route", func() bool {
		r, err := frr.Routes(routers.IPv4)
		return err == nil && len(r[own]) == 1
	})
}

// assertOnlyOwnPaths checks that gobgp's global RIB holds own only: the
// import policy rejected everything received.
func assertOnlyOwnPaths(t *testing.T, g *GoBGP, own netip.Prefix) {
	t.Helper()
	var got []string
	if err := g.srv.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: gobgp.RF_IPv4_UC},
		func(p gobgp.NLRI, _ []*apiutil.Path) { got = append(got, p.String()) }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != own.String() {
		t.Errorf("gobgp's global RIB holds %d prefixes (%.3v), want only %s", len(got), got, own)
	}
}

// received returns how many IPv4 paths gobgp holds in addr's Adj-RIB-In.
func received(t *testing.T, g *GoBGP, addr netip.Addr) int {
	t.Helper()
	n := 0
	if err := g.srv.ListPeer(context.Background(), &api.ListPeerRequest{Address: addr.String()}, func(p *api.Peer) {
		for _, as := range p.AfiSafis {
			n += int(as.GetState().GetReceived()) //nolint:gosec // a count of paths
		}
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// session returns the state of the session called name.
func session(t *testing.T, g *GoBGP, name string) SessionState {
	t.Helper()
	ss, err := g.Sessions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		if s.Peer == name {
			return s
		}
	}
	t.Fatalf("no session %s in %+v", name, ss)
	return SessionState{}
}

// sampler records the peak live heap and the peak Adj-RIB-In of one peer.
type sampler struct {
	done     chan struct{}
	wg       sync.WaitGroup
	heap     uint64
	received int
}

// startSampler samples every 20 ms until stop.
func startSampler(t *testing.T, g *GoBGP, addr netip.Addr) *sampler {
	s := &sampler{done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			select {
			case <-s.done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			s.heap = max(s.heap, liveHeap())
			var n int
			_ = g.srv.ListPeer(context.Background(), &api.ListPeerRequest{Address: addr.String()}, func(p *api.Peer) {
				for _, as := range p.AfiSafis {
					n += int(as.GetState().GetReceived()) //nolint:gosec // a count of paths
				}
			})
			s.received = max(s.received, n)
		}
	}()
	t.Cleanup(func() { s.stop() })
	return s
}

// stop ends the sampling and returns the peaks.
func (s *sampler) stop() (heap uint64, received int) {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	s.wg.Wait()
	return s.heap, s.received
}

// peerEvents records OnSessionChange calls.
type peerEvents struct {
	mu sync.Mutex
	l  []SessionState
}

func (e *peerEvents) add(s SessionState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.l = append(e.l, s)
}

// of returns the events of peer name.
func (e *peerEvents) of(name string) []SessionState {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []SessionState
	for _, s := range e.l {
		if s.Peer == name {
			out = append(out, s)
		}
	}
	return out
}

// liveHeap returns the bytes of live heap objects after a full GC.
func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// rss returns the test process's resident set size.
func rss(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// mib formats a byte count in MiB.
func mib(b uint64) string {
	return strconv.FormatFloat(float64(b)/(1<<20), 'f', 1, 64) + " MiB"
}

// waitUntil polls cond every 50 ms until it holds or timeout passes.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
