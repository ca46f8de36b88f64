package ipam

import (
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/labels"
)

func TestFamilyString(t *testing.T) {
	if IPv4.String() != "IPv4" || IPv6.String() != "IPv6" || Family(5).String() != "Family(5)" {
		t.Error("Family.String")
	}
}

func TestAllocateLowestReleaseReuse(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"10.0.0.0/30", "10.0.1.7-10.0.1.8"}, AutoAssign: true})
	want := []string{"10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.1.7", "10.0.1.8"}
	for i, ip := range want {
		mustAssign(t, a, v4(fmt.Sprint("ns/s", i)), "p", ip)
	}
	mustInUse(t, a, "p", 6, 0)
	mustFail(t, a, v4("ns/late"), ReasonExhausted, "ns/late", `pool "p"`, "6 of 6 in use")

	a.Release("ns/s1")
	a.Release("ns/s4")
	a.Release("ns/unknown") // no-op
	checkOK(t, a)
	mustInUse(t, a, "p", 4, 0)
	mustHolders(t, a, "10.0.0.1")
	if _, ok := a.Assigned("ns/s1"); ok {
		t.Fatal("released owner still assigned")
	}
	mustAssign(t, a, v4("ns/late"), "p", "10.0.0.1")
	mustAssign(t, a, v4("ns/later"), "p", "10.0.1.7")
	mustFail(t, a, v4("ns/last"), ReasonExhausted)
}

func TestAvoidBuggyIPs(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "buggy", Addresses: []string{"10.0.0.254-10.0.1.1", "10.0.2.0/24", "2001:db8::-2001:db8::1"}, AutoAssign: true, AvoidBuggyIPs: true},
		Pool{Name: "plain", Addresses: []string{"10.1.0.0/24"}, AvoidBuggyIPs: false},
	)
	s, _ := a.Stats("buggy")
	if s.IPv4.Capacity.Int64() != 2+254 || s.IPv6.Capacity.Int64() != 2 {
		t.Fatalf("buggy capacity %v/%v, want 256/2", s.IPv4.Capacity, s.IPv6.Capacity)
	}
	s, _ = a.Stats("plain")
	if s.IPv4.Capacity.Int64() != 256 {
		t.Fatalf("plain capacity %v", s.IPv4.Capacity)
	}
	mustAssign(t, a, v4("ns/a"), "buggy", "10.0.0.254")
	mustAssign(t, a, v4("ns/b"), "buggy", "10.0.1.1")
	mustAssign(t, a, v4("ns/c"), "buggy", "10.0.2.1")
	// IPv6 ::0 is fine: the rule is IPv4 only.
	mustAssign(t, a, Request{Owner: "ns/d", Families: []Family{IPv6}}, "buggy", "2001:db8::")
	for _, ip := range []string{"10.0.0.255", "10.0.1.0", "10.0.2.0", "10.0.2.255"} {
		r := v4("ns/x")
		r.IPs = addrs(ip)
		mustFail(t, a, r, ReasonNotInPool, ip, `pool "buggy"`, "avoids addresses ending in .0 and .255")
	}
	// Without avoidBuggyIPs .0 and .255 are ordinary addresses.
	mustAssign(t, a, Request{Owner: "ns/e", Pool: "plain"}, "plain", "10.1.0.0")
	r := v4("ns/f")
	r.IPs = addrs("10.1.0.255")
	mustAssign(t, a, r, "plain", "10.1.0.255")

	// Filling the /24 never hands out .0 or .255.
	for i := 2; i < 254; i++ {
		got, err := a.Assign(v4(fmt.Sprint("ns/fill", i)))
		if err != nil {
			t.Fatal(err)
		}
		if isBuggy(got.IPs[0]) {
			t.Fatalf("handed out %s", got.IPs[0])
		}
	}
	mustAssign(t, a, v4("ns/y"), "buggy", "10.0.2.254")
	mustFail(t, a, v4("ns/z"), ReasonExhausted)
	mustInUse(t, a, "buggy", 256, 1)
}

