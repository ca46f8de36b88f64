package ipam

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func shareReq(owner, key string, ports ...Port) Request {
	return Request{Owner: owner, Namespace: "ns", Families: []Family{IPv4}, SharingKey: key, Ports: ports}
}

func tcp(p int32) Port { return Port{Protocol: "TCP", Port: p} }
func udp(p int32) Port { return Port{Protocol: "UDP", Port: p} }

func TestSharing(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"10.0.0.0/29"}, AutoAssign: true})
	mustAssign(t, a, shareReq("ns/a", "k", tcp(80)), "p", "10.0.0.0")
	mustAssign(t, a, shareReq("ns/c", "", tcp(443)), "p", "10.0.0.1")
	// Same key, disjoint ports: the used address is preferred over a fresh one.
	mustAssign(t, a, shareReq("ns/b", "k", tcp(443)), "p", "10.0.0.0")
	mustHolders(t, a, "10.0.0.0", "ns/a", "ns/b")
	mustInUse(t, a, "p", 2, 0) // distinct addresses
	// Same key, clashing port: a fresh address.
	mustAssign(t, a, shareReq("ns/d", "k", tcp(80)), "p", "10.0.0.2")
	// Same port number, other protocol: no clash; the lowest shareable wins.
	mustAssign(t, a, shareReq("ns/e", "k", udp(80)), "p", "10.0.0.0")
	mustHolders(t, a, "10.0.0.0", "ns/a", "ns/b", "ns/e")

	tests := []struct {
		name   string
		req    Request
		reason Reason
		frags  []string
	}{
		{"requested with port clash", withIPs(shareReq("ns/f", "k", tcp(80)), "10.0.0.0"), ReasonPortClash,
			[]string{"ns/f: cannot share address 10.0.0.0 with ns/a under sharing key \"k\": both use port TCP/80"}},
		{"requested without key", withIPs(shareReq("ns/f", "", tcp(81)), "10.0.0.0"), ReasonInUse, []string{"in use by ns/a"}},
		{"requested with other key", withIPs(shareReq("ns/f", "other", tcp(81)), "10.0.0.0"), ReasonInUse, []string{"in use by ns/a", `sharing keys differ ("other" vs "k")`}},
		{"requested keyless owner's address", withIPs(shareReq("ns/f", "k", tcp(81)), "10.0.0.1"), ReasonInUse, []string{"in use by ns/c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { mustFail(t, a, tt.req, tt.reason, tt.frags...) })
	}

	// A sharer whose ports now clash moves to a fresh address.
	mustAssign(t, a, shareReq("ns/b", "k", tcp(80)), "p", "10.0.0.3")
	mustHolders(t, a, "10.0.0.0", "ns/a", "ns/e")
	// ... but not when it asks for the clashing address.
	mustFail(t, a, withIPs(shareReq("ns/b", "k", udp(80)), "10.0.0.0"), ReasonPortClash, "ns/e", "UDP/80")
	// A sharer changing its key moves away too.
	mustAssign(t, a, shareReq("ns/e", "k2", udp(80)), "p", "10.0.0.4")
	mustHolders(t, a, "10.0.0.0", "ns/a")
	// A sole holder may change its key in place.
	mustAssign(t, a, shareReq("ns/e", "k3", udp(80)), "p", "10.0.0.4")

	// Releasing a sharer keeps the address with the others.
	mustAssign(t, a, shareReq("ns/g", "k", tcp(22)), "p", "10.0.0.0")
	a.Release("ns/a")
	mustHolders(t, a, "10.0.0.0", "ns/g")
	a.Release("ns/g")
	mustHolders(t, a, "10.0.0.0")
	mustAssign(t, a, shareReq("ns/h", "", tcp(1)), "p", "10.0.0.0")
	checkOK(t, a)
}

func withIPs(r Request, ips ...string) Request {
	r.IPs = addrs(ips...)
	return r
}

func TestSharingLocalTrafficPolicy(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"10.0.0.0/29"}, AutoAssign: true})
	local := func(owner, sel string, local bool, port int32) Request {
		r := shareReq(owner, "k", tcp(port))
		r.LocalTrafficPolicy = local
		r.PodSelector = sel
		return r
	}
	mustAssign(t, a, local("ns/a", "app=x", true, 1), "p", "10.0.0.0")
	// Local with the same selector: shares.
	mustAssign(t, a, local("ns/c", "app=x", true, 3), "p", "10.0.0.0")
	// Different selector while a sharer is Local: a fresh address...
	mustAssign(t, a, local("ns/d", "app=y", false, 4), "p", "10.0.0.1")
	// ... or an error naming the sharer when the address is requested.
	r := withIPs(local("ns/e", "app=y", true, 5), "10.0.0.0")
	mustFail(t, a, r, ReasonPortClash, "ns/a", "externalTrafficPolicy Local", `("app=y" vs "app=x")`)
	// Cluster sharers may have different selectors.
	mustAssign(t, a, local("ns/f", "app=z", false, 6), "p", "10.0.0.1")
	mustHolders(t, a, "10.0.0.1", "ns/d", "ns/f")
	// A Local newcomer must match every sharer.
	r = withIPs(local("ns/g", "app=y", true, 7), "10.0.0.1")
	mustFail(t, a, r, ReasonPolicyClash, "ns/d")
}

