//go:build kernel

package ipvs

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"

	"github.com/vipcast/vipcast/test/vm"
)

// BenchmarkTwoTier measures, in one VM run, what the two-tier dataplane of
// TestECMPMove costs against today's one tier and against the pod's own
// address, from the client behind the ToR (b.N is ignored: the figures are
// metrics). Each path has its own fabric of TestECMPMove's shape in the
// same kernel; the client always enters through node A, and two of the
// three pods are on node A, so a third of the two-tier flows cross to node
// B through the tunnel and the rest loop through node A's own.
//
//   - direct-conn/s, onetier-conn/s, twotier-conn/s, twotiersync-conn/s:
//     new TCP connections per second (connect, read the greeting, close),
//     and each tier's ratio to direct; twotiersync is two tiers with
//     connection sync (Options.ConnSync), which sends every connection to
//     the other node;
//   - direct-rtt-us, onetier-rtt-us, twotier-rtt-us, twotiersync-rtt-us:
//     the median round trip of one line on held connections (6
//     connections × 200 lines), and twotier-added-us, two tiers less
//     direct;
//   - direct6 and twotier6: the same for an IPv6 VIP through the two
//     tiers (6in4 to the IPv4 tunnel addresses, no connection sync)
//     against pod pa1's own IPv6 address, and twotier6/direct6;
//   - ip6ip6: the IPv6 VIP through the two tiers to IPv6 tunnel
//     addresses with connection sync (the default with an IPv6 tunnel
//     prefix), and ip6ip6/direct6;
//   - what the filters cost: onetierranges and twotierranges are onetier
//     and twotier with spec.loadBalancerSourceRanges enforced (three
//     ranges, the client's among them: every packet is looked up), the
//     two tiers also with the tunnel guard in force (the nodes' addresses
//     as tunnel sources); onetierranges/onetier and
//     twotierranges/twotier;
//   - what sync authentication costs: relay and relaysigned are two tiers
//     with connection sync through the relay (guard in force), its
//     datagrams unsigned and signed (HMAC-SHA256, SetSyncKeys): every new
//     connection is sent to the other node; relaysigned/relay;
//   - what the raw chain's martian check of packets from the fabric
//     costs (a FIB lookup of the source per packet, see rawRules):
//     twotiernoraw is twotier without the chain's dropping rules;
//     twotier/twotiernoraw.
//
// TCG figures say nothing about real speed; the ratios do.
//
// Run: go test -run '^$' -bench BenchmarkTwoTier -benchtime 1x ./ipvs/
func BenchmarkTwoTier(b *testing.B) {
	if !vm.InVM() {
		benchInVM(b, twoTierVMOptions)
		return
	}
	one := newMoveFabric(b)
	oneTierNodes(b, one)
	one.steer(b, 0)
	two := newMoveFabric(b)
	for n := range two.nodes {
		twoTierNode(b, two, n)
	}
	two.steer(b, 0)
	// Two tiers with connection sync: every new connection is also sent to
	// the other node.
	synced := newMoveFabric(b)
	for n, peer := range []string{"10.53.0.1", "10.53.0.2"} {
		twoTierNodeSync(b, synced, n, &ConnSync{Address: ip(peer), ID: 96})
	}
	synced.steer(b, 0)
	// Direct: the client reaches pod pa1 through node A by its own
	// address (in the two-tier fabric, where IPVS rewrites nothing the
	// pod sends back).
	pa1 := two.pods[0][0]
	route(b, two.hClient, pa1.v4(), "10.51.0.1")
	vip := netip.AddrPortFrom(moveVIP, movePort)
	direct := netip.AddrPortFrom(pa1.v4(), backendPort)
	// IPv6: two tiers (6in4), and pod pa1's own IPv6 address.
	two6 := newMoveFabricFamily(b, true)
	for n := range two6.nodes {
		twoTierNode(b, two6, n)
	}
	two6.steer(b, 0)
	pa16 := two6.pods[0][0]
	route(b, two6.hClient, pa16.v6(), "fd00:51:0::1")
	vip6 := netip.AddrPortFrom(moveVIP6, movePort)
	direct6 := netip.AddrPortFrom(pa16.v6(), backendPort)
	// IPv6: two tiers to IPv6 tunnel addresses (ip6ip6), with sync.
	in6 := newMoveFabric6in6(b)
	for n, peer := range []string{"10.53.0.1", "10.53.0.2"} {
		twoTierNodeSync(b, in6, n, &ConnSync{Address: ip(peer), ID: 96})
	}
	in6.steer(b, 0)
	// The filters: source ranges that hold the client, in one and two
	// tiers, and the tunnel guard.
	ranges := func(s *Service) {
		s.Restricted = true
		s.SourceRanges = []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("10.50.0.0/24"), netip.MustParsePrefix("198.51.100.7/32")}
	}
	oneRanges := newMoveFabric(b)
	oneTierNodesWith(b, oneRanges, ranges)
	oneRanges.steer(b, 0)
	twoRanges := newMoveFabric(b)
	for n := range twoRanges.nodes {
		d, desired := twoTierNode(b, twoRanges, n)
		for k, s := range desired.Services {
			ranges(&s)
			desired.Services[k] = s
		}
		if _, err := d.Sync(desired); err != nil {
			b.Fatalf("node %d: Sync with source ranges: %v", n, err)
		}
		must(b, d.SetTunnelSources(twoRanges.tunnelSources()))
	}
	twoRanges.steer(b, 0)
	// Connection sync through the relay, unsigned and signed.
	relayed := func(signed bool) *moveFabric {
		f := newMoveFabric(b)
		for n := range f.nodes {
			d, _ := twoTierNodeSync(b, f, n, &ConnSync{ID: 96, Relay: &SyncRelay{Address: f.fabricAddr(n)}})
			d.SetSyncPeers([]netip.Addr{f.fabricAddr(1 - n)})
			if signed {
				d.SetSyncKeys(testSyncKeys(b))
			}
			must(b, d.SetTunnelSources(f.tunnelSources()))
		}
		f.steer(b, 0)
		return f
	}
	relay, relaySigned := relayed(false), relayed(true)
	// Two tiers without the raw chain's martian check of packets from the
	// fabric (what accept_local gives up, see rawRules): its dropping
	// rules deleted on both nodes, the untracking ones kept.
	noRaw := newMoveFabric(b)
	for n := range noRaw.nodes {
		twoTierNode(b, noRaw, n)
		must(b, inNS(b, noRaw.nodes[n], func() error { return deleteDropRules(tunnelRaw) }))
	}
	noRaw.steer(b, 0)

	paths := []struct {
		name string
		f    *moveFabric
		to   netip.AddrPort
	}{{"direct", two, direct}, {"onetier", one, vip}, {"twotier", two, vip}, {"twotiersync", synced, vip}, {"direct6", two6, direct6}, {"twotier6", two6, vip6}, {"ip6ip6", in6, vip6},
		{"onetierranges", oneRanges, vip}, {"twotierranges", twoRanges, vip}, {"relay", relay, vip}, {"relaysigned", relaySigned, vip}, {"twotiernoraw", noRaw, vip}}
	conns := map[string]float64{}
	rtts := map[string]time.Duration{}
	for _, p := range paths {
		connRate(b, p.f.client, p.to) // warm up
	}
	// Alternate, to spread the noise of a shared TCG host over all three.
	for range 3 {
		for _, p := range paths {
			conns[p.name] += connRate(b, p.f.client, p.to) / 3
		}
	}
	for _, p := range paths {
		rtts[p.name] = medianRTT(b, p.f, p.to)
	}
	fmt.Fprintf(os.Stderr, "bench: connections/s direct %.0f, one tier %.0f, two tiers %.0f, two tiers with connection sync %.0f; median round trip direct %s, one tier %s, two tiers %s, with sync %s\n",
		conns["direct"], conns["onetier"], conns["twotier"], conns["twotiersync"], rtts["direct"], rtts["onetier"], rtts["twotier"], rtts["twotiersync"])
	fmt.Fprintf(os.Stderr, "bench: IPv6 connections/s direct %.0f, two tiers 6in4 %.0f, ip6ip6 with sync %.0f; median round trip direct %s, 6in4 %s, ip6ip6 %s\n",
		conns["direct6"], conns["twotier6"], conns["ip6ip6"], rtts["direct6"], rtts["twotier6"], rtts["ip6ip6"])
	fmt.Fprintf(os.Stderr, "bench: filters: connections/s one tier %.0f, with source ranges %.0f; two tiers %.0f, with source ranges and the tunnel guard %.0f; median round trip %s, %s; %s, %s\n",
		conns["onetier"], conns["onetierranges"], conns["twotier"], conns["twotierranges"], rtts["onetier"], rtts["onetierranges"], rtts["twotier"], rtts["twotierranges"])
	fmt.Fprintf(os.Stderr, "bench: relay: connections/s unsigned %.0f, signed %.0f; median round trip %s, %s\n",
		conns["relay"], conns["relaysigned"], rtts["relay"], rtts["relaysigned"])
	fmt.Fprintf(os.Stderr, "bench: raw chain: connections/s two tiers %.0f, without its checks %.0f; median round trip %s, %s\n",
		conns["twotier"], conns["twotiernoraw"], rtts["twotier"], rtts["twotiernoraw"])
	for _, p := range paths {
		b.ReportMetric(conns[p.name], p.name+"-conn/s")
		b.ReportMetric(float64(rtts[p.name].Microseconds()), p.name+"-rtt-us")
	}
	b.ReportMetric(conns["onetier"]/conns["direct"], "onetier/direct")
	b.ReportMetric(conns["twotier"]/conns["direct"], "twotier/direct")
	b.ReportMetric(conns["twotiersync"]/conns["direct"], "twotiersync/direct")
	b.ReportMetric(conns["twotier6"]/conns["direct6"], "twotier6/direct6")
	b.ReportMetric(conns["ip6ip6"]/conns["direct6"], "ip6ip6/direct6")
	b.ReportMetric(float64((rtts["twotier"] - rtts["direct"]).Microseconds()), "twotier-added-us")
	b.ReportMetric(conns["onetierranges"]/conns["onetier"], "onetierranges/onetier")
	b.ReportMetric(conns["twotierranges"]/conns["twotier"], "twotierranges/twotier")
	b.ReportMetric(conns["relaysigned"]/conns["relay"], "relaysigned/relay")
	b.ReportMetric(conns["twotier"]/conns["twotiernoraw"], "twotier/twotiernoraw")
}

