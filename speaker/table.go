package speaker

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	"github.com/vipcast/vipcast/bgp"
)

// RouteTable merges the routes of every Service into the distinct prefixes
// this node announces, and turns the change of one Service's routes into
// the minimal announce/withdraw difference for the BGP engine.
//
// Several Services may want the same prefix: Services sharing a VIP
// (vipcast.io/sharing-key), or Services whose VIPs fall in one aggregate.
// A prefix is announced while at least one Service wants it and withdrawn
// when the last one stops. When the Services want it with different
// attributes (for example their pools were reconfigured differently in
// between), the route of the smallest service key wins, so the outcome does
// not depend on the order of events; a change of the winning attributes is
// returned as a re-announcement of the prefix.
//
// Set and Delete cost O(r·log s + r·s) in the worst case for a Service with r
// routes whose prefixes are each wanted by s Services (s is 1 for a host
// route of an unshared VIP): they never look at other prefixes, so their
// cost does not grow with the table.
//
// A RouteTable is not safe for concurrent use: the caller serialises calls.
// Routes are stored as given; their slices (communities, peers) are shared
// with the caller and must not be modified afterwards.
type RouteTable struct {
	services map[string][]bgp.Route          // key → its routes, sorted by prefix, unique
	prefixes map[netip.Prefix][]prefixWanter // prefix → the Services wanting it, sorted by key
}

// prefixWanter is one Service's route for a prefix.
type prefixWanter struct {
	key   string
	route bgp.Route
}

// NewRouteTable returns an empty table.
func NewRouteTable() *RouteTable {
	return &RouteTable{services: map[string][]bgp.Route{}, prefixes: map[netip.Prefix][]prefixWanter{}}
}

// Set makes routes the routes of the Service serviceKey (replacing what it
// had) and returns what the BGP engine must change: the routes to announce
// (new prefixes, and prefixes whose winning attributes changed) and the
// prefixes to withdraw (no Service wants them any more), both sorted by
// prefix. Prefixes are masked; when routes holds one prefix twice, the
// first wins.
func (t *RouteTable) Set(serviceKey string, routes []bgp.Route) (announce []bgp.Route, withdraw []netip.Prefix) {
	next := normalize(routes)
	prev := t.services[serviceKey]
	i, j := 0, 0
	for i < len(prev) || j < len(next) {
		var c int
		switch {
		case i == len(prev):
			c = 1
		case j == len(next):
			c = -1
		default:
			c = comparePrefix(prev[i].Prefix, next[j].Prefix)
		}
		switch {
		case c < 0: // prefix no longer wanted by this Service
			announce, withdraw = t.remove(serviceKey, prev[i].Prefix, announce, withdraw)
			i++
		case c > 0: // new prefix for this Service
			announce = t.upsert(serviceKey, next[j], announce)
			j++
		default:
			if !routeEqual(&prev[i], &next[j]) {
				announce = t.upsert(serviceKey, next[j], announce)
			}
			i++
			j++
		}
	}
	if len(next) == 0 {
		delete(t.services, serviceKey)
	} else {
		t.services[serviceKey] = next
	}
	return announce, withdraw
}

// Delete forgets the Service serviceKey; it is Set(serviceKey, nil). A
// prefix it shared may be re-announced with another Service's attributes.
func (t *RouteTable) Delete(serviceKey string) (announce []bgp.Route, withdraw []netip.Prefix) {
	return t.Set(serviceKey, nil)
}

// Routes returns every announced route (one per prefix, the winning
// attributes), sorted by prefix: the whole set, for a resync or after the
// BGP engine restarted.
func (t *RouteTable) Routes() []bgp.Route {
	out := make([]bgp.Route, 0, len(t.prefixes))
	for _, ws := range t.prefixes {
		out = append(out, ws[0].route)
	}
	slices.SortFunc(out, func(a, b bgp.Route) int { return comparePrefix(a.Prefix, b.Prefix) })
	return out
}

