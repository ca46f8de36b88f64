//go:build routing

package bgp_test

import (
	"net/netip"
	"testing"
	"time"

	vbgp "github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/bgp/bgptest"
	"github.com/vipcast/vipcast/test/routers"
)

const benchRoutes = 10000

// BenchmarkAnnounce10k measures how long FRR takes to hold 10,000 /32s
// announced with Apply, and to lose them after a withdrawal, against the
// floor: the same routes added with bare gobgp AddPath calls on a plain
// gobgp server, to the same FRR in the same run.
func BenchmarkAnnounce10k(b *testing.B) {
	vip, bare := ip("127.0.10.2"), ip("127.0.10.3")
	f := routers.StartFRR(b, routers.FRRConfig{ASN: routerASN, ListenAddress: ip("127.0.10.1"),
		Neighbors: []routers.FRRNeighbor{{Address: vip, ASN: localASN}, {Address: bare, ASN: localASN}}})
	s, _ := newSpeaker(b, vip.String())
	if err := s.SetPeers(ctxT(), []vbgp.Peer{{Name: "frr", Address: f.Address, Port: uint16(f.Port), ASN: routerASN,
		LocalASN: localASN, SourceAddress: vip}}); err != nil {
		b.Fatal(err)
	}
	plain := bgptest.StartPlain(b, bare, f.Address, f.Port, localASN, routerASN)
	for _, a := range []netip.Addr{vip, bare} {
		if err := f.WaitEstablished(a, 10*time.Second); err != nil {
			b.Fatal(err)
		}
	}

	routes := make([]vbgp.Route, benchRoutes)
	prefixes := make([]netip.Prefix, benchRoutes)
	for i := range routes {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100 + byte(i>>16), byte(i >> 8), byte(i)}), 32)
		prefixes[i] = p
		routes[i] = vbgp.Route{Prefix: p, NextHop: ip("10.0.0.2")}
	}
	var apply, announce, withdraw, bareAdd, bareAnnounce, bareWithdraw time.Duration
	for b.Loop() {
		start := time.Now()
		if err := s.Apply(ctxT(), routes, nil); err != nil {
			b.Fatal(err)
		}
		apply += time.Since(start)
		waitCount(b, f, vip, benchRoutes)
		announce += time.Since(start)

		start = time.Now()
		if err := s.Apply(ctxT(), nil, prefixes); err != nil {
			b.Fatal(err)
		}
		waitCount(b, f, vip, 0)
		withdraw += time.Since(start)

		start = time.Now()
		if err := plain.Announce(ctxT(), prefixes, ip("10.0.0.2")); err != nil {
			b.Fatal(err)
		}
		bareAdd += time.Since(start)
		waitCount(b, f, bare, benchRoutes)
		bareAnnounce += time.Since(start)

		start = time.Now()
		if err := plain.Withdraw(ctxT(), prefixes, ip("10.0.0.2")); err != nil {
			b.Fatal(err)
		}
		waitCount(b, f, bare, 0)
		bareWithdraw += time.Since(start)
	}
	n := float64(b.N)
	b.ReportMetric(apply.Seconds()/n, "apply-s")
	b.ReportMetric(announce.Seconds()/n, "announce-s")
	b.ReportMetric(withdraw.Seconds()/n, "withdraw-s")
	b.ReportMetric(bareAdd.Seconds()/n, "bare-addpath-s")
	b.ReportMetric(bareAnnounce.Seconds()/n, "bare-announce-s")
	b.ReportMetric(bareWithdraw.Seconds()/n, "bare-withdraw-s")
	b.ReportMetric(announce.Seconds()/bareAnnounce.Seconds(), "announce-ratio")
	b.ReportMetric(withdraw.Seconds()/bareWithdraw.Seconds(), "withdraw-ratio")
}

func waitCount(b *testing.B, f *routers.FRR, peer netip.Addr, want int) {
	b.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		n, err := f.PrefixCount(peer)
		if err == nil && n == want {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("FRR holds %d routes from %s, want %d (err %v)", n, peer, want, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