func TestAutoAssignFalse(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "manual", Addresses: []string{"10.0.0.0/30"}, AutoAssign: false, Priority: -10},
		Pool{Name: "auto", Addresses: []string{"10.1.0.0/30"}, AutoAssign: true},
	)
	mustAssign(t, a, v4("ns/a"), "auto", "10.1.0.0")
	r := v4("ns/b")
	r.Pool = "manual"
	mustAssign(t, a, r, "manual", "10.0.0.0")
	r = v4("ns/c")
	r.IPs = addrs("10.0.0.2")
	mustAssign(t, a, r, "manual", "10.0.0.2")

	only := newAlloc(t, Pool{Name: "manual", Addresses: []string{"10.0.0.0/30"}})
	mustFail(t, only, v4("ns/a"), ReasonNoPool, `pool "manual" has autoAssign disabled`)
}

// TestTerminatingPool: a Terminating pool keeps what its owners hold, and
// counts it, but serves no new request: automatic, explicit or by address.
func TestTerminatingPool(t *testing.T) {
	pools := []Pool{
		{Name: "going", Addresses: []string{"10.0.0.0/30"}, AutoAssign: true, Priority: -1},
		{Name: "staying", Addresses: []string{"10.1.0.0/30"}, AutoAssign: true},
	}
	a := newAlloc(t, pools...)
	mustAssign(t, a, v4("ns/a"), "going", "10.0.0.0")
	pools[0].Terminating = true
	if errs := a.SetPools(pools); errs != nil {
		t.Fatal(errs)
	}
	mustAssign(t, a, v4("ns/a"), "going", "10.0.0.0")
	if st, _ := a.Stats("going"); st.IPv4.InUse != 1 {
		t.Errorf("going: %d in use, want 1", st.IPv4.InUse)
	}
	mustAssign(t, a, v4("ns/b"), "staying", "10.1.0.0")
	r := v4("ns/c")
	r.Pool = "going"
	mustFail(t, a, r, ReasonNoPool, `pool "going" is being deleted`)
	r = v4("ns/c")
	r.IPs = addrs("10.0.0.1")
	mustFail(t, a, r, ReasonNoPool, `pool "going" is being deleted`)
}

func TestExplicitPool(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "first", Addresses: []string{"10.0.0.0/30"}, AutoAssign: true},
		Pool{Name: "second", Addresses: []string{"10.1.0.0/30"}, AutoAssign: true, Priority: 5},
	)
	r := v4("ns/a")
	r.Pool = "second"
	mustAssign(t, a, r, "second", "10.1.0.0")
	r.Pool = "nope"
	mustFail(t, a, r, ReasonUnknownPool, `pool "nope" does not exist`)
	r = v4("ns/b")
	r.Pool = "second"
	r.Families = []Family{IPv6}
	mustFail(t, a, r, ReasonNoPool, `pool "second" has no IPv6 addresses`)
}

func TestPriorityOrder(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "b", Addresses: []string{"10.0.2.0/31"}, AutoAssign: true, Priority: 1},
		Pool{Name: "a", Addresses: []string{"10.0.1.0/31"}, AutoAssign: true, Priority: 1},
		Pool{Name: "c", Addresses: []string{"10.0.3.0/31"}, AutoAssign: true, Priority: 0},
	)
	for i, want := range []struct{ pool, ip string }{
		{"c", "10.0.3.0"}, {"c", "10.0.3.1"}, {"a", "10.0.1.0"}, {"a", "10.0.1.1"}, {"b", "10.0.2.0"}, {"b", "10.0.2.1"},
	} {
		mustAssign(t, a, v4(fmt.Sprint("ns/s", i)), want.pool, want.ip)
	}
	mustFail(t, a, v4("ns/x"), ReasonExhausted, `pool "c"`, `pool "a"`, `pool "b"`)
	a.Release("ns/s0")
	mustAssign(t, a, v4("ns/x"), "c", "10.0.3.0")
}