// TestSharingTrafficPolicyMix: a Cluster Service is announced from every
// node, so sharing a VIP with a Local one would draw the Local Service's
// traffic to nodes without its endpoints. Such sharers never meet.
func TestSharingTrafficPolicyMix(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"10.0.0.0/29"}, AutoAssign: true})
	req := func(owner string, local bool, port int32) Request {
		r := shareReq(owner, "k", tcp(port))
		r.LocalTrafficPolicy, r.PodSelector = local, "app=x"
		return r
	}
	mustAssign(t, a, req("ns/cluster", false, 1), "p", "10.0.0.0")
	// Same key, same selector, other policy: a fresh address, not the shared one.
	mustAssign(t, a, req("ns/local", true, 2), "p", "10.0.0.1")
	// Asking for the other's address is refused, naming it, the policies and the fix.
	mustFail(t, a, withIPs(req("ns/local2", true, 3), "10.0.0.0"), ReasonPolicyClash,
		`ns/local2: cannot share address 10.0.0.0 with ns/cluster under sharing key "k"`,
		"ns/local2 has externalTrafficPolicy Local and ns/cluster has Cluster",
		"give both the same externalTrafficPolicy")
	mustFail(t, a, withIPs(req("ns/cluster2", false, 3), "10.0.0.1"), ReasonPolicyClash,
		"ns/cluster2 has externalTrafficPolicy Cluster and ns/local has Local")
	// A sharer switching its policy leaves the other's VIP alone: it moves.
	mustAssign(t, a, req("ns/local3", true, 4), "p", "10.0.0.1")
	mustAssign(t, a, req("ns/local3", false, 4), "p", "10.0.0.0")
	mustHolders(t, a, "10.0.0.0", "ns/cluster", "ns/local3")
	mustHolders(t, a, "10.0.0.1", "ns/local")
	// ... and fails when it asks for its address, giving it up to the
	// Service that did not change.
	mustAssign(t, a, withIPs(req("ns/local4", true, 5), "10.0.0.1"), "p", "10.0.0.1")
	mustFailDropping(t, a, withIPs(req("ns/local4", false, 5), "10.0.0.1"), ReasonPolicyClash, "ns/local")
	mustHolders(t, a, "10.0.0.1", "ns/local")
	checkOK(t, a)
}

