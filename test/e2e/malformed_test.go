//go:build routing

package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/vipcast/vipcast/bgp/bgptest"
	"github.com/vipcast/vipcast/test/ccmtest"
	"github.com/vipcast/vipcast/test/routers"
)

// TestSpeakerMalformedUpdates runs vipcast-speaker with two routers: a
// real FRR and a raw BGP peer that sends it the UPDATEs of GoBGP's 2026
// remote-crash advisories, then a fuzzed corpus. The speaker process must
// never exit; the attacking session may reset; FRR's session stays
// Established throughout, never re-established, with the speaker's routes
// exactly as they were.
func TestSpeakerMalformedUpdates(t *testing.T) {
	e := newEnv(t)
	speakerAddr := netip.MustParseAddr("127.0.0.2")
	frr := routers.StartFRR(t, routers.FRRConfig{ASN: 64500, ListenAddress: netip.MustParseAddr("127.0.0.1"),
		Neighbors: []routers.FRRNeighbor{{Address: speakerAddr, ASN: 64501}}})
	const attackerASN = 64510
	atk := bgptest.StartRawPeer(t, netip.MustParseAddr("127.0.0.5"), attackerASN)

	e.node("node-a", nil, "10.0.0.2")
	e.mustApplyPools(classPool)
	e.applyPeer(peerDoc("frr", frr.Address, frr.Port, 64500, 64501, ""))
	e.applyPeer(peerDoc("attacker", atk.Addr, atk.Port, attackerASN, 64501, ""))
	sp := e.startSpeaker("node-a")
	if err := frr.WaitEstablished(speakerAddr, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := atk.WaitEstablished(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	e.Namespace("web", nil)
	e.publish(ccmtest.LBService("web", "cluster"), "10.100.0.10")
	e.endpoints("web", "cluster", endpoint{node: "node-b", ip: "10.244.2.5", ready: true})
	want := map[string]route{"10.100.0.10/32": {nextHop: "10.0.0.2"}}
	e.waitTable("FRR", frrTable(frr), want)
	before, err := frr.Neighbor(speakerAddr)
	if err != nil {
		t.Fatal(err)
	}

	alive := func(bgptest.Attack, bgptest.Outcome) error {
		if sp.Exited() {
			return errors.New("vipcast-speaker exited")
		}
		n, err := frr.Neighbor(speakerAddr)
		switch {
		case err != nil:
			return err
		case n.State != "Established" || n.EstablishedCount != before.EstablishedCount || n.DroppedCount != before.DroppedCount:
			return fmt.Errorf("FRR's session with the speaker: %+v, was %+v", n, before)
		}
		return tableIs(frrTable(frr), want)
	}
	tgt := bgptest.Target{ASN: attackerASN, NextHop: netip.MustParseAddr("192.0.2.1"), Prefix: netip.MustParsePrefix("10.99.1.0/24")}
	if o, err := atk.Send(tgt.WellFormed(), 300*time.Millisecond); err != nil || !o.Kept {
		t.Fatalf("well-formed UPDATE: %v, %v", o, err)
	}
	res := atk.Attack(t, tgt.Advisories(), bgptest.AttackRun{
		Settle: 300 * time.Millisecond, Reconnect: 15 * time.Second, Verbose: true, Check: alive,
	})
	t.Logf("advisories: %d sent, session kept after %d, reset after %d", res.Sent, res.Kept, res.Reset)

	start := time.Now()
	// bgp/'s TestMalformedUpdates sends the larger corpus; this one checks
	// the binary with fewer (each session reset costs gobgp's ~7 s).
	res = atk.Attack(t, tgt.Fuzzed(7606, 80), bgptest.AttackRun{
		Settle: 150 * time.Millisecond, Reconnect: 15 * time.Second, Budget: 40 * time.Second, Check: alive,
	})
	t.Logf("fuzzed corpus (seed 7606): %d sent in %s, session kept after %d, reset after %d",
		res.Sent, time.Since(start).Round(time.Second), res.Kept, res.Reset)
	if res.Sent < 25 {
		t.Errorf("only %d fuzzed UPDATEs sent within the budget, want at least 25", res.Sent)
	}
	if err := atk.WaitEstablished(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := alive(bgptest.Attack{}, bgptest.Outcome{}); err != nil {
		t.Fatal(err)
	}
}