func TestNamespacesAndSelectors(t *testing.T) {
	prodSel, err := labels.Parse("env=prod")
	if err != nil {
		t.Fatal(err)
	}
	webSel, err := labels.Parse("app in (web)")
	if err != nil {
		t.Fatal(err)
	}
	a := newAlloc(t,
		Pool{Name: "ns-only", Addresses: []string{"10.0.1.0/30"}, AutoAssign: true, Namespaces: []string{"team-a", "team-b"}},
		Pool{Name: "prod-only", Addresses: []string{"10.0.2.0/30"}, AutoAssign: true, Priority: 1, NamespaceSelectors: []labels.Selector{prodSel}},
		Pool{Name: "web-only", Addresses: []string{"10.0.3.0/30"}, AutoAssign: true, Priority: 2, ServiceSelectors: []labels.Selector{webSel}},
		Pool{Name: "any", Addresses: []string{"10.0.4.0/30"}, AutoAssign: true, Priority: 3},
	)
	tests := []struct {
		name     string
		req      Request
		pool, ip string
		reason   Reason
		frag     string
	}{
		{name: "namespace listed", req: Request{Owner: "team-b/s", Namespace: "team-b"}, pool: "ns-only", ip: "10.0.1.0"},
		{name: "namespace selector", req: Request{Owner: "x/s", Namespace: "x", NamespaceLabels: map[string]string{"env": "prod"}}, pool: "prod-only", ip: "10.0.2.0"},
		{name: "service selector", req: Request{Owner: "y/s", Namespace: "y", ServiceLabels: map[string]string{"app": "web"}}, pool: "web-only", ip: "10.0.3.0"},
		{name: "nothing matches restrictions", req: Request{Owner: "z/s", Namespace: "z", NamespaceLabels: map[string]string{"env": "dev"}}, pool: "any", ip: "10.0.4.0"},
		{name: "explicit pool of other namespaces", req: Request{Owner: "z/t", Namespace: "z", Pool: "ns-only"}, reason: ReasonNoPool,
			frag: `pool "ns-only" only serves namespaces team-a, team-b, not "z"`},
		{name: "explicit pool namespace selector", req: Request{Owner: "z/t", Namespace: "z", Pool: "prod-only", NamespaceLabels: map[string]string{"env": "dev"}}, reason: ReasonNoPool,
			frag: `pool "prod-only" only serves namespaces labelled "env=prod", not "z"`},
		{name: "explicit pool service selector", req: Request{Owner: "z/t", Namespace: "z", Pool: "web-only"}, reason: ReasonNoPool,
			frag: `pool "web-only" only serves Services labelled "app in (web)", which this Service's labels do not match`},
		{name: "requested IP in refusing pool", req: Request{Owner: "z/t", Namespace: "z", IPs: addrs("10.0.1.3")}, reason: ReasonNoPool,
			frag: `requested address 10.0.1.3 is in pool "ns-only", but pool "ns-only" only serves namespaces`},
		{name: "explicit pool allowed", req: Request{Owner: "team-a/s", Namespace: "team-a", Pool: "any"}, pool: "any", ip: "10.0.4.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.reason != "" {
				mustFail(t, a, tt.req, tt.reason, tt.frag)
				return
			}
			mustAssign(t, a, tt.req, tt.pool, tt.ip)
		})
	}

	only := newAlloc(t, Pool{Name: "ns-only", Addresses: []string{"10.0.1.0/30"}, AutoAssign: true, Namespaces: []string{"team-a"}})
	mustFail(t, only, Request{Owner: "z/s", Namespace: "z"}, ReasonNoPool, `no pool can serve IPv4 automatically`, `only serves namespaces team-a, not "z"`)
	mustFail(t, New(), Request{Owner: "z/s", Namespace: "z"}, ReasonNoPool, `no pools are configured`)
}

