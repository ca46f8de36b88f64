//go:build routing

package bgp_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/test/netns"
	"github.com/vipcast/vipcast/test/routers"
)

// TestBFDWithFRR runs the speaker's BFD against FRR's bfdd (zebra + bgpd +
// bfdd in a namespace across a veth, root only): the BFD session comes Up
// on both sides with the configured timers; when bfdd falls silent
// (SIGSTOP, bgpd still answering) the speaker's BFD session goes Down and
// it resets the BGP session at once, saying why; when bfdd resumes both
// come back.
func TestBFDWithFRR(t *testing.T) {
	netns.Require(t)
	ns := netns.New(t, "bfd-tor")
	host, tor := pfx("10.254.78.1/30"), pfx("10.254.78.2/30")
	netns.Veth(t, nil, "vcbfd0", host.String(), ns, "eth0", tor.String())
	timers := routers.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3}
	f := routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: tor.Addr(), Netns: ns.Name, Zebra: true,
		Neighbors: []routers.FRRNeighbor{{Address: host.Addr(), ASN: localASN, HoldTime: 9 * time.Second, KeepaliveTime: 3 * time.Second, BFD: &timers}}})
	s, ev := newSpeaker(t, host.Addr().String())
	peer := bgp.Peer{Name: "tor", Address: tor.Addr(), Port: uint16(f.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: host.Addr(),
		HoldTime: 9 * time.Second, KeepaliveTime: 3 * time.Second,
		BFD: &bgp.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3}}
	if err := s.SetPeers(ctxT(), []bgp.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitBFDUp(host.Addr(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitEstablished(host.Addr(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	session := func() bgp.SessionState { return onlySession(t, s) }
	eventually(t, 5*time.Second, "the speaker's BFD session is Up", func() bool { return session().BFD == "Up" })
	p, err := f.BFDPeer(host.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FRR's view: %+v", p)
	if p.Multihop || p.RemoteTransmitInterval != 100*time.Millisecond || p.RemoteReceiveInterval != 100*time.Millisecond || p.RemoteDetectMultiplier != 3 {
		t.Fatalf("FRR sees the speaker's session as %+v, want single hop, 100ms/100ms x3", p)
	}

	// FRR 8.4 replaces its BFD session once BGP is up, and bgpd resets
	// the BGP session for it (Cease "BFD Down"); the speaker's side must
	// not reset it as well.
	time.Sleep(3 * time.Second)
	eventually(t, 20*time.Second, "BGP and BFD are up", func() bool { ss := session(); return ss.BFD == "Up" && ss.Established() })
	for _, e := range ev.all() {
		if strings.Contains(e.Reason, "BFD session down") {
			t.Fatalf("the speaker reset the BGP session for BFD while nothing failed: %+v", e)
		}
	}

	// bfdd falls silent: the speaker's BFD detects it and resets BGP.
	downs := session().BFDDowns
	f.FreezeBfdd()
	frozen := time.Now()
	eventually(t, 5*time.Second, "the speaker's BFD session goes Down", func() bool { return session().BFD == "Down" })
	detected := time.Since(frozen)
	eventually(t, 5*time.Second, "the BGP session is reset", func() bool { return session().State != "Established" })
	reset := time.Since(frozen)
	t.Logf("bfdd frozen: the speaker's BFD Down after %v, BGP reset after %v (detection time 300ms, hold time 9s)", detected.Round(time.Millisecond), reset.Round(time.Millisecond))
	if reset >= 3*time.Second {
		t.Fatalf("BGP reset %v after bfdd froze: the hold timer, not BFD, ended it", reset)
	}
	if ss := session(); !strings.Contains(ss.Reason, "BFD session down: control detection time expired") || ss.BFDDowns != downs+1 {
		t.Fatalf("session %+v: want the BFD reason and one BFD down transition", ss)
	}
	var sawDown bool
	for _, e := range ev.all() {
		sawDown = sawDown || (e.BFD == "Down" && e.BFDDiag == "control detection time expired")
	}
	if !sawDown {
		t.Fatalf("OnSessionChange never reported the BFD session Down: %+v", ev.all())
	}

	f.ThawBfdd()
	if err := f.WaitBFDUp(host.Addr(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitEstablished(host.Addr(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "both come back", func() bool { ss := session(); return ss.BFD == "Up" && ss.Established() })

	// The router retunes its timers: renegotiated without a flap.
	before, err := f.BFDPeer(host.Addr())
	if err != nil {
		t.Fatal(err)
	}
	nbefore, err := f.Neighbor(host.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetBFD(host.Addr(), routers.BFD{MinTx: 200 * time.Millisecond, MinRx: 250 * time.Millisecond, Multiplier: 4}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	after, err := f.BFDPeer(host.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if after.Status != "up" || after.SessionDownEvents != before.SessionDownEvents ||
		after.TransmitInterval != 200*time.Millisecond || after.ReceiveInterval != 250*time.Millisecond || after.DetectMultiplier != 4 {
		t.Fatalf("after the router's timer change: %+v (before %+v), want up with the new timers and no down event", after, before)
	}
	if ss := session(); ss.BFD != "Up" || ss.BFDDowns != downs+1 || !ss.Established() {
		t.Fatalf("session %+v after the router's timer change, want BFD Up with no new down and BGP Established", ss)
	}
	if n, _ := f.Neighbor(host.Addr()); n.DroppedCount != nbefore.DroppedCount {
		t.Fatalf("BGP dropped on a BFD timer change: %+v (before %+v)", n, nbefore)
	}
}

// TestBFDWithBIRD runs the speaker's BFD against BIRD's, multihop (RFC
// 5883), as BIRD asks for a multihop BGP session, with the minimum TTL
// BIRD needs (64): the session comes Up on both sides, and a frozen BIRD makes the speaker reset the BGP session
// through BFD, long before the hold time.
func TestBFDWithBIRD(t *testing.T) {
	netns.Require(t)
	ns := netns.New(t, "bfd-bird")
	host, tor := pfx("10.254.79.1/30"), pfx("10.254.79.2/30")
	netns.Veth(t, nil, "vcbfd1", host.String(), ns, "eth0", tor.String())
	timers := routers.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3}
	b := routers.StartBIRD(t, routers.BIRDConfig{ASN: routerASN, ListenAddress: tor.Addr(), Netns: ns.Name,
		Neighbors: []routers.BIRDNeighbor{{Name: "speaker", Address: host.Addr(), ASN: localASN, HoldTime: 9 * time.Second, BFD: &timers}}})
	s, _ := newSpeaker(t, host.Addr().String())
	peer := bgp.Peer{Name: "bird", Address: tor.Addr(), Port: uint16(b.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: host.Addr(),
		HoldTime: 9 * time.Second, KeepaliveTime: 3 * time.Second, EBGPMultiHop: 2,
		// BIRD sends multihop BFD with TTL 64 (docs/routers.md).
		BFD: &bgp.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3, Multihop: true, MinTTL: 64}}
	if err := s.SetPeers(ctxT(), []bgp.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitEstablished("speaker", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitBFDUp(host.Addr(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	session := func() bgp.SessionState { return onlySession(t, s) }
	eventually(t, 5*time.Second, "the speaker's BFD session is Up", func() bool { return session().BFD == "Up" })
	sessions, err := b.BFDSessions()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("BIRD's view: %+v", sessions)

	b.Freeze()
	frozen := time.Now()
	eventually(t, 5*time.Second, "the BGP session is reset", func() bool { return session().State != "Established" })
	took := time.Since(frozen)
	b.Thaw()
	t.Logf("BIRD frozen: the speaker reset BGP after %v (detection time 300ms, hold time 9s)", took.Round(time.Millisecond))
	if took >= 3*time.Second {
		t.Fatalf("BGP reset %v after BIRD froze: the hold timer, not BFD, ended it", took)
	}
	if ss := session(); !strings.Contains(ss.Reason, "BFD session down") {
		t.Fatalf("session %+v: want the BFD reason", ss)
	}
	if err := b.WaitBFDUp(host.Addr(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitEstablished("speaker", 20*time.Second); err != nil {
		t.Fatal(err)
	}
}

// TestBFDRouterRemovesBFD: the router removes BFD for the neighbor first,
// as docs/routers.md says to: FRR's bfdd deletes its session, and the
// speaker's BFD session goes Down without counting as a failure, so the
// speaker does not reset the BGP session for it.
func TestBFDRouterRemovesBFD(t *testing.T) {
	netns.Require(t)
	ns := netns.New(t, "bfd-rm")
	host, tor := pfx("10.254.83.1/30"), pfx("10.254.83.2/30")
	netns.Veth(t, nil, "vcbfd3", host.String(), ns, "eth0", tor.String())
	timers := routers.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3}
	f := routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: tor.Addr(), Netns: ns.Name, Zebra: true,
		Neighbors: []routers.FRRNeighbor{{Address: host.Addr(), ASN: localASN, HoldTime: 9 * time.Second, KeepaliveTime: 3 * time.Second, BFD: &timers}}})
	s, ev := newSpeaker(t, host.Addr().String())
	peer := bgp.Peer{Name: "tor", Address: tor.Addr(), Port: uint16(f.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: host.Addr(), //nolint:gosec // a listening port
		HoldTime: 9 * time.Second, KeepaliveTime: 3 * time.Second,
		BFD: &bgp.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3}}
	if err := s.SetPeers(ctxT(), []bgp.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitBFDUp(host.Addr(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	session := func() bgp.SessionState { return onlySession(t, s) }
	// FRR 8.4 replaces its BFD session once BGP is up (TestBFDWithFRR).
	time.Sleep(3 * time.Second)
	eventually(t, 20*time.Second, "BGP and BFD are up", func() bool { ss := session(); return ss.BFD == "Up" && ss.Established() })
	before := session()
	if _, err := f.Vtysh("configure terminal", "router bgp "+strconv.Itoa(routerASN), "no neighbor "+host.Addr().String()+" bfd"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the speaker's BFD session leaves Up", func() bool { return session().BFD != "Up" })
	time.Sleep(2 * time.Second)
	after := session()
	t.Logf("after the router removed BFD: %+v", after)
	for _, e := range ev.all() {
		if strings.Contains(e.Reason, "BFD session down") {
			t.Fatalf("the speaker reset the BGP session for BFD when the router removed BFD: %+v (before %+v)", e, before)
		}
	}
	if !after.Established() || after.Transitions != before.Transitions {
		t.Fatalf("BGP session %+v after the router removed BFD, want it untouched (before %+v)", after, before)
	}
}