// TestRestoreLegacyShare: Services that shared a VIP under the rules of an
// older vipcast (a Local and a Cluster Service) keep it across restore and
// every later Assign, but nobody may join them the old way.
func TestRestoreLegacyShare(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"10.0.0.0/29"}, AutoAssign: true})
	req := func(owner string, local bool, port int32) Request {
		r := shareReq(owner, "k", tcp(port))
		r.LocalTrafficPolicy, r.PodSelector = local, "app=x"
		return r
	}
	if err := a.Restore(req("ns/cluster", false, 1), addrs("10.0.0.0")); err != nil {
		t.Fatal(err)
	}
	if err := a.Restore(req("ns/local", true, 2), addrs("10.0.0.0")); err != nil {
		t.Fatalf("restoring a share made under the old rules: %v", err)
	}
	mustHolders(t, a, "10.0.0.0", "ns/cluster", "ns/local")
	if why := a.LegacyShare("ns/local"); !strings.Contains(why, "ns/cluster") || !strings.Contains(why, "externalTrafficPolicy") {
		t.Fatalf("LegacyShare(ns/local) = %q, want the rule it breaks, naming ns/cluster", why)
	}
	// Restore never renumbers: both keep it, with or without asking for it.
	mustAssign(t, a, req("ns/local", true, 2), "p", "10.0.0.0")
	mustAssign(t, a, withIPs(req("ns/cluster", false, 1), "10.0.0.0"), "p", "10.0.0.0")
	// Old rules still bind them: a port clash moves the one that changed.
	if err := a.Restore(req("ns/clash", false, 1), addrs("10.0.0.0")); ReasonOf(err) != ReasonPortClash {
		t.Fatalf("Restore with a clashing port: %v, want %s", err, ReasonPortClash)
	}
	// Newcomers follow today's rules, against every holder.
	mustFail(t, a, withIPs(req("ns/new", false, 3), "10.0.0.0"), ReasonPolicyClash, "ns/local")
	mustFail(t, a, withIPs(req("ns/new", true, 3), "10.0.0.0"), ReasonPolicyClash, "ns/cluster")
	mustAssign(t, a, req("ns/new", true, 3), "p", "10.0.0.1")
	// Once the exception is gone, it stays gone.
	a.Release("ns/cluster")
	if why := a.LegacyShare("ns/local"); why != "" {
		t.Fatalf("LegacyShare after the other left = %q", why)
	}
	mustFail(t, a, withIPs(req("ns/cluster", false, 1), "10.0.0.0"), ReasonPolicyClash, "ns/local")
	checkOK(t, a)
}

func TestSharingPreferenceAcrossPools(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "p1", Addresses: []string{"10.0.1.0/29"}, AutoAssign: true},
		Pool{Name: "p2", Addresses: []string{"10.0.2.0/29", "2001:db8::/125"}, AutoAssign: true, Priority: 1},
		Pool{Name: "hidden", Addresses: []string{"10.0.3.0/29"}, Priority: 2},
	)
	r := shareReq("ns/a", "k", tcp(80))
	r.Pool = "p2"
	mustAssign(t, a, r, "p2", "10.0.2.0")
	// The shareable address in p2 beats a fresh one in p1.
	mustAssign(t, a, shareReq("ns/b", "k", tcp(443)), "p2", "10.0.2.0")
	// Not in an eligible pool (hidden is not auto-assign): not preferred.
	r = shareReq("ns/c", "j", tcp(80))
	r.Pool = "hidden"
	mustAssign(t, a, r, "hidden", "10.0.3.0")
	mustAssign(t, a, shareReq("ns/d", "j", tcp(443)), "p1", "10.0.1.0")
	// An explicit pool limits the search to that pool.
	r = shareReq("ns/e", "k", tcp(22))
	r.Pool = "p1"
	mustAssign(t, a, r, "p1", "10.0.1.1")

	// Dual-stack sharers share both addresses.
	both := []Family{IPv4, IPv6}
	x := Request{Owner: "ns/x", Families: both, SharingKey: "dual", Ports: []Port{tcp(80)}, Pool: "p2"}
	mustAssign(t, a, x, "p2", "10.0.2.1", "2001:db8::")
	y := Request{Owner: "ns/y", Families: both, SharingKey: "dual", Ports: []Port{tcp(443)}, RequireAllFamilies: true}
	mustAssign(t, a, y, "p2", "10.0.2.1", "2001:db8::")
	mustHolders(t, a, "2001:db8::", "ns/x", "ns/y")
	checkOK(t, a)
}