// TestSelectorLists checks how the namespace constraints (Namespaces,
// NamespaceSelector, NamespaceSelectors) and the Service constraints
// (ServiceSelector, ServiceSelectors) combine: any one match within a group,
// both groups required.
func TestSelectorLists(t *testing.T) {
	sel := func(s string) labels.Selector {
		t.Helper()
		x, err := labels.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	a := newAlloc(t, Pool{
		Name: "p", Addresses: []string{"10.0.0.0/24"}, AutoAssign: true,
		Namespaces:         []string{"a"},
		NamespaceSelectors: []labels.Selector{sel("env=prod"), nil, sel("tier=gold")},
		ServiceSelectors:   []labels.Selector{sel("app=web"), sel("app=api"), nil},
	})
	web := map[string]string{"app": "web"}
	tests := []struct {
		name     string
		ns       string
		nsLabels map[string]string
		svc      map[string]string
		ok       bool
		frag     string
	}{
		{"listed namespace", "a", nil, web, true, ""},
		{"namespace selector", "b", map[string]string{"env": "prod"}, web, true, ""},
		{"namespace selectors", "c", map[string]string{"tier": "gold"}, map[string]string{"app": "api"}, true, ""},
		{"no namespace match", "d", map[string]string{"env": "dev"}, web, false,
			`pool "p" only serves namespaces a or labelled "env=prod" or "tier=gold", not "d"`},
		{"no service match", "a", nil, map[string]string{"app": "db"}, false,
			`pool "p" only serves Services labelled "app=web" or "app=api", which this Service's labels do not match`},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := Request{Owner: fmt.Sprintf("%s/s%d", tt.ns, i), Namespace: tt.ns, NamespaceLabels: tt.nsLabels, ServiceLabels: tt.svc}
			if tt.ok {
				mustAssign(t, a, req, "p", fmt.Sprintf("10.0.0.%d", i))
				return
			}
			mustFail(t, a, req, ReasonNoPool, tt.frag)
			req.Pool = "p"
			mustFail(t, a, req, ReasonNoPool, tt.frag)
		})
	}
}

