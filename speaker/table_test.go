package speaker

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/bgp"
)

func withComm(r bgp.Route, c ...uint32) bgp.Route { r.Communities = c; return r }

func prefixes(ps ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

// step is one call on a RouteTable and its expected result.
type step struct {
	key          string
	routes       []bgp.Route // nil with del: Delete
	del          bool
	wantAnnounce []bgp.Route
	wantWithdraw []netip.Prefix
}

func runSteps(t *testing.T, tab *RouteTable, steps []step) {
	t.Helper()
	for i, s := range steps {
		var a []bgp.Route
		var w []netip.Prefix
		if s.del {
			a, w = tab.Delete(s.key)
		} else {
			a, w = tab.Set(s.key, s.routes)
		}
		if !reflect.DeepEqual(a, s.wantAnnounce) {
			t.Errorf("step %d (%s): announce\n got %+v\nwant %+v", i, s.key, a, s.wantAnnounce)
		}
		if !reflect.DeepEqual(w, s.wantWithdraw) {
			t.Errorf("step %d (%s): withdraw %v, want %v", i, s.key, w, s.wantWithdraw)
		}
	}
}

func TestRouteTable(t *testing.T) {
	r1, r2, r3 := route("192.0.2.1/32"), route("192.0.2.2/32"), route("2001:db8::3/128")
	agg := route("198.51.100.0/24")
	x, y, z := withComm(r1, 1), withComm(r1, 2), withComm(r1, 3)

	tests := []struct {
		name  string
		steps []step
		final []bgp.Route
	}{
		{
			name: "shared VIP: announced once, withdrawn with the last Service",
			steps: []step{
				{key: "ns/a", routes: []bgp.Route{r1}, wantAnnounce: []bgp.Route{r1}},
				{key: "ns/b", routes: []bgp.Route{r1}},
				{key: "ns/a", del: true},
				{key: "ns/a", del: true}, // absent key: nothing
				{key: "ns/b", routes: nil, wantWithdraw: prefixes("192.0.2.1/32")},
			},
			final: []bgp.Route{},
		},
		{
			name: "aggregate refcount over many Services",
			steps: []step{
				{key: "ns/a", routes: []bgp.Route{agg}, wantAnnounce: []bgp.Route{agg}},
				{key: "ns/b", routes: []bgp.Route{agg}},
				{key: "ns/c", routes: []bgp.Route{agg}},
				{key: "ns/b", del: true},
				{key: "ns/a", del: true},
				{key: "ns/c", routes: []bgp.Route{agg}}, // unchanged
				{key: "ns/c", del: true, wantWithdraw: prefixes("198.51.100.0/24")},
			},
			final: []bgp.Route{},
		},
		{
			name: "attribute conflict: the smallest service key wins",
			steps: []step{
				{key: "ns/b", routes: []bgp.Route{y}, wantAnnounce: []bgp.Route{y}},
				{key: "ns/c", routes: []bgp.Route{z}},                               // c > b: nothing
				{key: "ns/a", routes: []bgp.Route{x}, wantAnnounce: []bgp.Route{x}}, // a wins
				{key: "ns/b", routes: []bgp.Route{withComm(r1, 9)}},                 // not the winner: nothing
				{key: "ns/a", del: true, wantAnnounce: []bgp.Route{withComm(r1, 9)}},
				{key: "ns/b", del: true, wantAnnounce: []bgp.Route{z}},
				{key: "ns/c", del: true, wantWithdraw: prefixes("192.0.2.1/32")},
			},
			final: []bgp.Route{},
		},
		{
			name: "same attributes from another key: no re-announce when the winner changes",
			steps: []step{
				{key: "ns/b", routes: []bgp.Route{x}, wantAnnounce: []bgp.Route{x}},
				{key: "ns/a", routes: []bgp.Route{x}},
				{key: "ns/a", del: true},
			},
			final: []bgp.Route{x},
		},
		{
			name: "attribute change re-announces; an identical Set does nothing",
			steps: []step{
				{key: "ns/a", routes: []bgp.Route{x, r2}, wantAnnounce: []bgp.Route{x, r2}},
				{key: "ns/a", routes: []bgp.Route{y, r2}, wantAnnounce: []bgp.Route{y}},
				{key: "ns/a", routes: []bgp.Route{r2, y}},
				{key: "ns/a", routes: []bgp.Route{func() bgp.Route { r := y; r.LocalPref = ptr.To[uint32](5); return r }(), r2},
					wantAnnounce: []bgp.Route{func() bgp.Route { r := y; r.LocalPref = ptr.To[uint32](5); return r }()}},
				{key: "ns/a", routes: []bgp.Route{func() bgp.Route { r := y; r.LocalPref = ptr.To[uint32](5); return r }(), r2}},
			},
		},
		{
			name: "Peers nil (every peer) and empty (none) differ",
			steps: []step{
				{key: "ns/a", routes: []bgp.Route{r1}, wantAnnounce: []bgp.Route{r1}},
				{key: "ns/a", routes: []bgp.Route{func() bgp.Route { r := r1; r.Peers = []string{}; return r }()},
					wantAnnounce: []bgp.Route{func() bgp.Route { r := r1; r.Peers = []string{}; return r }()}},
				{key: "ns/a", routes: []bgp.Route{func() bgp.Route { r := r1; r.Peers = []string{"tor"}; return r }()},
					wantAnnounce: []bgp.Route{func() bgp.Route { r := r1; r.Peers = []string{"tor"}; return r }()}},
			},
		},
		{
			name: "a Service's prefixes move: announce new, withdraw old, sorted",
			steps: []step{
				{key: "ns/a", routes: []bgp.Route{r3, r1}, wantAnnounce: []bgp.Route{r1, r3}},
				{key: "ns/a", routes: []bgp.Route{r3, r2}, wantAnnounce: []bgp.Route{r2}, wantWithdraw: prefixes("192.0.2.1/32")},
			},
			final: []bgp.Route{r2, r3},
		},
		{
			name: "unmasked prefixes are masked; duplicates: the first wins",
			steps: []step{
				{key: "ns/a", routes: []bgp.Route{
					func() bgp.Route { r := withComm(agg, 1); r.Prefix = netip.MustParsePrefix("198.51.100.7/24"); return r }(),
					withComm(agg, 2),
				}, wantAnnounce: []bgp.Route{withComm(agg, 1)}},
			},
			final: []bgp.Route{withComm(agg, 1)},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tab := NewRouteTable()
			runSteps(t, tab, tc.steps)
			got := tab.Routes()
			switch {
			case tc.final == nil: // not checked
			case len(tc.final) == 0:
				if len(got) != 0 || tab.Len() != 0 || len(tab.Keys()) != 0 {
					t.Errorf("table not empty: %+v, keys %v", got, tab.Keys())
				}
			case !reflect.DeepEqual(got, tc.final):
				t.Errorf("Routes() = %+v, want %+v", got, tc.final)
			}
		})
	}
}