func TestOrphans(t *testing.T) {
	wide := Pool{Name: "p", Addresses: []string{"10.0.0.0/29"}, AutoAssign: true}
	narrow := Pool{Name: "p", Addresses: []string{"10.0.0.0/31"}, AutoAssign: true}
	a := newAlloc(t, wide)
	mustAssign(t, a, v4("ns/a"), "p", "10.0.0.0")
	mustAssign(t, a, v4("ns/b"), "p", "10.0.0.1")
	mustAssign(t, a, withIPs(v4("ns/d"), "10.0.0.5"), "p", "10.0.0.5")

	// Shrinking the pool orphans 10.0.0.5; its owner keeps it.
	if errs := a.SetPools([]Pool{narrow}); errs != nil {
		t.Fatal(errs)
	}
	checkOK(t, a)
	mustInUse(t, a, "p", 2, 0)
	if got, _ := a.Assigned("ns/d"); got.Pool != "" || len(got.IPs) != 1 || got.IPs[0].String() != "10.0.0.5" {
		t.Fatalf("orphan assignment %v", got)
	}
	mustAssign(t, a, v4("ns/d"), "", "10.0.0.5")
	mustAssign(t, a, withIPs(v4("ns/d"), "10.0.0.5"), "", "10.0.0.5")
	mustFail(t, a, withIPs(v4("ns/e"), "10.0.0.5"), ReasonNotInPool, "not in any pool", "kept by ns/d")
	mustFail(t, a, v4("ns/e"), ReasonExhausted)
	// Explicitly asking for the pool moves it, once there is room.
	r := v4("ns/d")
	r.Pool = "p"
	mustFail(t, a, r, ReasonExhausted)
	a.Release("ns/a")
	mustAssign(t, a, r, "p", "10.0.0.0")
	mustHolders(t, a, "10.0.0.5")

	// Removing every pool orphans everything; nothing is lost.
	if errs := a.SetPools(nil); errs != nil {
		t.Fatal(errs)
	}
	checkOK(t, a)
	if _, ok := a.Stats("p"); ok {
		t.Fatal("removed pool has stats")
	}
	mustAssign(t, a, v4("ns/b"), "", "10.0.0.1")
	mustFail(t, a, v4("ns/new"), ReasonNoPool, "no pools are configured")

	// The pool returns (under another name): orphans are accounted again
	// and never handed to others.
	back := Pool{Name: "q", Addresses: []string{"10.0.0.0/30"}, AutoAssign: true}
	if errs := a.SetPools([]Pool{back}); errs != nil {
		t.Fatal(errs)
	}
	checkOK(t, a)
	mustInUse(t, a, "q", 2, 0)
	mustAssign(t, a, v4("ns/b"), "q", "10.0.0.1")
	mustAssign(t, a, v4("ns/new"), "q", "10.0.0.2")
	mustAssign(t, a, v4("ns/new2"), "q", "10.0.0.3")
	mustFail(t, a, v4("ns/new3"), ReasonExhausted)
}

