//go:build routing

package bgp_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/test/routers"
)

// has reports whether f holds prefix p (from any neighbor).
func has(t *testing.T, f *routers.FRR, p netip.Prefix) bool {
	t.Helper()
	fam := routers.IPv4
	if p.Addr().Is6() {
		fam = routers.IPv6
	}
	var table struct {
		Routes map[string]any `json:"routes"`
	}
	if err := f.VtyshJSON("show bgp "+string(fam)+" unicast json", &table); err != nil {
		t.Fatal(err)
	}
	_, ok := table.Routes[p.String()]
	return ok
}

// TestRoutePeers checks Route.Peers: a route limited to one peer does not
// reach the other, and changing the list later adds and withdraws it.
func TestRoutePeers(t *testing.T) {
	self := ip("127.0.3.2")
	a := routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: ip("127.0.3.1"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: localASN}}})
	b := routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: ip("127.0.3.3"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: localASN}}})
	s, _ := newSpeaker(t, self.String())
	// Announce before the sessions exist: new peers must get their filter
	// from the start.
	only, all, only6 := pfx("10.3.0.1/32"), pfx("10.3.0.2/32"), pfx("fd00:3::1/128")
	route := func(p netip.Prefix, peers ...string) bgp.Route {
		nh := ip("10.0.0.2")
		if p.Addr().Is6() {
			nh = ip("fd00::2")
		}
		return bgp.Route{Prefix: p, NextHop: nh, Peers: peers}
	}
	if err := s.Apply(ctxT(), []bgp.Route{route(only, "a"), route(all), route(only6, "a")}, nil); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if err := s.SetPeers(ctxT(), []bgp.Peer{
		{Name: "a", Address: a.Address, Port: uint16(a.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: self},
		{Name: "b", Address: b.Address, Port: uint16(b.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: self},
	}); err != nil {
		t.Fatalf("SetPeers: %v", err)
	}
	eventually(t, 10*time.Second, "A gets 3 routes and B 1", func() bool {
		na, err1 := a.PrefixCount(self)
		nb, err2 := b.PrefixCount(self)
		return err1 == nil && err2 == nil && na == 3 && nb == 1
	})
	time.Sleep(300 * time.Millisecond)
	if has(t, b, only) || has(t, b, only6) || !has(t, b, all) {
		t.Fatalf("B must have only %s", all)
	}

	// Widen: B gets the route (same attributes: a soft reset out).
	if err := s.Apply(ctxT(), []bgp.Route{route(only)}, nil); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	eventually(t, 5*time.Second, "B gets "+only.String(), func() bool { return has(t, b, only) })

	// Move it to B only: A loses it, B keeps it.
	if err := s.Apply(ctxT(), []bgp.Route{route(only, "b")}, nil); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	eventually(t, 5*time.Second, "A drops "+only.String(), func() bool { return !has(t, a, only) })
	eventually(t, 5*time.Second, "B has "+only.String(), func() bool { return has(t, b, only) })

	// A restricted route announced while sessions are up.
	late := pfx("10.3.0.3/32")
	if err := s.Apply(ctxT(), []bgp.Route{route(late, "b")}, nil); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	eventually(t, 5*time.Second, "B gets "+late.String(), func() bool { return has(t, b, late) })
	if has(t, a, late) {
		t.Errorf("A got %s, restricted to B", late)
	}

	ss, err := s.Sessions(ctxT())
	if err != nil {
		t.Fatal(err)
	}
	announced := map[string]int{}
	for _, x := range ss {
		announced[x.Peer] = x.Announced
	}
	if announced["a"] != 2 || announced["b"] != 3 {
		t.Errorf("Announced = %v, want a:2 b:3", announced)
	}

	if err := s.Apply(ctxT(), nil, []netip.Prefix{only, late}); err != nil {
		t.Fatalf("Apply withdraw: %v", err)
	}
	eventually(t, 5*time.Second, "B drops the withdrawn routes", func() bool {
		n, err := b.PrefixCount(self)
		return err == nil && n == 1
	})
}

// TestMD5 checks that the right TCP MD5 password establishes the session
// and a wrong one never does.
func TestMD5(t *testing.T) {
	good, bad := ip("127.0.4.2"), ip("127.0.4.3")
	f := routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: ip("127.0.4.1"),
		Neighbors: []routers.FRRNeighbor{
			{Address: good, ASN: localASN, Password: "s3cret"},
			{Address: bad, ASN: localASN, Password: "s3cret"},
		}})
	peer := func(src netip.Addr, pw string) []bgp.Peer {
		return []bgp.Peer{{Name: "frr", Address: f.Address, Port: uint16(f.Port), ASN: routerASN, LocalASN: localASN,
			SourceAddress: src, Password: pw}}
	}
	sGood, _ := newSpeaker(t, good.String())
	sBad, _ := newSpeaker(t, bad.String())
	if err := sGood.SetPeers(ctxT(), peer(good, "s3cret")); err != nil {
		t.Fatal(err)
	}
	if err := sBad.SetPeers(ctxT(), peer(bad, "wrong")); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitEstablished(good, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n, err := f.Neighbor(bad)
		if err != nil {
			t.Fatal(err)
		}
		if n.State == "Established" || n.EstablishedCount > 0 {
			t.Fatalf("session with the wrong password: %+v", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ss, err := sBad.Sessions(ctxT())
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 1 || ss[0].Established() || ss[0].Reason == "" {
		t.Errorf("wrong-password session = %+v, want not established, with a reason", ss)
	}
	t.Logf("wrong password: %s, reason %q", ss[0].State, ss[0].Reason)
}

// TestChangeOnePeer checks that changing one peer's configuration resets
// only its session.
func TestChangeOnePeer(t *testing.T) {
	self := ip("127.0.5.2")
	a := routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: ip("127.0.5.1"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: localASN}}})
	b := routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: ip("127.0.5.3"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: localASN}}})
	s, _ := newSpeaker(t, self.String())
	peers := []bgp.Peer{
		{Name: "a", Address: a.Address, Port: uint16(a.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: self, HoldTime: 9 * time.Second},
		{Name: "b", Address: b.Address, Port: uint16(b.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: self, HoldTime: 9 * time.Second},
	}
	if err := s.SetPeers(ctxT(), peers); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctxT(), []bgp.Route{{Prefix: pfx("10.5.0.1/32"), NextHop: ip("10.0.0.2")}}, nil); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*routers.FRR{a, b} {
		if err := f.WaitEstablished(self, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	before, err := b.Neighbor(self)
	if err != nil {
		t.Fatal(err)
	}

	// The same peers again: nothing resets.
	if err := s.SetPeers(ctxT(), peers); err != nil {
		t.Fatal(err)
	}
	peers[0].HoldTime = 6 * time.Second
	if err := s.SetPeers(ctxT(), peers); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "A's session is re-established", func() bool {
		n, err := a.Neighbor(self)
		return err == nil && n.State == "Established" && n.EstablishedCount == 2
	})
	var hold struct {
		M map[string]struct {
			Hold int `json:"bgpTimerHoldTimeMsecs"`
		} `json:"-"`
	}
	if err := a.VtyshJSON("show bgp neighbors "+self.String()+" json", &hold.M); err != nil {
		t.Fatal(err)
	}
	if got := hold.M[self.String()].Hold; got != 6000 {
		t.Errorf("A's negotiated hold time = %d ms, want 6000", got)
	}
	after, err := b.Neighbor(self)
	if err != nil {
		t.Fatal(err)
	}
	if after.EstablishedCount != before.EstablishedCount || after.DroppedCount != before.DroppedCount ||
		after.State != "Established" || after.UptimeMsec < before.UptimeMsec || after.PfxRcd != 1 {
		t.Errorf("B's session changed: before %+v, after %+v", before, after)
	}
	if n, err := a.PrefixCount(self); err != nil || n != 1 {
		eventually(t, 5*time.Second, "A gets the route back", func() bool {
			n, err := a.PrefixCount(self)
			return err == nil && n == 1
		})
	}

	// Removing a peer closes only its session.
	if err := s.SetPeers(ctxT(), peers[1:]); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "A's session is closed", func() bool {
		n, err := a.Neighbor(self)
		return err == nil && n.State != "Established"
	})
	if n, err := b.Neighbor(self); err != nil || n.EstablishedCount != before.EstablishedCount {
		t.Errorf("B's session changed after removing A: %+v, %v", n, err)
	}
	ss, err := s.Sessions(ctxT())
	if err != nil || len(ss) != 1 || ss[0].Peer != "b" {
		t.Errorf("Sessions = %+v, %v; want only b", ss, err)
	}
	if !strings.EqualFold(ss[0].State, "established") {
		t.Errorf("b: %+v", ss[0])
	}
}