func TestRouteTableAccessors(t *testing.T) {
	tab := NewRouteTable()
	in := []bgp.Route{route("192.0.2.2/32"), route("192.0.2.1/32")}
	tab.Set("ns/b", in)
	tab.Set("ns/a", []bgp.Route{route("192.0.2.1/32")})
	tab.Set("ns/c", nil)
	in[0] = route("203.0.113.1/32") // the table keeps its own slice
	if got, want := tab.Keys(), []string{"ns/a", "ns/b"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Keys() = %v, want %v", got, want)
	}
	if tab.Len() != 2 {
		t.Errorf("Len() = %d, want 2", tab.Len())
	}
	if got, want := tab.ServiceRoutes("ns/b"), []bgp.Route{route("192.0.2.1/32"), route("192.0.2.2/32")}; !reflect.DeepEqual(got, want) {
		t.Errorf("ServiceRoutes(ns/b) = %v, want %v", got, want)
	}
	if got, want := tab.Routes(), []bgp.Route{route("192.0.2.1/32"), route("192.0.2.2/32")}; !reflect.DeepEqual(got, want) {
		t.Errorf("Routes() = %v, want %v", got, want)
	}
}

// TestRouteTableFirst: First gives the table's smallest prefixes in
// order, the same as the head of Routes, for a sample smaller and larger
// than the table.
func TestRouteTableFirst(t *testing.T) {
	tbl := NewRouteTable()
	for i := range 50 {
		addr := netip.AddrFrom4([4]byte{10, 0, byte(i * 7 % 50), 1})
		if i%5 == 0 {
			addr = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i)})
		}
		tbl.Set(fmt.Sprintf("ns/s%d", i), []bgp.Route{{Prefix: netip.PrefixFrom(addr, addr.BitLen())}})
	}
	all := tbl.Routes()
	for _, n := range []int{0, 1, 8, 50, 60} {
		got := tbl.First(n)
		var want []netip.Prefix
		for _, r := range all[:min(n, len(all))] {
			want = append(want, r.Prefix)
		}
		if len(got) != len(want) || (len(want) > 0 && !slices.Equal(got, want)) {
			t.Errorf("First(%d) = %v, want %v", n, got, want)
		}
	}
}