func TestRestore(t *testing.T) {
	a := newAlloc(t,
		Pool{Name: "p", Addresses: []string{"10.0.0.0/29", "2001:db8::/126"}, AutoAssign: true},
		Pool{Name: "b", Addresses: []string{"10.0.1.0/24"}, AvoidBuggyIPs: true},
	)
	if err := a.Restore(v4("ns/a"), addrs("10.0.0.0")); err != nil {
		t.Fatal(err)
	}
	if err := a.Restore(v4("ns/z"), addrs("10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	mustInUse(t, a, "p", 2, 0)
	mustAssign(t, a, v4("ns/new"), "p", "10.0.0.1")
	mustAssign(t, a, v4("ns/a"), "p", "10.0.0.0")

	err := a.Restore(v4("ns/b"), addrs("10.0.0.0"))
	checkErr(t, err, ReasonInUse, "in use by ns/a")

	sh := func(o string, p int32) Request { return shareReq(o, "k", tcp(p)) }
	if err := a.Restore(sh("ns/s1", 80), addrs("10.0.0.4")); err != nil {
		t.Fatal(err)
	}
	if err := a.Restore(sh("ns/s2", 443), addrs("10.0.0.4")); err != nil {
		t.Fatal(err)
	}
	checkErr(t, a.Restore(sh("ns/s3", 80), addrs("10.0.0.4")), ReasonPortClash, "ns/s1", "TCP/80")
	mustHolders(t, a, "10.0.0.4", "ns/s1", "ns/s2")

	// Outside every pool (and a buggy address of an avoiding pool): kept,
	// reported without a pool, usable by its owner only.
	if err := a.Restore(Request{Owner: "ns/o", Families: []Family{IPv6, IPv4}}, addrs("192.0.2.9", "2001:db8::1")); err != nil {
		t.Fatal(err)
	}
	if got, _ := a.Assigned("ns/o"); got.Pool != "p" || got.IPs[0].String() != "2001:db8::1" || got.IPs[1].String() != "192.0.2.9" {
		t.Fatalf("restored %v", got)
	}
	if err := a.Restore(v4("ns/q"), addrs("192.0.2.10")); err != nil {
		t.Fatal(err)
	}
	mustAssign(t, a, withIPs(v4("ns/q"), "192.0.2.10"), "", "192.0.2.10")
	mustFail(t, a, withIPs(v4("ns/r"), "192.0.2.10"), ReasonNotInPool, "kept by ns/q")
	if err := a.Restore(v4("ns/bug"), addrs("10.0.1.255")); err != nil {
		t.Fatal(err)
	}
	mustInUse(t, a, "b", 0, 0)
	mustAssign(t, a, v4("ns/bug"), "", "10.0.1.255")

	// A pool that covers a restored address accounts it.
	if errs := a.SetPools([]Pool{
		{Name: "p", Addresses: []string{"10.0.0.0/29", "2001:db8::/126"}, AutoAssign: true},
		{Name: "doc", Addresses: []string{"192.0.2.0/24"}},
	}); errs != nil {
		t.Fatal(errs)
	}
	mustInUse(t, a, "doc", 2, 0)
	mustAssign(t, a, withIPs(v4("ns/q"), "192.0.2.10"), "doc", "192.0.2.10")

	// Restore replaces what the owner held; an empty list releases it.
	if err := a.Restore(v4("ns/a"), addrs("10.0.0.5")); err != nil {
		t.Fatal(err)
	}
	mustHolders(t, a, "10.0.0.0")
	if err := a.Restore(v4("ns/a"), nil); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Assigned("ns/a"); ok {
		t.Fatal("empty restore kept the owner")
	}
	checkErr(t, a.Restore(v4("ns/x"), addrs("10.0.0.6", "10.0.0.7")), ReasonInvalid, "two IPv4 addresses")
	checkOK(t, a)
}

// TestFirstClash checks the sorted merge against the pairwise comparison
// it replaces, on random port lists (unsorted, with duplicates).
func TestFirstClash(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 13))
	protos := []string{"TCP", "UDP", "SCTP"}
	random := func() []Port {
		out := make([]Port, rng.IntN(8))
		for i := range out {
			out[i] = Port{Protocol: protos[rng.IntN(len(protos))], Port: int32(rng.IntN(6))}
		}
		return out
	}
	for range 5000 {
		ps, qs := random(), random()
		var want []Port
		for _, p := range ps {
			if slices.Contains(qs, p) {
				want = append(want, p)
			}
		}
		got, clash := firstClash(sortedPorts(ps), sortedPorts(qs))
		if clash != (len(want) > 0) || (clash && !slices.Contains(want, got)) {
			t.Fatalf("firstClash(%v, %v) = %v, %v; clashing ports %v", ps, qs, got, clash, want)
		}
		if clash && slices.ContainsFunc(want, func(p Port) bool { return comparePorts(p, got) < 0 }) {
			t.Fatalf("firstClash(%v, %v) = %v, not the lowest of %v", ps, qs, got, want)
		}
	}
}