func TestDualStack(t *testing.T) {
	dual := Pool{Name: "dual", Addresses: []string{"10.0.0.0/31", "2001:db8::/127"}, AutoAssign: true, Priority: 1}
	v4only := Pool{Name: "v4only", Addresses: []string{"10.9.0.0/30"}, AutoAssign: true}
	both := []Family{IPv4, IPv6}
	sixFirst := []Family{IPv6, IPv4}
	tests := []struct {
		name     string
		pools    []Pool
		req      Request
		pool     string
		ips      []string
		reason   Reason
		fragment string
	}{
		{name: "single v4", pools: []Pool{dual}, req: Request{Owner: "n/s", Families: []Family{IPv4}}, pool: "dual", ips: []string{"10.0.0.0"}},
		{name: "single v6", pools: []Pool{dual}, req: Request{Owner: "n/s", Families: []Family{IPv6}}, pool: "dual", ips: []string{"2001:db8::"}},
		{name: "default family is v4", pools: []Pool{dual}, req: Request{Owner: "n/s"}, pool: "dual", ips: []string{"10.0.0.0"}},
		{name: "prefer both", pools: []Pool{dual}, req: Request{Owner: "n/s", Families: both}, pool: "dual", ips: []string{"10.0.0.0", "2001:db8::"}},
		{name: "require both", pools: []Pool{dual}, req: Request{Owner: "n/s", Families: both, RequireAllFamilies: true}, pool: "dual", ips: []string{"10.0.0.0", "2001:db8::"}},
		{name: "v6 first", pools: []Pool{dual}, req: Request{Owner: "n/s", Families: sixFirst, RequireAllFamilies: true}, pool: "dual", ips: []string{"2001:db8::", "10.0.0.0"}},
		{name: "prefer falls back to single family pool", pools: []Pool{v4only, dual}, req: Request{Owner: "n/s", Families: both}, pool: "v4only", ips: []string{"10.9.0.0"}},
		{name: "require skips single family pool", pools: []Pool{v4only, dual}, req: Request{Owner: "n/s", Families: both, RequireAllFamilies: true}, pool: "dual", ips: []string{"10.0.0.0", "2001:db8::"}},
		{name: "prefer v6 first skips pool without v6", pools: []Pool{v4only, dual}, req: Request{Owner: "n/s", Families: sixFirst}, pool: "dual", ips: []string{"2001:db8::", "10.0.0.0"}},
		{name: "require without dual pool", pools: []Pool{v4only}, req: Request{Owner: "n/s", Families: both, RequireAllFamilies: true}, reason: ReasonNoPool, fragment: `pool "v4only" has no IPv6 addresses (RequireDualStack)`},
		{name: "prefer v6 first without v6", pools: []Pool{v4only}, req: Request{Owner: "n/s", Families: sixFirst}, reason: ReasonNoPool, fragment: `pool "v4only" has no IPv6 addresses`},
		{name: "requested pair", pools: []Pool{dual}, req: Request{Owner: "n/s", Families: sixFirst, IPs: addrs("10.0.0.1", "2001:db8::1")}, pool: "dual", ips: []string{"2001:db8::1", "10.0.0.1"}},
		{name: "require needs both requested", pools: []Pool{dual}, req: Request{Owner: "n/s", Families: both, RequireAllFamilies: true, IPs: addrs("10.0.0.1")}, reason: ReasonInvalid, fragment: "no IPv6 address is requested"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAlloc(t, tt.pools...)
			if tt.reason != "" {
				mustFail(t, a, tt.req, tt.reason, tt.fragment)
				return
			}
			mustAssign(t, a, tt.req, tt.pool, tt.ips...)
		})
	}
}

func TestDualStackExhaustion(t *testing.T) {
	a := newAlloc(t, Pool{Name: "dual", Addresses: []string{"10.0.0.0/30", "2001:db8::/128"}, AutoAssign: true})
	both := []Family{IPv4, IPv6}
	mustAssign(t, a, Request{Owner: "n/a", Families: both}, "dual", "10.0.0.0", "2001:db8::")
	// Prefer: v6 exhausted, v4 alone is served.
	mustAssign(t, a, Request{Owner: "n/b", Families: both}, "dual", "10.0.0.1")
	// Require: fails and names both families.
	mustFail(t, a, Request{Owner: "n/c", Families: both, RequireAllFamilies: true}, ReasonExhausted, "IPv4+IPv6", "IPv6 1 of 1 in use")
	// v6 frees up: the PreferDualStack owner gets it added, keeping its v4.
	a.Release("n/a")
	mustAssign(t, a, Request{Owner: "n/b", Families: both}, "dual", "10.0.0.1", "2001:db8::")
	// Narrowing to single-stack drops the v6 and keeps the v4.
	mustAssign(t, a, Request{Owner: "n/b", Families: []Family{IPv4}}, "dual", "10.0.0.1")
	mustHolders(t, a, "2001:db8::")
	// Widening to RequireDualStack keeps the v4 too.
	mustAssign(t, a, Request{Owner: "n/b", Families: both, RequireAllFamilies: true}, "dual", "10.0.0.1", "2001:db8::")
	// Switching to v6 single-stack keeps the v6.
	mustAssign(t, a, Request{Owner: "n/b", Families: []Family{IPv6}}, "dual", "2001:db8::")
	mustInUse(t, a, "dual", 0, 1)
}

