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

	"github.com/vipcast/vipcast/bgp/bgptest"
)

// TestTreatAsWithdraw checks RFC 7606 error handling on vipcast's
// sessions: an UPDATE whose optional attribute is malformed (COMMUNITIES
// or LARGE_COMMUNITY of a length no community has) withdraws the routes it
// carries, and one announcing a new prefix adds nothing, while the session
// stays Established and the router gets no NOTIFICATION. gobgp turns this
// on for every neighbor added through its API (the API has no field for
// it); this test is what notices if a release stops doing so.
func TestTreatAsWithdraw(t *testing.T) {
	self := netip.MustParseAddr("127.0.13.2")
	const routerASN = 65013
	atk := bgptest.StartRawPeer(t, netip.MustParseAddr("127.0.13.3"), routerASN)
	g, err := New(Config{RouterID: self, ListenPort: -1, Logger: ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() { _ = g.Stop(ctx) })
	if err := g.SetPeers(ctx, []Peer{{Name: "router", Address: atk.Addr, Port: uint16(atk.Port), ASN: routerASN, LocalASN: 64512, SourceAddress: self}}); err != nil {
		t.Fatal(err)
	}
	if err := atk.WaitEstablished(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitReceived := func(want int, what string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for received(t, g, atk.Addr) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: gobgp holds %d paths from the router, want %d", what, received(t, g, atk.Addr), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	nh := netip.MustParseAddr("192.0.2.1")
	first := bgptest.Target{ASN: routerASN, NextHop: nh, Prefix: netip.MustParsePrefix("10.99.1.0/24")}
	second := bgptest.Target{ASN: routerASN, NextHop: nh, Prefix: netip.MustParsePrefix("10.99.2.0/24")}
	malformed := func(tgt bgptest.Target, attr []byte) []byte {
		return bgptest.Update(nil, [][]byte{bgptest.Origin(0), bgptest.ASPath(tgt.ASN), bgptest.NextHop(tgt.NextHop), attr}, bgptest.NLRI(tgt.Prefix))
	}
	badCommunities := bgptest.Attr(bgptest.FlagOptional|bgptest.FlagTransitive, bgptest.AttrCommunities, []byte{0xfd, 0xe8, 0})
	badLarge := bgptest.Attr(bgptest.FlagOptional|bgptest.FlagTransitive, bgptest.AttrLargeCommunity, []byte{0, 0, 0xfd, 0xf5, 1})

	send := func(what string, msg []byte) {
		t.Helper()
		o, err := atk.Send(msg, 500*time.Millisecond)
		if err != nil || !o.Kept {
			t.Fatalf("%s: %v, %v; want the session kept", what, o, err)
		}
	}
	send("a well-formed UPDATE", first.WellFormed())
	waitReceived(1, "after a well-formed UPDATE")
	before := session(t, g, "router")

	send("the same prefix with a COMMUNITIES of 3 octets", malformed(first, badCommunities))
	waitReceived(0, "after the malformed UPDATE (treat-as-withdraw)")
	send("a new prefix with a LARGE_COMMUNITY of 5 octets", malformed(second, badLarge))
	send("a well-formed UPDATE of the first prefix again", first.WellFormed())
	// In order: once the last UPDATE is in, the one before it was handled.
	waitReceived(1, "after the malformed new prefix and the first prefix again")
	var prefixes []string
	adjIn := apiutil.ListPathRequest{TableType: api.TableType_TABLE_TYPE_ADJ_IN, Name: atk.Addr.String(), Family: gobgp.RF_IPv4_UC}
	if err := g.srv.ListPath(adjIn, func(p gobgp.NLRI, _ []*apiutil.Path) { prefixes = append(prefixes, p.String()) }); err != nil {
		t.Fatal(err)
	}
	if len(prefixes) != 1 || prefixes[0] != first.Prefix.String() {
		t.Errorf("Adj-RIB-In = %v, want only %s", prefixes, first.Prefix)
	}

	// gobgp counts the malformed UPDATEs apart, not as UPDATEs.
	after := session(t, g, "router")
	if !after.Established() || after.Transitions != before.Transitions || after.UpdatesReceived != before.UpdatesReceived+1 {
		t.Errorf("session after the malformed UPDATEs: %+v, before %+v", after, before)
	}
	if n := atk.Notifications(); len(n) != 0 || atk.Established() != 1 {
		t.Errorf("the router got %v and established %d sessions; want no NOTIFICATION and one session", n, atk.Established())
	}
	state, err := g.sessionState(ctx, atk.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	if state != api.PeerState_SESSION_STATE_ESTABLISHED {
		t.Errorf("gobgp's session state %v", state)
	}
}

// TestGoBGPBFDOff checks that gobgp's own BFD (v4 has one) stays off for
// a peer that asks for BFD: vipcast's bfd package runs that session, and
// two implementations would both answer the router on UDP 3784.
func TestGoBGPBFDOff(t *testing.T) {
	self := netip.MustParseAddr("127.0.13.5")
	router := bgptest.StartRawPeer(t, netip.MustParseAddr("127.0.13.6"), 65013)
	g, err := New(Config{RouterID: self, ListenPort: -1, Logger: ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() { _ = g.Stop(ctx) })
	if err := g.SetPeers(ctx, []Peer{{Name: "router", Address: router.Addr, Port: uint16(router.Port), ASN: 65013, LocalASN: 64512,
		SourceAddress: self, BFD: &BFD{MinTx: 300 * time.Millisecond, MinRx: 300 * time.Millisecond, Multiplier: 3}}}); err != nil {
		t.Fatal(err)
	}
	if err := router.WaitEstablished(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	var peers []*api.Peer
	if err := g.srv.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) { peers = append(peers, p) }); err != nil {
		t.Fatal(err)
	}
	if len(peers) != 1 {
		t.Fatalf("gobgp has %d peers, want 1", len(peers))
	}
	var bfdPeers []string
	g.srv.ListBfdPeer(ctx, func(addr string, _ *api.BfdPeerState) { bfdPeers = append(bfdPeers, addr) })
	if b := peers[0].GetBfd(); b.GetEnabled() || len(bfdPeers) != 0 {
		t.Errorf("gobgp's BFD is on: the peer's config %v, gobgp's BFD peers %v", b, bfdPeers)
	}
	if _, ok := g.bfd.Status("router"); !ok {
		t.Errorf("vipcast's BFD session for the peer is missing")
	}
}