// TestSharingAcrossNamespaces: sharing keys are per namespace; Services of
// different namespaces share only when each names the other's namespace,
// and never with externalTrafficPolicy Local.
func TestSharingAcrossNamespaces(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"10.0.0.0/29"}, AutoAssign: true})
	req := func(owner string, with []string, port int32) Request {
		r := shareReq(owner, "k", tcp(port))
		r.Namespace = strings.Split(owner, "/")[0]
		r.ShareWithNamespaces = with
		return r
	}
	mustAssign(t, a, req("victim/web", nil, 80), "p", "10.0.0.0")
	// Another namespace, the same key: its own address, not the victim's.
	mustAssign(t, a, req("other/x", nil, 443), "p", "10.0.0.1")
	mustHolders(t, a, "10.0.0.0", "victim/web")
	// Asking for the victim's address is refused, naming it and the fix.
	mustFail(t, a, withIPs(req("other/y", nil, 444), "10.0.0.0"), ReasonInUse,
		`other/y: address 10.0.0.0 is already in use by victim/web, of another namespace, under sharing key "k"`,
		"sharing keys are per namespace", "each Service names the other's namespace in annotation vipcast.io/allow-shared-ip-across-namespaces",
		"other/y does not name victim; victim/web does not name other")
	// Naming the victim's namespace alone is not enough: the victim must
	// name the joiner's.
	mustFail(t, a, withIPs(req("other/y", []string{"victim"}, 444), "10.0.0.0"), ReasonInUse, "victim/web does not name other")
	mustAssign(t, a, req("other/y", []string{"victim"}, 444), "p", "10.0.0.1") // joins other/x
	// The same namespace needs nothing named.
	mustAssign(t, a, req("victim/api", []string{"blue"}, 8080), "p", "10.0.0.0")
	mustHolders(t, a, "10.0.0.0", "victim/api", "victim/web")

	// Each naming the other: they share; a third namespace, named by one
	// only, does not join.
	mustAssign(t, a, req("blue/dns", []string{"green"}, 53), "p", "10.0.0.2")
	mustAssign(t, a, withIPs(req("green/dns", []string{"blue", "red"}, 54), "10.0.0.2"), "p", "10.0.0.2")
	mustHolders(t, a, "10.0.0.2", "blue/dns", "green/dns")
	mustFail(t, a, withIPs(req("red/dns", []string{"blue", "green"}, 55), "10.0.0.2"), ReasonInUse, "blue/dns does not name red")
	// A sharer withdrawing its consent moves away; the others keep the VIP.
	mustAssign(t, a, req("green/dns", nil, 54), "p", "10.0.0.3")
	mustHolders(t, a, "10.0.0.2", "blue/dns")

	// Local across namespaces: refused even when each names the other.
	local := func(r Request) Request { r.LocalTrafficPolicy, r.PodSelector = true, "app=dns"; return r }
	mustAssign(t, a, local(req("blue/lb", []string{"green"}, 80)), "p", "10.0.0.4")
	mustFail(t, a, withIPs(local(req("green/lb", []string{"blue"}, 81)), "10.0.0.4"), ReasonPolicyClash,
		"of another namespace", "a pod selector selects pods of its own namespace only")
	checkOK(t, a)
}