func TestRequestedIPs(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "p", Addresses: []string{"10.0.0.0/29"}, AutoAssign: true},
		Pool{Name: "q", Addresses: []string{"10.0.1.0/29", "2001:db8::/120"}, AutoAssign: true},
	)
	r := v4("ns/a")
	r.IPs = addrs("10.0.0.5")
	mustAssign(t, a, r, "p", "10.0.0.5")
	// Automatic allocation skips the requested address.
	for _, want := range []string{"10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.6"} {
		mustAssign(t, a, v4("ns/auto"+want), "p", want)
	}

	tests := []struct {
		name   string
		req    Request
		reason Reason
		frags  []string
	}{
		{"in use", Request{Owner: "ns/b", IPs: addrs("10.0.0.5")}, ReasonInUse, []string{"10.0.0.5 is already in use by ns/a"}},
		{"in use with key", Request{Owner: "ns/b", IPs: addrs("10.0.0.5"), SharingKey: "k"}, ReasonInUse, []string{"ns/a", "set the same sharing key"}},
		{"outside pools", Request{Owner: "ns/b", IPs: addrs("192.0.2.1")}, ReasonNotInPool, []string{"192.0.2.1 is not in any pool"}},
		{"outside explicit pool", Request{Owner: "ns/b", Pool: "q", IPs: addrs("10.0.0.7")}, ReasonNotInPool, []string{`10.0.0.7 is in pool "p", not in the requested pool "q"`}},
		{"outside explicit pool and all pools", Request{Owner: "ns/b", Pool: "q", IPs: addrs("192.0.2.1")}, ReasonNotInPool, []string{`192.0.2.1 is not in pool "q"`}},
		{"two of a family", Request{Owner: "ns/b", IPs: addrs("10.0.1.1", "10.0.1.2")}, ReasonInvalid, []string{"two IPv4 addresses (10.0.1.1 and 10.0.1.2)"}},
		{"zone", Request{Owner: "ns/b", IPs: []netip.Addr{netip.MustParseAddr("2001:db8::1%eth0")}}, ReasonInvalid, []string{"has a zone"}},
		{"invalid", Request{Owner: "ns/b", IPs: []netip.Addr{{}}}, ReasonInvalid, []string{"empty or invalid"}},
		{"no owner", Request{IPs: addrs("10.0.1.1")}, ReasonInvalid, []string{"no owner"}},
		{"family twice", Request{Owner: "ns/b", Families: []Family{IPv4, IPv4}}, ReasonInvalid, []string{"IPv4 is listed twice"}},
		{"bad family", Request{Owner: "ns/b", Families: []Family{5}}, ReasonInvalid, []string{"unknown address family 5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { mustFail(t, a, tt.req, tt.reason, tt.frags...) })
	}

	// An IPv4-mapped IPv6 address is the IPv4 address.
	r = v4("ns/m")
	r.IPs = addrs("::ffff:10.0.1.3")
	mustAssign(t, a, r, "q", "10.0.1.3")
	mustHolders(t, a, "::ffff:10.0.1.3", "ns/m")
	// Dual-stack request across pools is allowed for requested addresses.
	r = Request{Owner: "ns/d", Families: []Family{IPv4, IPv6}, IPs: addrs("2001:db8::7", "10.0.0.7")}
	mustAssign(t, a, r, "p", "10.0.0.7", "2001:db8::7")
}

func TestIdempotentAssign(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "low", Addresses: []string{"10.0.0.0/31"}, AutoAssign: true, Priority: 1},
		Pool{Name: "high", Addresses: []string{"10.1.0.0/31"}, AutoAssign: true},
	)
	mustAssign(t, a, v4("ns/a"), "high", "10.1.0.0")
	mustAssign(t, a, v4("ns/b"), "high", "10.1.0.1")
	mustAssign(t, a, v4("ns/c"), "low", "10.0.0.0")
	a.Release("ns/a")
	// ns/c stays in "low" though "high" has room now.
	for range 3 {
		mustAssign(t, a, v4("ns/c"), "low", "10.0.0.0")
	}
	// Naming the pool it is in, or its address, changes nothing.
	r := v4("ns/c")
	r.Pool = "low"
	mustAssign(t, a, r, "low", "10.0.0.0")
	r.IPs = addrs("10.0.0.0")
	mustAssign(t, a, r, "low", "10.0.0.0")
	// A held address in a pool that is now non-auto is kept as well.
	if errs := a.SetPools([]Pool{
		{Name: "low", Addresses: []string{"10.0.0.0/31"}, Priority: 1},
		{Name: "high", Addresses: []string{"10.1.0.0/31"}, AutoAssign: true},
	}); errs != nil {
		t.Fatal(errs)
	}
	mustAssign(t, a, v4("ns/c"), "low", "10.0.0.0")
}

