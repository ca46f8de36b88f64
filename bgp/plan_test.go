package bgp

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// steps renders p one gobgp step a line, in execution order.
func (p routePlan) steps() []string {
	var out []string
	for _, r := range p.withdraw {
		out = append(out, "-path "+r.Prefix.String())
	}
	for _, c := range p.deny {
		out = append(out, "+deny "+c.peer+" "+prefixList(c.prefixes))
	}
	for _, c := range p.allow {
		out = append(out, "-deny "+c.peer+" "+prefixList(c.prefixes))
	}
	for _, r := range p.announce {
		out = append(out, "+path "+r.Prefix.String())
	}
	for _, name := range p.resetOut {
		out = append(out, "reset-out "+name)
	}
	return out
}

func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, " ")
}

// testRoutes normalizes routes into the map and order Apply passes to
// planRoutes.
func testRoutes(t *testing.T, routes []Route) (map[netip.Prefix]*Route, []netip.Prefix) {
	t.Helper()
	m, order, err := normalizeRoutes(routes)
	if err != nil {
		t.Fatal(err)
	}
	return m, order
}

func testPeers(names ...string) map[string]*Peer {
	m := map[string]*Peer{}
	for i, name := range names {
		m[name] = &Peer{Name: name, Address: netip.AddrFrom4([4]byte{127, 0, 0, byte(i + 1)}), ASN: 65000, LocalASN: 64512}
	}
	return m
}