// deleteDropRules deletes the rules that drop of chain in table ip
// vipcast of the current namespace, and fails when it has none.
func deleteDropRules(chain string) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: snatTable, Family: nftables.TableFamilyIPv4}
	rules, err := c.GetRules(t, &nftables.Chain{Name: chain, Table: t})
	if err != nil {
		return err
	}
	n := 0
	for _, r := range rules {
		if slices.ContainsFunc(r.Exprs, func(e expr.Any) bool {
			v, ok := e.(*expr.Verdict)
			return ok && v.Kind == expr.VerdictDrop
		}) {
			if err := c.DelRule(r); err != nil {
				return err
			}
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("chain %s has no rule that drops", chain)
	}
	return c.Flush()
}

// BenchmarkTwoTierEndpoints measures the two-tier Dataplane's work for
// endpoint changes with 10,000 Services present (b.N is ignored: the
// figures are metrics), each with tier 1 over 3 nodes (one of them this
// node) and tier 2 to 3 pods on this node:
//
//   - sync-s: Sync of the 10,000 from an empty kernel (10,000 VIPs,
//     virtual servers, 30,000 IPIP real servers and 320,000 tier-2
//     elements);
//   - incr-local-us: SyncService of one pod of this node replaced (tier-2
//     elements only);
//   - incr-node-us: SyncService of another node's endpoint count changing
//     (one tier-1 weight);
//   - resync-s: a full Sync that changes nothing.
//
// Run: go test -run '^$' -bench BenchmarkTwoTierEndpoints -benchtime 1x ./ipvs/
func BenchmarkTwoTierEndpoints(b *testing.B) {
	if !vm.InVM() {
		benchInVM(b, twoTierVMOptions)
		return
	}
	nSvc := 10000
	if v, err := strconv.Atoi(os.Getenv("VIPCAST_BENCH_SERVICES")); err == nil && v > 0 && v <= 65536 {
		nSvc = v
	}
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...) }
	self := ip("10.52.0.1")
	vipOf := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}) }
	podOf := func(i, j int) netip.Addr {
		k := (i*7 + j*131) % 5000
		return netip.AddrFrom4([4]byte{10, 244, byte(k / 250), byte(k%250 + 1)})
	}
	desired := NewState()
	for i := range nSvc {
		s := Service{VIP: vipOf(i), Port: 80, Protocol: TCP}
		for n := range 3 {
			s.Backends = append(s.Backends, Backend{Addr: netip.AddrFrom4([4]byte{10, 52, 0, byte(n + 1)}), Port: 80, Weight: 3, Tunnel: true})
			s.Local = append(s.Local, Backend{Addr: podOf(i, n), Port: 8080, Weight: 1})
		}
		desired.Add(s)
	}
	d, err := New(Options{Tunnel: &Tunnel{Self: self}})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	start := time.Now()
	p, err := d.Sync(desired)
	if err != nil {
		b.Fatal(err)
	}
	syncDur := time.Since(start)
	logf("two tiers, Sync from empty: %v in %s", p, syncDur.Round(time.Millisecond))
	if p.Tier2.Len() != nSvc*Tier2Slots {
		b.Fatalf("Sync from empty: %d tier-2 changes, want %d", p.Tier2.Len(), nSvc*Tier2Slots)
	}

	const changes = 200
	key := func(c int) Key { return Key{VIP: vipOf(c * 37 % nSvc), Port: 80, Protocol: TCP} }
	start = time.Now()
	for c := range changes {
		s := desired.Services[key(c)]
		s.Local = append([]Backend{{Addr: netip.AddrFrom4([4]byte{10, 245, byte(c >> 8), byte(c)}), Port: 8080, Weight: 1}}, s.Local[1:]...)
		p, err := d.SyncService(s.Key(), &s)
		if err != nil {
			b.Fatal(err)
		}
		if p.Tier2.Len() == 0 || p.Len() != p.Tier2.Len() {
			b.Fatalf("local endpoint change: %v", p)
		}
		desired.Add(s)
	}
	incrLocal := time.Since(start) / changes
	start = time.Now()
	for c := range changes {
		s := desired.Services[key(c)]
		s.Backends = slices.Clone(s.Backends)
		s.Backends[2].Weight = 2 + c%2*2 // 3 -> 2 or 4: always a change
		p, err := d.SyncService(s.Key(), &s)
		if err != nil {
			b.Fatal(err)
		}
		if len(p.UpdateBackends)+len(p.LowerBackends) != 1 || p.Len() != 1 {
			b.Fatalf("other node's endpoint change: %v", p)
		}
		desired.Add(s)
	}
	incrNode := time.Since(start) / changes
	logf("SyncService: a local pod replaced %s, another node's count changed %s (each, %d changes)", incrLocal, incrNode, changes)
	start = time.Now()
	if p, err := d.Sync(desired); err != nil || !p.Empty() {
		b.Fatalf("Sync after the incremental changes: %v, %v", p, err)
	}
	resync := time.Since(start)
	logf("Sync, no change: %s", resync.Round(time.Millisecond))
	b.ReportMetric(syncDur.Seconds(), "sync-s")
	b.ReportMetric(float64(incrLocal.Microseconds()), "incr-local-us")
	b.ReportMetric(float64(incrNode.Microseconds()), "incr-node-us")
	b.ReportMetric(resync.Seconds(), "resync-s")
}