// TestRestoreLegacyShareAcrossNamespaces: Services of different namespaces
// that shared a VIP under an earlier release, when keys were cluster-wide,
// keep it; nobody joins them without meeting today's rules with each.
func TestRestoreLegacyShareAcrossNamespaces(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"10.0.0.0/29"}, AutoAssign: true})
	req := func(owner string, cross bool, port int32) Request {
		r := shareReq(owner, "k", tcp(port))
		r.Namespace = strings.Split(owner, "/")[0]
		if cross {
			r.ShareWithNamespaces = []string{"one", "two", "three"}
		}
		return r
	}
	for _, r := range []Request{req("one/a", false, 80), req("two/b", false, 443)} {
		if err := a.Restore(r, addrs("10.0.0.4")); err != nil {
			t.Fatalf("Restore(%s): %v", r.Owner, err)
		}
	}
	mustHolders(t, a, "10.0.0.4", "one/a", "two/b")
	if why := a.LegacyShare("one/a"); !strings.Contains(why, "two/b") || !strings.Contains(why, "per namespace") {
		t.Fatalf("LegacyShare(one/a) = %q", why)
	}
	mustAssign(t, a, req("one/a", false, 80), "p", "10.0.0.4")
	mustAssign(t, a, withIPs(req("two/b", false, 443), "10.0.0.4"), "p", "10.0.0.4")
	// A newcomer of either namespace breaks the rule with the other holder.
	mustFail(t, a, withIPs(req("one/c", false, 8080), "10.0.0.4"), ReasonInUse, "two/b")
	mustFail(t, a, withIPs(req("three/d", true, 8080), "10.0.0.4"), ReasonInUse, "one/a")
	mustAssign(t, a, req("one/c", false, 8080), "p", "10.0.0.0")
	// Both opting in ends the exception: the share is then an ordinary one.
	mustAssign(t, a, req("one/a", true, 80), "p", "10.0.0.4")
	mustAssign(t, a, req("two/b", true, 443), "p", "10.0.0.4")
	if why := a.LegacyShare("two/b"); why != "" {
		t.Fatalf("LegacyShare after both opted in = %q", why)
	}
	mustAssign(t, a, withIPs(req("three/d", true, 8080), "10.0.0.4"), "p", "10.0.0.4")
	checkOK(t, a)
}

// mustFailDropping assigns, checks the error like mustFail, and checks
// that the owner gave up exactly the addresses it may no longer share with
// their other holders: it keeps the rest, and gains nothing.
func mustFailDropping(t testing.TB, a *Allocator, req Request, reason Reason, fragments ...string) {
	t.Helper()
	before, _ := a.Assigned(req.Owner)
	got, err := a.Assign(req)
	if err == nil {
		t.Fatalf("Assign(%s) = %v, want %s error", req.Owner, got, reason)
	}
	checkErr(t, err, reason, fragments...)
	after, _ := a.Assigned(req.Owner)
	for _, ip := range after.IPs {
		if !slices.Contains(before.IPs, ip) {
			t.Fatalf("failed Assign(%s) gained %s: %v to %v", req.Owner, ip, before.IPs, after.IPs)
		}
	}
	if len(after.IPs) == len(before.IPs) {
		t.Fatalf("failed Assign(%s) kept %v, shared with holders it may no longer share with", req.Owner, after.IPs)
	}
	checkOK(t, a)
}