func TestAssignMovesAtomically(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "p1", Addresses: []string{"10.0.1.0/30"}, AutoAssign: true},
		Pool{Name: "p2", Addresses: []string{"10.0.2.0/30", "2001:db8::/126"}, AutoAssign: true, Priority: 1},
		Pool{Name: "full", Addresses: []string{"10.0.3.0/32"}, Priority: 2},
	)
	mustAssign(t, a, Request{Owner: "ns/hog", Pool: "full"}, "full", "10.0.3.0")
	mustAssign(t, a, v4("ns/a"), "p1", "10.0.1.0")

	// Moving to another pool: new first, old released.
	r := v4("ns/a")
	r.Pool = "p2"
	mustAssign(t, a, r, "p2", "10.0.2.0")
	mustHolders(t, a, "10.0.1.0")
	mustInUse(t, a, "p1", 0, 0)

	// Failures leave the assignment as it was.
	r.Pool = "full"
	mustFail(t, a, r, ReasonExhausted, `pool "full"`)
	r.Pool = "missing"
	mustFail(t, a, r, ReasonUnknownPool)
	r = v4("ns/a")
	r.IPs = addrs("10.0.3.0")
	mustFail(t, a, r, ReasonInUse, "ns/hog")
	r.IPs = addrs("192.0.2.1")
	mustFail(t, a, r, ReasonNotInPool)
	mustFail(t, a, Request{Owner: "ns/a", Families: []Family{IPv6}, Pool: "p1"}, ReasonNoPool)
	if got, _ := a.Assigned("ns/a"); got.Pool != "p2" || !slices.Equal(got.IPs, addrs("10.0.2.0")) {
		t.Fatalf("assignment changed: %v", got)
	}

	// Requested address: moves to exactly it.
	r.IPs = addrs("10.0.1.3")
	mustAssign(t, a, r, "p1", "10.0.1.3")
	mustHolders(t, a, "10.0.2.0")
	// Dropping the request keeps the address (it is still compatible).
	mustAssign(t, a, v4("ns/a"), "p1", "10.0.1.3")
	// Family change: v4 single-stack to v6 single-stack.
	mustAssign(t, a, Request{Owner: "ns/a", Families: []Family{IPv6}}, "p2", "2001:db8::")
	mustInUse(t, a, "p1", 0, 0)
}

func TestExhaustionThenRelease(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"2001:db8::/126"}, AutoAssign: true})
	r := func(o string) Request { return Request{Owner: o, Families: []Family{IPv6}} }
	for i := range 4 {
		mustAssign(t, a, r(fmt.Sprint("n/", i)), "p", fmt.Sprint("2001:db8::", i))
	}
	mustFail(t, a, r("n/x"), ReasonExhausted, "IPv6 4 of 4 in use")
	a.Release("n/2")
	mustAssign(t, a, r("n/x"), "p", "2001:db8::2")
	mustInUse(t, a, "p", 0, 4)
}

