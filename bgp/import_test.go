//go:build routing

package bgp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	gobgp "github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"k8s.io/klog/v2/ktesting"

	"github.com/vipcast/vipcast/test/routers"
)

// TestImportReject checks that routes a router announces are not accepted
// into gobgp's RIB, hence not re-advertised to other peers, while local
// routes still are announced.
func TestImportReject(t *testing.T) {
	self := netip.MustParseAddr("127.0.6.2")
	origin := []netip.Prefix{netip.MustParsePrefix("10.99.0.0/24"), netip.MustParsePrefix("fd00:99::/64")}
	a := routers.StartFRR(t, routers.FRRConfig{ASN: 65001, ListenAddress: netip.MustParseAddr("127.0.6.1"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: 64512}}, Networks: origin})
	b := routers.StartFRR(t, routers.FRRConfig{ASN: 65002, ListenAddress: netip.MustParseAddr("127.0.6.3"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: 64512}}})
	g, err := New(Config{RouterID: self, ListenPort: -1, Logger: ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() { _ = g.Stop(ctx) })
	if err := g.SetPeers(ctx, []Peer{
		{Name: "a", Address: a.Address, Port: uint16(a.Port), ASN: 65001, LocalASN: 64512, SourceAddress: self},
		{Name: "b", Address: b.Address, Port: uint16(b.Port), ASN: 65002, LocalASN: 64512, SourceAddress: self},
	}); err != nil {
		t.Fatal(err)
	}
	local := netip.MustParsePrefix("10.6.0.1/32")
	if err := g.Apply(ctx, []Route{{Prefix: local, NextHop: netip.MustParseAddr("10.0.0.2")}}, nil); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*routers.FRR{a, b} {
		if err := f.WaitEstablished(self, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// Wait until gobgp has received a's two UPDATEs (one per family).
	deadline := time.Now().Add(5 * time.Second)
	for {
		ss, err := g.Sessions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ss[0].Peer == "a" && ss[0].UpdatesReceived >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no UPDATE received from a: %+v", ss)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, fam := range []gobgp.Family{gobgp.RF_IPv4_UC, gobgp.RF_IPv6_UC} {
		var got []string
		if err := g.srv.ListPath(apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_GLOBAL, Family: fam}, func(p gobgp.NLRI, _ []*apiutil.Path) {
			got = append(got, p.String())
		}); err != nil {
			t.Fatal(err)
		}
		want := 0
		if fam == gobgp.RF_IPv4_UC {
			want = 1
		}
		if len(got) != want || (want == 1 && got[0] != local.String()) {
			t.Errorf("gobgp global RIB %v = %v, want only the local route", fam, got)
		}
	}
	// b gets the local route but none of a's.
	time.Sleep(500 * time.Millisecond)
	for fam, n := range map[routers.Family]int{routers.IPv4: 1, routers.IPv6: 0} {
		r, err := b.Routes(fam)
		if err != nil {
			t.Fatal(err)
		}
		if len(r) != n {
			t.Errorf("b's %s table = %+v, want %d route(s)", fam, r, n)
		}
	}
}