// TestSharerThatStopsSharing: when one of two Services sharing an address
// changes its request so that they may no longer share it (it drops or
// changes its sharing key, or its ports now clash), it is the one that
// moves, and the other keeps the address. When it cannot move (it asks
// for that very address, or no other address is free), its request fails
// and it gives the address up all the same: two Services that may not
// share an address never hold it together (model test seed
// 1795762305012777268, step 145).
func TestSharerThatStopsSharing(t *testing.T) {
	const shared = "10.0.0.0"
	for _, tc := range []struct {
		name   string
		next   Request // ns/b's new request
		full   bool    // the pool's other address is taken
		reason Reason  // "" moves to 10.0.0.1
		frags  []string
	}{
		{name: "drops its key and moves", next: shareReq("ns/b", "", tcp(443))},
		{name: "changes its key and moves", next: shareReq("ns/b", "k1", tcp(443))},
		{name: "clashing ports and moves", next: shareReq("ns/b", "k2", tcp(80))},
		{name: "drops its key, pool full", next: shareReq("ns/b", "", tcp(443)), full: true,
			reason: ReasonExhausted, frags: []string{"ns/b: no free IPv4 address"}},
		{name: "changes its key, pool full", next: shareReq("ns/b", "k1", tcp(443)), full: true,
			reason: ReasonExhausted},
		{name: "clashing ports, pool full", next: shareReq("ns/b", "k2", tcp(80)), full: true,
			reason: ReasonExhausted},
		{name: "drops its key, asking for the address", next: withIPs(shareReq("ns/b", "", tcp(443)), shared),
			reason: ReasonInUse, frags: []string{"ns/b: address 10.0.0.0 is already in use by ns/a"}},
		{name: "changes its key, asking for the address", next: withIPs(shareReq("ns/b", "k1", tcp(443)), shared),
			reason: ReasonInUse, frags: []string{`sharing keys differ ("k1" vs "k2")`}},
		{name: "clashing ports, asking for the address", next: withIPs(shareReq("ns/b", "k2", tcp(80)), shared),
			reason: ReasonPortClash, frags: []string{"both use port TCP/80"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAlloc(t, Pool{Name: "p", Addresses: []string{"10.0.0.0-10.0.0.1"}, AutoAssign: true})
			mustAssign(t, a, shareReq("ns/a", "k2", tcp(80)), "p", shared)
			mustAssign(t, a, withIPs(shareReq("ns/b", "k2", tcp(443)), shared), "p", shared)
			if tc.full {
				mustAssign(t, a, shareReq("ns/c", "", tcp(22)), "p", "10.0.0.1")
			}
			if tc.reason == "" {
				mustAssign(t, a, tc.next, "p", "10.0.0.1")
			} else {
				mustFailDropping(t, a, tc.next, tc.reason, tc.frags...)
				if as, ok := a.Assigned("ns/b"); ok {
					t.Fatalf("ns/b still holds %v", as.IPs)
				}
			}
			mustHolders(t, a, shared, "ns/a")
			// The address is ns/a's under its own request: a newcomer with
			// its key joins it; ns/b's old key and ports are forgotten.
			mustAssign(t, a, shareReq("ns/d", "k2", tcp(443)), "p", shared)
			mustHolders(t, a, shared, "ns/a", "ns/d")
			if tc.reason != "" {
				// Retried once the address is free to take, ns/b gets it.
				a.Release("ns/a")
				a.Release("ns/d")
				mustAssign(t, a, tc.next, "p", shared)
			}
		})
	}
}

// TestFailedRequestDescribesItsOwner: a sole holder whose new request
// fails keeps its address, but under its new request: a newcomer with the
// sharing key it dropped does not join it.
func TestFailedRequestDescribesItsOwner(t *testing.T) {
	a := newAlloc(t, Pool{Name: "p", Addresses: []string{"10.0.0.0/30"}, AutoAssign: true})
	mustAssign(t, a, shareReq("ns/a", "k2", tcp(80)), "p", "10.0.0.0")
	next := shareReq("ns/a", "", tcp(80))
	next.Pool = "missing"
	mustFail(t, a, next, ReasonUnknownPool, `pool "missing" does not exist`)
	mustAssign(t, a, shareReq("ns/b", "k2", tcp(443)), "p", "10.0.0.1")
	mustHolders(t, a, "10.0.0.0", "ns/a")
}
