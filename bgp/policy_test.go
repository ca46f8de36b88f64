package bgp

import (
	"context"
	"net/netip"
	"slices"
	"testing"

	api "github.com/osrg/gobgp/v4/api"
	"k8s.io/klog/v2/ktesting"
)

// denySet returns the prefixes of a peer's IPv4 deny set.
func denySet(t *testing.T, g *GoBGP, peer string) []string {
	t.Helper()
	var out []string
	if err := g.srv.ListDefinedSet(context.Background(), &api.ListDefinedSetRequest{
		DefinedType: api.DefinedType_DEFINED_TYPE_PREFIX, Name: filterFor(peer).deny4,
	}, func(ds *api.DefinedSet) {
		for _, p := range ds.Prefixes {
			out = append(out, p.IpPrefix)
		}
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestDenySets checks the deny sets behind Route.Peers, and that
// resyncFilters repairs them; it needs no router.
func TestDenySets(t *testing.T) {
	ctx := context.Background()
	g, err := New(Config{RouterID: netip.MustParseAddr("127.0.13.2"), Logger: ktesting.NewLogger(t, ktesting.NewConfig())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Stop(ctx) })
	if err := g.SetPeers(ctx, []Peer{
		{Name: "a", Address: netip.MustParseAddr("127.0.13.1"), Port: 1, ASN: 65000, LocalASN: 64512},
		{Name: "b", Address: netip.MustParseAddr("127.0.13.3"), Port: 1, ASN: 65000, LocalASN: 64512},
	}); err != nil {
		t.Fatal(err)
	}
	r1, r2 := netip.MustParsePrefix("10.13.0.1/32"), netip.MustParsePrefix("10.13.0.2/32")
	nh := netip.MustParseAddr("10.0.0.2")
	if err := g.Apply(ctx, []Route{{Prefix: r1, NextHop: nh, Peers: []string{"a"}}, {Prefix: r2, NextHop: nh}}, nil); err != nil {
		t.Fatal(err)
	}
	if a, b := denySet(t, g, "a"), denySet(t, g, "b"); len(a) != 0 || !slices.Equal(b, []string{"10.13.0.1/32"}) {
		t.Fatalf("deny sets a=%v b=%v, want b=[10.13.0.1/32]", a, b)
	}
	if err := g.Apply(ctx, []Route{{Prefix: r2, NextHop: nh, Peers: []string{}}}, nil); err != nil {
		t.Fatal(err)
	}
	if a, b := denySet(t, g, "a"), denySet(t, g, "b"); !slices.Equal(a, []string{"10.13.0.2/32"}) || len(b) != 2 {
		t.Fatalf("deny sets a=%v b=%v after restricting %s to no peer", a, b, r2)
	}
	// Corrupt b's set, then repair it.
	if err := g.changeDenied(ctx, "b", []netip.Prefix{r1}, false); err != nil {
		t.Fatal(err)
	}
	if err := g.changeDenied(ctx, "b", []netip.Prefix{netip.MustParsePrefix("10.13.9.9/32")}, true); err != nil {
		t.Fatal(err)
	}
	if err := g.resyncFilters(ctx); err != nil {
		t.Fatal(err)
	}
	if b := denySet(t, g, "b"); !slices.Equal(b, []string{"10.13.0.1/32", "10.13.0.2/32"}) {
		t.Fatalf("b's deny set after resync = %v", b)
	}
	if err := g.Apply(ctx, nil, []netip.Prefix{r1, r2}); err != nil {
		t.Fatal(err)
	}
	if a, b := denySet(t, g, "a"), denySet(t, g, "b"); len(a)+len(b) != 0 {
		t.Fatalf("deny sets a=%v b=%v after withdrawing everything", a, b)
	}
}