func TestSetPoolsErrors(t *testing.T) {
	a := New()
	errs := a.SetPools([]Pool{
		{Name: "blue", Addresses: []string{"10.0.0.0/24", "10.0.0.9-10.0.0.1"}},
		{Name: "red", Addresses: []string{"10.1.0.0/24", "10.2.0.0/24"}},
		{Name: "green", Addresses: []string{"10.3.0.0/24", "10.2.0.128/25"}},
		{Name: "red", Addresses: []string{"10.9.0.0/24"}},
		{Name: "empty"},
		{Name: "", Addresses: []string{"10.8.0.0/24"}},
		{Name: "self", Addresses: []string{"10.7.0.0/24", "10.7.0.0/25"}},
		{Name: "ok", Addresses: []string{"10.0.0.0/24"}},
	})
	want := map[string]struct {
		reason Reason
		msg    string
	}{
		"blue":  {ReasonInvalid, `pool "blue": addresses[1] "10.0.0.9-10.0.0.1": range start is after its end; write the lower address first`},
		"green": {ReasonOverlap, `pool "green": addresses[1] "10.2.0.128/25" overlaps pool "red" addresses[1] "10.2.0.0/24"; pools must not overlap, shrink or remove one of the entries`},
		"red":   {ReasonInvalid, `pool "red" is defined more than once`},
		"empty": {ReasonInvalid, `pool "empty" has no addresses`},
		"":      {ReasonInvalid, `a pool has no name`},
		"self":  {ReasonOverlap, `pool "self": addresses[0] "10.7.0.0/24" overlaps addresses[1] "10.7.0.0/25"`},
	}
	if len(errs) != len(want) {
		t.Fatalf("errors %v, want %d", errs, len(want))
	}
	for name, w := range want {
		checkErr(t, errs[name], w.reason, w.msg)
	}
	// Accepted pools are installed, rejected ones not; "ok" reuses blue's
	// addresses since blue was rejected.
	for name, installed := range map[string]bool{"red": true, "ok": true, "blue": false, "green": false, "self": false, "empty": false} {
		if _, ok := a.Stats(name); ok != installed {
			t.Errorf("pool %q installed = %v", name, ok)
		}
	}
	if errs := a.SetPools([]Pool{{Name: "a", Addresses: []string{"10.0.0.0/24"}}}); errs != nil {
		t.Fatalf("valid config gave %v", errs)
	}
}

func TestStats(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"10.0.0.0/24", "10.0.1.0-10.0.1.9", "2001:db8::/64", "2001:db9::/48"}, AutoAssign: true})
	s, ok := a.Stats("p")
	if !ok {
		t.Fatal("no stats")
	}
	want6 := new(big.Int).Add(new(big.Int).Lsh(big.NewInt(1), 64), new(big.Int).Lsh(big.NewInt(1), 80))
	if s.IPv4.Capacity.Int64() != 266 || s.IPv6.Capacity.Cmp(want6) != 0 {
		t.Fatalf("capacity %v/%v", s.IPv4.Capacity, s.IPv6.Capacity)
	}
	s.IPv4.Capacity.SetInt64(0) // a copy: must not affect the allocator
	if s, _ := a.Stats("p"); s.IPv4.Capacity.Int64() != 266 {
		t.Fatal("Stats returned shared big.Int")
	}
	if _, ok := a.Stats("nope"); ok {
		t.Fatal("stats for unknown pool")
	}
}

// TestConcurrentUse exercises the mutex (run with -race to check it).
func TestConcurrentUse(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"10.0.0.0/20", "2001:db8::/64"}, AutoAssign: true})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				o := fmt.Sprintf("g%d/s%d", g, i%20)
				if i%3 == 2 {
					a.Release(o)
					continue
				}
				if _, err := a.Assign(Request{Owner: o, Families: []Family{IPv4, IPv6}}); err != nil {
					t.Error(err)
					return
				}
				a.Stats("p")
				a.Holders(netip.MustParseAddr("10.0.0.1"))
			}
		}()
	}
	wg.Wait()
	checkOK(t, a)
}
