package speaker

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/bgp"
)

// fuzzPrefixes and fuzzVariants are the small universe FuzzRouteTable draws
// from, so that Services collide on prefixes and attributes often.
var (
	fuzzPrefixes = []netip.Prefix{
		netip.MustParsePrefix("192.0.2.1/32"),
		netip.MustParsePrefix("192.0.2.0/24"),
		netip.MustParsePrefix("2001:db8::1/128"),
		netip.MustParsePrefix("2001:db8::/64"),
		netip.MustParsePrefix("198.51.100.7/32"),
	}
	fuzzKeys = []string{"a/x", "a/y", "b/x", "c/z"}
)

// fuzzRoute returns route variant v (0-3) of prefix p.
func fuzzRoute(p netip.Prefix, v byte) bgp.Route {
	r := route(p.String())
	switch v % 4 {
	case 1:
		r.Communities = []uint32{0xFFFFFF01}
	case 2:
		r.LocalPref = ptr.To[uint32](100)
		r.Peers = []string{"tor-a"}
	case 3:
		r.Peers = []string{} // no peer: differs from nil
	}
	return r
}

// FuzzRouteTable applies random Set/Delete sequences and checks, after each
// call, that the differences returned, applied to a simulated router, give
// exactly the naive union of every Service's routes (smallest key wins per
// prefix), that they are minimal (only prefixes whose winning route changed)
// and sorted, and that Routes() is that union.
func FuzzRouteTable(f *testing.F) {
	f.Add([]byte{0, 0x1f, 0, 2, 0x01, 0x55, 1, 0, 0})
	f.Add([]byte{2, 0x03, 0x1b, 0, 0x03, 0x00, 4, 0x03, 0xff, 3, 0, 0, 2, 0x01, 0x02})
	f.Add([]byte{6, 0x1f, 0xe4, 4, 0x1f, 0x1b, 2, 0x1f, 0x4e, 0, 0x1f, 0xff, 7, 0, 0, 5, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		tab := NewRouteTable()
		model := map[string]map[netip.Prefix]bgp.Route{}
		router := map[netip.Prefix]bgp.Route{} // what the BGP engine was told
		before := map[netip.Prefix]bgp.Route{}
		for len(data) >= 3 {
			op, mask, variants := data[0], data[1], data[2]
			data = data[3:]
			key := fuzzKeys[int(op>>1)%len(fuzzKeys)]

			var announce []bgp.Route
			var withdraw []netip.Prefix
			if op&1 == 1 {
				announce, withdraw = tab.Delete(key)
				delete(model, key)
			} else {
				var routes []bgp.Route
				want := map[netip.Prefix]bgp.Route{}
				for i, p := range fuzzPrefixes {
					if mask&(1<<i) == 0 {
						continue
					}
					r := fuzzRoute(p, variants>>(i%4*2))
					routes = append(routes, r)
					want[p] = r
				}
				// Shuffle deterministically: reverse when the top bit is set.
				if mask&0x80 != 0 {
					slices.Reverse(routes)
				}
				announce, withdraw = tab.Set(key, routes)
				if len(want) == 0 {
					delete(model, key)
				} else {
					model[key] = want
				}
			}

			for _, p := range withdraw {
				if _, ok := router[p]; !ok {
					t.Fatalf("withdrew %s, which was not announced", p)
				}
				delete(router, p)
			}
			for _, r := range announce {
				router[r.Prefix] = r
			}
			after := naiveUnion(model)
			if !reflect.DeepEqual(router, after) {
				t.Fatalf("after %s %s: router has\n%+v\nwant\n%+v", opName(op), key, router, after)
			}
			// Minimal: announce exactly the prefixes whose route changed,
			// withdraw exactly those that disappeared, each once, sorted.
			var wantA []netip.Prefix
			var wantW []netip.Prefix
			for _, p := range sortedPrefixes(before, after) {
				b, had := before[p]
				a, has := after[p]
				switch {
				case had && !has:
					wantW = append(wantW, p)
				case has && (!had || !routeEqual(&a, &b)):
					wantA = append(wantA, p)
				}
			}
			var gotA []netip.Prefix
			for _, r := range announce {
				gotA = append(gotA, r.Prefix)
			}
			if !slices.Equal(gotA, wantA) || !slices.Equal(withdraw, wantW) {
				t.Fatalf("after %s %s: announce %v withdraw %v; want announce %v withdraw %v", opName(op), key, gotA, withdraw, wantA, wantW)
			}
			all := tab.Routes()
			if len(all) != len(after) || tab.Len() != len(after) {
				t.Fatalf("Routes() has %d, Len() %d, want %d", len(all), tab.Len(), len(after))
			}
			for i, r := range all {
				if i > 0 && comparePrefix(all[i-1].Prefix, r.Prefix) >= 0 {
					t.Fatalf("Routes() not sorted: %v", all)
				}
				if w := after[r.Prefix]; !reflect.DeepEqual(r, w) {
					t.Fatalf("Routes() has %+v, want %+v", r, w)
				}
			}
			if len(tab.Keys()) != len(model) {
				t.Fatalf("Keys() = %v, model has %d keys", tab.Keys(), len(model))
			}
			before = after
		}
	})
}

func opName(op byte) string {
	if op&1 == 1 {
		return "Delete"
	}
	return "Set"
}

// naiveUnion recomputes the announced set from scratch: per prefix, the
// route of the smallest key wanting it.
func naiveUnion(model map[string]map[netip.Prefix]bgp.Route) map[netip.Prefix]bgp.Route {
	keys := make([]string, 0, len(model))
	for k := range model {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := map[netip.Prefix]bgp.Route{}
	for _, k := range keys {
		for p, r := range model[k] {
			if _, taken := out[p]; !taken {
				out[p] = r
			}
		}
	}
	return out
}

func sortedPrefixes(ms ...map[netip.Prefix]bgp.Route) []netip.Prefix {
	var out []netip.Prefix
	for _, m := range ms {
		for p := range m {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	slices.SortFunc(out, comparePrefix)
	return out
}
