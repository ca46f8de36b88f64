//go:build routing

package bgp_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/test/routers"
)

// TestAnnounceAttributes announces an IPv4 /32 and an IPv6 /128 (over the
// IPv4 session, with MP-BGP) to FRR and BIRD and checks that both see
// exactly the next hops and communities sent, then that a withdrawal
// removes them.
func TestAnnounceAttributes(t *testing.T) {
	self := ip("127.0.1.2")
	frr := routers.StartFRR(t, routers.FRRConfig{
		ASN: routerASN, ListenAddress: ip("127.0.1.1"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: localASN}},
	})
	bird := routers.StartBIRD(t, routers.BIRDConfig{
		ASN: routerASN, ListenAddress: ip("127.0.1.5"),
		Neighbors: []routers.BIRDNeighbor{{Name: "spk", Address: self, ASN: localASN}},
	})
	s, _ := newSpeaker(t, self.String())
	if err := s.SetPeers(ctxT(), []bgp.Peer{
		{Name: "frr", Address: frr.Address, Port: uint16(frr.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: self},
		{Name: "bird", Address: bird.Address, Port: uint16(bird.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: self},
	}); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	if err := frr.WaitEstablished(self, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := bird.WaitEstablished("spk", 10*time.Second); err != nil {
		t.Fatal(err)
	}

	v4, v6 := pfx("10.1.0.1/32"), pfx("fd00:1::1/128")
	const noExport = 0xFFFFFF01
	routes := []bgp.Route{
		{Prefix: v4, NextHop: ip("10.0.0.2"), Communities: []uint32{64512<<16 | 100, noExport},
			LargeCommunities: []bgp.LargeCommunity{{Global: 64512, Local1: 1, Local2: 2}}},
		{Prefix: v6, NextHop: ip("fd00::2"), Communities: []uint32{64512<<16 | 100, noExport},
			LargeCommunities: []bgp.LargeCommunity{{Global: 64512, Local1: 1, Local2: 2}}},
	}
	if err := s.Apply(ctxT(), routes, nil); err != nil {
		t.Fatalf("Apply: %v", err)
	}

	want := map[netip.Prefix]netip.Addr{v4: ip("10.0.0.2"), v6: ip("fd00::2")}
	eventually(t, 5*time.Second, "FRR receives both routes", func() bool {
		n, err := frr.PrefixCount(self)
		return err == nil && n == 2
	})
	for fam, p := range map[routers.Family]netip.Prefix{routers.IPv4: v4, routers.IPv6: v6} {
		got, err := frr.Routes(fam)
		if err != nil {
			t.Fatal(err)
		}
		paths := got[p]
		if len(got) != 1 || len(paths) != 1 {
			t.Fatalf("FRR %s table = %+v, want only %s", fam, got, p)
		}
		checkPath(t, "FRR", p, paths[0], want[p], []string{"64512:100", "no-export"})
	}
	eventually(t, 5*time.Second, "BIRD receives both routes", func() bool {
		got, err := bird.Routes()
		return err == nil && len(got) == 2
	})
	got, err := bird.Routes()
	if err != nil {
		t.Fatal(err)
	}
	for p, nh := range want {
		if len(got[p]) != 1 {
			t.Fatalf("BIRD routes = %+v, want one path for %s", got, p)
		}
		checkPath(t, "BIRD", p, got[p][0], nh, []string{"64512:100", "65535:65281"})
	}

	sessions, err := s.Sessions(ctxT())
	if err != nil {
		t.Fatal(err)
	}
	for _, ss := range sessions {
		if !ss.Established() || ss.Announced != 2 || ss.UpdatesSent == 0 || ss.Since.IsZero() {
			t.Errorf("session %+v: want Established with 2 announced and updates sent", ss)
		}
	}
	c := bgp.NewCollector(s)
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP vipcast_bgp_announced_prefixes Prefixes announced to the BGP peer.
# TYPE vipcast_bgp_announced_prefixes gauge
vipcast_bgp_announced_prefixes{peer="bird"} 2
vipcast_bgp_announced_prefixes{peer="frr"} 2
# HELP vipcast_bgp_session_up Whether the BGP session is Established (1) or not (0).
# TYPE vipcast_bgp_session_up gauge
vipcast_bgp_session_up{peer="bird"} 1
vipcast_bgp_session_up{peer="frr"} 1
`), "vipcast_bgp_session_up", "vipcast_bgp_announced_prefixes"); err != nil {
		t.Errorf("metrics: %v", err)
	}
	if n := testutil.CollectAndCount(c); n != 1+2*(1+6+5) {
		t.Errorf("collector reported %d metrics, want %d", n, 1+2*(1+6+5))
	}

	if err := s.Apply(ctxT(), nil, []netip.Prefix{v4, v6}); err != nil {
		t.Fatalf("Apply withdraw: %v", err)
	}
	eventually(t, 5*time.Second, "FRR and BIRD drop the withdrawn routes", func() bool {
		n, err := frr.PrefixCount(self)
		got, berr := bird.Routes()
		return err == nil && berr == nil && n == 0 && len(got) == 0
	})
}

func checkPath(t *testing.T, router string, p netip.Prefix, got routers.Path, nextHop netip.Addr, communities []string) {
	t.Helper()
	if got.NextHop != nextHop {
		t.Errorf("%s %s next hop = %s, want %s", router, p, got.NextHop, nextHop)
	}
	if got.ASPath != "64512" {
		t.Errorf("%s %s AS path = %q, want 64512", router, p, got.ASPath)
	}
	if !slices.Equal(got.Communities, communities) {
		t.Errorf("%s %s communities = %q, want %q", router, p, got.Communities, communities)
	}
	if !slices.Equal(got.LargeCommunities, []string{"64512:1:2"}) {
		t.Errorf("%s %s large communities = %q, want [64512:1:2]", router, p, got.LargeCommunities)
	}
}

// TestLocalPrefOnlyIBGP checks that LOCAL_PREF reaches an iBGP peer and is
// not sent to an eBGP peer.
func TestLocalPrefOnlyIBGP(t *testing.T) {
	self := ip("127.0.2.2")
	ibgp := routers.StartFRR(t, routers.FRRConfig{
		ASN: localASN, ListenAddress: ip("127.0.2.1"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: localASN}},
	})
	ebgp := routers.StartFRR(t, routers.FRRConfig{
		ASN: routerASN, ListenAddress: ip("127.0.2.3"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: localASN}},
	})
	s, _ := newSpeaker(t, self.String())
	if err := s.SetPeers(ctxT(), []bgp.Peer{
		{Name: "ibgp", Address: ibgp.Address, Port: uint16(ibgp.Port), ASN: localASN, LocalASN: localASN, SourceAddress: self},
		{Name: "ebgp", Address: ebgp.Address, Port: uint16(ebgp.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: self},
	}); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	p := pfx("10.2.0.1/32")
	if err := s.Apply(ctxT(), []bgp.Route{{Prefix: p, NextHop: ip("10.0.0.2"), LocalPref: u32(250)}}, nil); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	for _, f := range []*routers.FRR{ibgp, ebgp} {
		eventually(t, 10*time.Second, "route reaches "+f.Address.String(), func() bool {
			n, err := f.PrefixCount(self)
			return err == nil && n == 1
		})
	}
	in, err := ibgp.Routes(routers.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if paths := in[p]; len(paths) != 1 || paths[0].LocalPref == nil || *paths[0].LocalPref != 250 || paths[0].NextHop != ip("10.0.0.2") {
		t.Errorf("iBGP router paths for %s = %+v, want local-pref 250 via 10.0.0.2", p, paths)
	}
	ex, err := ebgp.Routes(routers.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if paths := ex[p]; len(paths) != 1 || paths[0].LocalPref != nil {
		t.Errorf("eBGP router paths for %s = %+v, want one without local-pref", p, paths)
	}

	// Changing only LocalPref replaces the iBGP path.
	if err := s.Apply(ctxT(), []bgp.Route{{Prefix: p, NextHop: ip("10.0.0.2"), LocalPref: u32(300)}}, nil); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	eventually(t, 5*time.Second, "iBGP router sees local-pref 300", func() bool {
		in, err := ibgp.Routes(routers.IPv4)
		return err == nil && len(in[p]) == 1 && in[p][0].LocalPref != nil && *in[p][0].LocalPref == 300
	})
}