// connRate opens connections from namespace ns to `to` for 2 s (connect,
// read the greeting, close) and returns how many it opened per second.
func connRate(b *testing.B, ns netns.NsHandle, to netip.AddrPort) float64 {
	b.Helper()
	const window = 2 * time.Second
	n := 0
	start := time.Now()
	for time.Since(start) < window {
		err := inNS(b, ns, func() error {
			c, err := net.DialTimeout("tcp", to.String(), 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = bufio.NewReader(c).ReadString('\n')
			return err
		})
		if err != nil {
			b.Fatalf("connection to %s: %v", to, err)
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds()
}

// medianRTT holds 6 connections from f's client to `to`, exchanges 200
// lines on each, one at a time, and returns the median round trip.
func medianRTT(b *testing.B, f *moveFabric, to netip.AddrPort) time.Duration {
	b.Helper()
	var all []time.Duration
	for range 6 {
		var c net.Conn
		must(b, inNS(b, f.client, func() (err error) {
			c, err = net.DialTimeout("tcp", to.String(), 5*time.Second)
			return err
		}))
		r := bufio.NewReader(c)
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := r.ReadString('\n'); err != nil {
			b.Fatalf("greeting from %s: %v", to, err)
		}
		for i := range 200 {
			start := time.Now()
			if _, err := fmt.Fprintf(c, "m%d\n", i); err != nil {
				b.Fatalf("send to %s: %v", to, err)
			}
			if _, err := r.ReadString('\n'); err != nil {
				b.Fatalf("answer from %s: %v", to, err)
			}
			all = append(all, time.Since(start))
		}
		c.Close()
	}
	slices.Sort(all)
	return all[len(all)/2]
}
