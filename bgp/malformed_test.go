//go:build routing

package bgp_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/bgp/bgptest"
	"github.com/vipcast/vipcast/test/routers"
)

// TestMalformedUpdates sends malformed UPDATEs at the speaker from one
// router and checks that nothing reaches past that router's session: the
// UPDATEs of GoBGP's 2026 remote-crash advisories, then a fuzzed corpus.
// The engine must not panic (a panic in gobgp's FSM goroutine ends this
// test binary), the attacking session may reset, and the other router's
// session stays Established, never re-established, with the speaker's
// routes untouched.
func TestMalformedUpdates(t *testing.T) {
	self := ip("127.0.11.2")
	frr := routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: ip("127.0.11.1"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: localASN}}})
	const attackerASN = 65010
	atk := bgptest.StartRawPeer(t, ip("127.0.11.3"), attackerASN)
	s, _ := newSpeaker(t, self.String())
	if err := s.SetPeers(ctxT(), []bgp.Peer{
		{Name: "frr", Address: frr.Address, Port: uint16(frr.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: self},
		{Name: "attacker", Address: atk.Addr, Port: uint16(atk.Port), ASN: attackerASN, LocalASN: localASN, SourceAddress: self},
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Apply(ctxT(), []bgp.Route{
		{Prefix: pfx("10.11.0.1/32"), NextHop: ip("10.0.0.2")},
		{Prefix: pfx("fd00:11::1/128"), NextHop: ip("fd00::2")},
	}, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "FRR receives the speaker's two routes", func() bool {
		n, err := frr.PrefixCount(self)
		return err == nil && n == 2
	})
	if err := atk.WaitEstablished(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	before, err := frr.Neighbor(self)
	if err != nil {
		t.Fatal(err)
	}
	frrSession := func() (bgp.SessionState, error) {
		sessions, err := s.Sessions(ctxT())
		if err != nil {
			return bgp.SessionState{}, err
		}
		for _, ss := range sessions {
			if ss.Peer == "frr" {
				return ss, nil
			}
		}
		return bgp.SessionState{}, fmt.Errorf("no session with FRR in %+v", sessions)
	}
	ours, err := frrSession()
	if err != nil {
		t.Fatal(err)
	}
	// The bystander's session, as both sides see it.
	untouched := func(bgptest.Attack, bgptest.Outcome) error {
		n, err := frr.Neighbor(self)
		switch {
		case err != nil:
			return err
		case n.State != "Established" || n.EstablishedCount != before.EstablishedCount || n.DroppedCount != before.DroppedCount:
			return fmt.Errorf("FRR's session with the speaker: %+v, was %+v", n, before)
		case n.PfxRcd != 2:
			return fmt.Errorf("FRR holds %d of the speaker's prefixes, want 2", n.PfxRcd)
		}
		ss, err := frrSession()
		if err != nil {
			return err
		}
		if !ss.Established() || ss.Transitions != ours.Transitions {
			return fmt.Errorf("the speaker's session with FRR: %+v, was %+v", ss, ours)
		}
		return nil
	}
	tgt := bgptest.Target{ASN: attackerASN, NextHop: ip("192.0.2.1"), Prefix: pfx("10.99.1.0/24")}

	// A well-formed UPDATE first: the session takes it.
	if o, err := atk.Send(tgt.WellFormed(), 300*time.Millisecond); err != nil || !o.Kept {
		t.Fatalf("well-formed UPDATE: %v, %v", o, err)
	}
	res := atk.Attack(t, tgt.Advisories(), bgptest.AttackRun{
		Settle: 300 * time.Millisecond, Reconnect: 15 * time.Second, Verbose: true, Check: untouched,
	})
	t.Logf("advisories: %d sent, session kept after %d, reset after %d", res.Sent, res.Kept, res.Reset)

	start := time.Now()
	// Bounded for the suite's time: each session reset costs gobgp's ~7 s.
	res = atk.Attack(t, tgt.Fuzzed(29, 150), bgptest.AttackRun{
		Settle: 150 * time.Millisecond, Reconnect: 15 * time.Second, Budget: 75 * time.Second, Check: untouched,
	})
	t.Logf("fuzzed corpus (seed 29): %d sent in %s, session kept after %d, reset after %d",
		res.Sent, time.Since(start).Round(time.Second), res.Kept, res.Reset)
	if res.Sent < 60 {
		t.Errorf("only %d fuzzed UPDATEs sent within the budget, want at least 60", res.Sent)
	}

	// The attacker's session still works, and nothing it sent reached FRR.
	if err := atk.WaitEstablished(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	if o, err := atk.Send(tgt.WellFormed(), 300*time.Millisecond); err != nil || !o.Kept {
		t.Fatalf("well-formed UPDATE after the attacks: %v, %v", o, err)
	}
	if err := untouched(bgptest.Attack{}, bgptest.Outcome{}); err != nil {
		t.Fatal(err)
	}
	routes, err := frr.Routes(routers.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if _, leaked := routes[tgt.Prefix]; leaked || len(routes) != 1 {
		t.Errorf("FRR's IPv4 table = %v, want only the speaker's route", routes)
	}
}