func TestPlanRoutes(t *testing.T) {
	nh4, nh6 := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")
	route := func(p string, peers ...string) Route {
		r := Route{Prefix: netip.MustParsePrefix(p), NextHop: nh4}
		if r.Prefix.Addr().Is6() {
			r.NextHop = nh6
		}
		if len(peers) > 0 {
			r.Peers = peers
		}
		return r
	}
	toNone := func(p string) Route { r := route(p); r.Peers = []string{}; return r }
	withCommunity := func(r Route, c uint32) Route { r.Communities = []uint32{c}; return r }
	withLocalPref := func(r Route, lp uint32) Route { r.LocalPref = &lp; return r }
	const p1, p2, p3, p6 = "10.1.0.1/32", "10.1.0.2/32", "10.1.0.3/32", "fd00:1::1/128"

	tests := []struct {
		name     string
		current  []Route
		peers    []string
		announce []Route
		withdraw []string
		want     []string
	}{
		{name: "nothing", peers: []string{"a"}},
		{
			name:     "new route to every peer",
			peers:    []string{"a", "b"},
			announce: []Route{route(p1)},
			want:     []string{"+path " + p1},
		},
		{
			name:     "new route without peers",
			announce: []Route{route(p1, "a")},
			want:     []string{"+path " + p1},
		},
		{
			name:     "new restricted route: denied before it is announced",
			peers:    []string{"a", "b", "c"},
			announce: []Route{route(p1, "a")},
			want:     []string{"+deny b " + p1, "+deny c " + p1, "+path " + p1},
		},
		{
			name:     "new route to no peer",
			peers:    []string{"a", "b"},
			announce: []Route{toNone(p1)},
			want:     []string{"+deny a " + p1, "+deny b " + p1, "+path " + p1},
		},
		{
			name:     "route to an unknown peer only",
			peers:    []string{"a"},
			announce: []Route{route(p1, "x")},
			want:     []string{"+deny a " + p1, "+path " + p1},
		},
		{
			name:     "IPv6 restricted route",
			peers:    []string{"a", "b"},
			announce: []Route{route(p6, "b")},
			want:     []string{"+deny a " + p6, "+path " + p6},
		},
		{
			name:     "unchanged route sends nothing",
			current:  []Route{withCommunity(route(p1, "a"), 7)},
			peers:    []string{"a", "b"},
			announce: []Route{withCommunity(route(p1, "a"), 7)},
		},
		{
			name:     "unchanged route with peers listed in another order",
			current:  []Route{route(p1, "a", "b")},
			peers:    []string{"a", "b", "c"},
			announce: []Route{route(p1, "b", "a", "b")},
		},
		{
			name:     "replace with a new community",
			current:  []Route{route(p1)},
			peers:    []string{"a"},
			announce: []Route{withCommunity(route(p1), 7)},
			want:     []string{"+path " + p1},
		},
		{
			name:     "replace with a new local preference",
			current:  []Route{withLocalPref(route(p1), 100)},
			peers:    []string{"a"},
			announce: []Route{withLocalPref(route(p1), 200)},
			want:     []string{"+path " + p1},
		},
		{
			name:     "withdraw",
			current:  []Route{route(p1), route(p2)},
			peers:    []string{"a"},
			withdraw: []string{p1},
			want:     []string{"-path " + p1},
		},
		{
			name:     "withdraw a prefix not announced",
			current:  []Route{route(p1)},
			peers:    []string{"a"},
			withdraw: []string{p2},
		},
		{
			name:     "withdraw an unmasked prefix",
			current:  []Route{route("10.2.0.0/24")},
			peers:    []string{"a"},
			withdraw: []string{"10.2.0.9/24"},
			want:     []string{"-path 10.2.0.0/24"},
		},
		{
			name:     "withdraw a restricted route: denial removed after",
			current:  []Route{route(p1, "a"), route(p2, "a")},
			peers:    []string{"a", "b", "c"},
			withdraw: []string{p2, p1},
			want:     []string{"-path " + p2, "-path " + p1, "-deny b " + p2 + " " + p1, "-deny c " + p2 + " " + p1},
		},
		{
			name:     "prefix both announced and withdrawn is announced",
			current:  []Route{route(p1)},
			peers:    []string{"a"},
			announce: []Route{withCommunity(route(p1), 7)},
			withdraw: []string{p1},
			want:     []string{"+path " + p1},
		},
		{
			name:     "peer newly denied: the route flaps",
			current:  []Route{route(p1)},
			peers:    []string{"a", "b"},
			announce: []Route{route(p1, "a")},
			want:     []string{"-path " + p1, "+deny b " + p1, "+path " + p1},
		},
		{
			name:     "peer newly allowed with the same attributes: soft reset out",
			current:  []Route{route(p1, "a")},
			peers:    []string{"a", "b"},
			announce: []Route{route(p1)},
			want:     []string{"-deny b " + p1, "+path " + p1, "reset-out b"},
		},
		{
			name:     "peer newly allowed with new attributes: the new path reaches it",
			current:  []Route{route(p1, "a")},
			peers:    []string{"a", "b"},
			announce: []Route{withCommunity(route(p1), 7)},
			want:     []string{"-deny b " + p1, "+path " + p1},
		},
		{
			name:     "one peer allowed, another denied: flap, no reset",
			current:  []Route{route(p1, "a")},
			peers:    []string{"a", "b"},
			announce: []Route{route(p1, "b")},
			want:     []string{"-path " + p1, "+deny a " + p1, "-deny b " + p1, "+path " + p1},
		},
		{
			name:     "one soft reset per peer",
			current:  []Route{route(p1, "a"), route(p2, "a"), route(p3)},
			peers:    []string{"c", "b", "a"},
			announce: []Route{route(p2), route(p1)},
			want: []string{"-deny b " + p2 + " " + p1, "-deny c " + p2 + " " + p1,
				"+path " + p2, "+path " + p1, "reset-out b", "reset-out c"},
		},
		{
			name:     "announce order kept, a prefix listed twice once",
			peers:    []string{"a"},
			announce: []Route{route(p3), route(p1), route(p2), withCommunity(route(p1), 7)},
			want:     []string{"+path " + p3, "+path " + p1, "+path " + p2},
		},
		{
			name:     "withdrawals before flaps, all before the denials",
			current:  []Route{route(p1), route(p2, "a")},
			peers:    []string{"a", "b"},
			announce: []Route{route(p1, "b"), route(p3, "a")},
			withdraw: []string{p2},
			want: []string{"-path " + p2, "-path " + p1,
				"+deny a " + p1, "+deny b " + p3, "-deny b " + p2, "+path " + p1, "+path " + p3},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			current, _ := testRoutes(t, tc.current)
			news, order := testRoutes(t, tc.announce)
			var withdraw []netip.Prefix
			for _, p := range tc.withdraw {
				withdraw = append(withdraw, netip.MustParsePrefix(p))
			}
			plan := planRoutes(current, testPeers(tc.peers...), news, order, withdraw)
			if got := plan.steps(); !slices.Equal(got, tc.want) {
				t.Errorf("plan:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
			if plan.Len() != len(tc.want) || plan.Empty() != (len(tc.want) == 0) {
				t.Errorf("Len %d, Empty %v for %d steps", plan.Len(), plan.Empty(), len(tc.want))
			}
			// Withdrawals delete the path gobgp holds; announcements
			// add the wanted one.
			for _, r := range plan.withdraw {
				if r != current[r.Prefix] {
					t.Errorf("withdraws %+v, not the announced route %+v", r, current[r.Prefix])
				}
			}
			for _, r := range plan.announce {
				if r != news[r.Prefix] {
					t.Errorf("announces %+v, not the wanted route %+v", r, news[r.Prefix])
				}
			}
		})
	}
}

// TestPlanRoutesPure checks that planning reads its arguments only.
func TestPlanRoutesPure(t *testing.T) {
	p := netip.MustParsePrefix("10.1.0.1/32")
	old := &Route{Prefix: p, NextHop: netip.MustParseAddr("10.0.0.2")}
	current := map[netip.Prefix]*Route{p: old}
	news := map[netip.Prefix]*Route{p: {Prefix: p, NextHop: old.NextHop, Peers: []string{"a"}}}
	peers := testPeers("a", "b")
	plan := planRoutes(current, peers, news, []netip.Prefix{p}, []netip.Prefix{p})
	if plan.Empty() {
		t.Fatal("empty plan")
	}
	if len(current) != 1 || current[p] != old || len(news) != 1 || len(peers) != 2 {
		t.Errorf("planRoutes changed its arguments: current %v, news %v, peers %v", current, news, peers)
	}
}

func TestRoutePlanString(t *testing.T) {
	r := &Route{Prefix: netip.MustParsePrefix("10.1.0.1/32")}
	for _, tc := range []struct {
		plan routePlan
		want string
	}{
		{routePlan{}, "no changes"},
		{routePlan{announce: []*Route{r, r, r}}, "+path 3"},
		{routePlan{
			withdraw: []*Route{r},
			deny:     []denyChange{{peer: "a"}, {peer: "b"}},
			allow:    []denyChange{{peer: "c"}},
			announce: []*Route{r},
			resetOut: []string{"c"},
		}, "-path 1, +deny 2, -deny 1, +path 1, reset-out 1"},
	} {
		if got := tc.plan.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
		if tc.plan.Empty() != (tc.plan.Len() == 0) {
			t.Errorf("Empty() = %v with Len %d", tc.plan.Empty(), tc.plan.Len())
		}
	}
}

// steps renders p one gobgp step a line, in execution order.
func (p peerPlan) steps() []string {
	var out []string
	for _, old := range p.remove {
		out = append(out, "-peer "+old.Name+" "+old.Address.String())
	}
	if len(p.remove) > 0 {
		out = append(out, "export "+strings.Join(p.keep, " "))
	}
	for _, old := range p.remove {
		out = append(out, "-filter "+old.Name)
	}
	for _, a := range p.add {
		out = append(out, strings.TrimSpace("+filter "+a.peer.Name+" "+prefixList(a.deny)))
	}
	out = append(out, "export "+strings.Join(p.export, " "))
	for _, a := range p.add {
		out = append(out, "+peer "+a.peer.Name+" "+a.peer.Address.String())
	}
	return out
}

func TestPlanPeers(t *testing.T) {
	peer := func(name, addr string) Peer {
		return Peer{Name: name, Address: netip.MustParseAddr(addr), ASN: 65000, LocalASN: 64512}
	}
	a, b, c := peer("a", "127.0.0.1"), peer("b", "127.0.0.2"), peer("c", "127.0.0.3")
	change := func(p Peer, f func(*Peer)) Peer { f(&p); return p }
	nh := netip.MustParseAddr("10.0.0.2")
	route := func(p string, peers ...string) Route {
		r := Route{Prefix: netip.MustParsePrefix(p), NextHop: nh, Peers: peers}
		if r.Prefix.Addr().Is6() {
			r.NextHop = netip.MustParseAddr("fd00::2")
		}
		return r
	}
	restricted := []Route{
		route("10.1.0.9/32", "a"),
		route("fd00:1::1/128", "a"),
		route("10.1.0.1/32"),
		{Prefix: netip.MustParsePrefix("10.1.0.2/32"), NextHop: nh, Peers: []string{}},
		route("10.1.0.3/32", "b", "c"),
	}

	tests := []struct {
		name          string
		current, want []Peer
		routes        []Route
		steps         []string
		plan          string
	}{
		{name: "nothing", steps: []string{"export "}, plan: "no changes"},
		{
			name:  "first peers",
			want:  []Peer{b, a},
			steps: []string{"+filter a", "+filter b", "export a b", "+peer a 127.0.0.1", "+peer b 127.0.0.2"},
			plan:  "+peer 2",
		},
		{
			name:    "same peers: only the export assignment",
			current: []Peer{a, b},
			want:    []Peer{b, a},
			steps:   []string{"export a b"},
			plan:    "no changes",
		},
		{
			name:    "same peer with defaults spelt out",
			current: []Peer{a},
			want: []Peer{change(a, func(p *Peer) {
				p.Port = 179
				p.Families = []Family{IPv6Unicast, IPv4Unicast, IPv6Unicast}
			})},
			steps: []string{"export a"},
			plan:  "no changes",
		},
		{
			name:    "peer removed",
			current: []Peer{a, b, c},
			want:    []Peer{a, c},
			steps:   []string{"-peer b 127.0.0.2", "export a c", "-filter b", "export a c"},
			plan:    "-peer 1",
		},
		{
			name:    "every peer removed",
			current: []Peer{a, b},
			steps:   []string{"-peer a 127.0.0.1", "-peer b 127.0.0.2", "export ", "-filter a", "-filter b", "export "},
			plan:    "-peer 2",
		},
		{
			name:    "peer added",
			current: []Peer{a},
			want:    []Peer{a, c},
			steps:   []string{"+filter c", "export a c", "+peer c 127.0.0.3"},
			plan:    "+peer 1",
		},
		{
			name:    "peer changed: only it is reset",
			current: []Peer{a, b},
			want:    []Peer{a, change(b, func(p *Peer) { p.HoldTime = 9 * time.Second })},
			steps:   []string{"-peer b 127.0.0.2", "export a", "-filter b", "+filter b", "export a b", "+peer b 127.0.0.2"},
			plan:    "-peer 1, +peer 1",
		},
		{
			name:    "peer moved to another address",
			current: []Peer{a},
			want:    []Peer{change(a, func(p *Peer) { p.Address = netip.MustParseAddr("127.0.0.9") })},
			steps:   []string{"-peer a 127.0.0.1", "export ", "-filter a", "+filter a", "export a", "+peer a 127.0.0.9"},
			plan:    "-peer 1, +peer 1",
		},
		{
			name:    "peer renamed",
			current: []Peer{a},
			want:    []Peer{peer("z", "127.0.0.1")},
			steps:   []string{"-peer a 127.0.0.1", "export ", "-filter a", "+filter z", "export z", "+peer z 127.0.0.1"},
			plan:    "-peer 1, +peer 1",
		},
		{
			name:    "every field counts",
			current: []Peer{a, b, c},
			want: []Peer{
				change(a, func(p *Peer) { p.Password = "secret" }),
				change(b, func(p *Peer) { p.Families = []Family{IPv4Unicast} }),
				change(c, func(p *Peer) { p.GracefulRestart = true }),
			},
			steps: []string{"-peer a 127.0.0.1", "-peer b 127.0.0.2", "-peer c 127.0.0.3", "export ",
				"-filter a", "-filter b", "-filter c", "+filter a", "+filter b", "+filter c",
				"export a b c", "+peer a 127.0.0.1", "+peer b 127.0.0.2", "+peer c 127.0.0.3"},
			plan: "-peer 3, +peer 3",
		},
		{
			name:   "new peers start with their deny sets",
			want:   []Peer{a, b, c},
			routes: restricted,
			steps: []string{
				"+filter a 10.1.0.2/32 10.1.0.3/32",
				"+filter b 10.1.0.2/32 10.1.0.9/32 fd00:1::1/128",
				"+filter c 10.1.0.2/32 10.1.0.9/32 fd00:1::1/128",
				"export a b c", "+peer a 127.0.0.1", "+peer b 127.0.0.2", "+peer c 127.0.0.3"},
			plan: "+peer 3",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			current, err := normalizePeers(tc.current)
			if err != nil {
				t.Fatal(err)
			}
			want, err := normalizePeers(tc.want)
			if err != nil {
				t.Fatal(err)
			}
			routes, _ := testRoutes(t, tc.routes)
			plan := planPeers(current, want, routes)
			if got := plan.steps(); !slices.Equal(got, tc.steps) {
				t.Errorf("plan:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.steps, "\n  "))
			}
			if got := plan.String(); got != tc.plan {
				t.Errorf("String() = %q, want %q", got, tc.plan)
			}
			if plan.Empty() != (plan.Len() == 0) {
				t.Errorf("Empty() = %v with Len %d", plan.Empty(), plan.Len())
			}
			// Removals delete the configured neighbor; additions add
			// the wanted one.
			for _, old := range plan.remove {
				if old != current[old.Name] {
					t.Errorf("removes %+v, not the configured peer %+v", old, current[old.Name])
				}
			}
			for _, a := range plan.add {
				if a.peer != want[a.peer.Name] {
					t.Errorf("adds %+v, not the wanted peer %+v", a.peer, want[a.peer.Name])
				}
			}
			if len(current) != len(tc.current) || len(want) != len(tc.want) || len(routes) != len(tc.routes) {
				t.Error("planPeers changed its arguments")
			}
		})
	}
}

func TestPrefixLimitRestart(t *testing.T) {
	const base = time.Minute
	for _, tc := range []struct {
		name       string
		streak     int
		uptime     time.Duration
		base       time.Duration
		wait       time.Duration
		nextStreak int
	}{
		{"first shutdown", 0, time.Second, base, base, 1},
		{"second in a row doubles", 1, time.Second, base, 2 * base, 2},
		{"fifth in a row", 4, 0, base, 16 * base, 5},
		{"capped at 30 minutes", 5, 0, base, 30 * time.Minute, 6},
		{"stays capped", 40, 0, base, 30 * time.Minute, 41},
		{"up 29 minutes: still a streak", 2, 29 * time.Minute, base, 4 * base, 3},
		{"up 30 minutes: forgiven", 7, 30 * time.Minute, base, base, 1},
		{"short base doubles", 2, 0, 2 * time.Second, 8 * time.Second, 3},
		{"base above the cap is kept", 3, 0, time.Hour, time.Hour, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wait, streak := prefixLimitRestart(tc.streak, tc.uptime, tc.base)
			if wait != tc.wait || streak != tc.nextStreak {
				t.Errorf("prefixLimitRestart(%d, %s, %s) = %s, %d; want %s, %d",
					tc.streak, tc.uptime, tc.base, wait, streak, tc.wait, tc.nextStreak)
			}
		})
	}
}