// First returns the first n announced prefixes in order (IPv4 first, by
// address, then length), in O(prefixes·n) without sorting the table.
func (t *RouteTable) First(n int) []netip.Prefix {
	out := make([]netip.Prefix, 0, min(n, len(t.prefixes)))
	for p := range t.prefixes {
		i, _ := slices.BinarySearchFunc(out, p, comparePrefix)
		switch {
		case len(out) < n:
			out = slices.Insert(out, i, p)
		case i < n:
			copy(out[i+1:], out[i:n-1])
			out[i] = p
		}
	}
	return out
}

// ServiceRoutes returns the routes last Set for serviceKey (shared; do not
// modify).
func (t *RouteTable) ServiceRoutes(serviceKey string) []bgp.Route { return t.services[serviceKey] }

// Keys returns the keys of the Services that have routes, sorted.
func (t *RouteTable) Keys() []string {
	out := make([]string, 0, len(t.services))
	for k := range t.services {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Len returns the number of distinct announced prefixes.
func (t *RouteTable) Len() int { return len(t.prefixes) }

// upsert records that key wants r, and appends r's prefix's winning route to
// announce when it changed.
func (t *RouteTable) upsert(key string, r bgp.Route, announce []bgp.Route) []bgp.Route {
	ws := t.prefixes[r.Prefix]
	if len(ws) == 0 {
		t.prefixes[r.Prefix] = []prefixWanter{{key, r}}
		return append(announce, r)
	}
	before := ws[0].route
	i, found := slices.BinarySearchFunc(ws, key, func(w prefixWanter, k string) int { return strings.Compare(w.key, k) })
	if found {
		ws[i].route = r
	} else {
		ws = slices.Insert(ws, i, prefixWanter{key, r})
		t.prefixes[r.Prefix] = ws
	}
	if !routeEqual(&before, &ws[0].route) {
		announce = append(announce, ws[0].route)
	}
	return announce
}

// remove records that key no longer wants p: p is withdrawn when nobody
// wants it any more, re-announced when its winning route changed.
func (t *RouteTable) remove(key string, p netip.Prefix, announce []bgp.Route, withdraw []netip.Prefix) ([]bgp.Route, []netip.Prefix) {
	ws := t.prefixes[p]
	i, found := slices.BinarySearchFunc(ws, key, func(w prefixWanter, k string) int { return strings.Compare(w.key, k) })
	if !found {
		return announce, withdraw // cannot happen: services and prefixes agree
	}
	if len(ws) == 1 {
		delete(t.prefixes, p)
		return announce, append(withdraw, p)
	}
	before := ws[0].route
	ws = slices.Delete(ws, i, i+1)
	t.prefixes[p] = ws
	if !routeEqual(&before, &ws[0].route) {
		announce = append(announce, ws[0].route)
	}
	return announce, withdraw
}

// normalize returns a sorted copy of routes with masked, unique prefixes
// (the first of duplicates wins); nil for none.
func normalize(routes []bgp.Route) []bgp.Route {
	if len(routes) == 0 {
		return nil
	}
	out := slices.Clone(routes)
	for i := range out {
		out[i].Prefix = out[i].Prefix.Masked()
	}
	slices.SortStableFunc(out, func(a, b bgp.Route) int { return comparePrefix(a.Prefix, b.Prefix) })
	return slices.CompactFunc(out, func(a, b bgp.Route) bool { return a.Prefix == b.Prefix })
}

// comparePrefix orders prefixes by address (IPv4 first), then length.
func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// routeEqual reports whether two routes are announced identically. Peers
// nil (every peer) differs from an empty Peers (no peer).
func routeEqual(a, b *bgp.Route) bool {
	return a.Prefix == b.Prefix && a.NextHop == b.NextHop &&
		slices.Equal(a.Communities, b.Communities) &&
		slices.Equal(a.LargeCommunities, b.LargeCommunities) &&
		(a.LocalPref == nil) == (b.LocalPref == nil) && (a.LocalPref == nil || *a.LocalPref == *b.LocalPref) &&
		(a.Peers == nil) == (b.Peers == nil) && slices.Equal(a.Peers, b.Peers)
}
