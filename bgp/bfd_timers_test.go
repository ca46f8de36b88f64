package bgp_test

import (
	"testing"
	"time"

	"github.com/vipcast/vipcast/bgp"
)

// TestBFDRefusedTimers: SetPeers refuses BFD timers no session can run
// with, naming the peer, and changes nothing.
func TestBFDRefusedTimers(t *testing.T) {
	s, _ := newSpeaker(t, "127.0.9.12")
	err := s.SetPeers(ctxT(), []bgp.Peer{{Name: "tor", Address: ip("127.0.9.11"), ASN: routerASN, LocalASN: localASN,
		BFD: &bgp.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond}}})
	if err == nil {
		t.Fatal("multiplier 0 accepted")
	}
	t.Log(err)
	if ss, _ := s.Sessions(ctxT()); len(ss) != 0 {
		t.Fatalf("sessions %+v after a refused SetPeers", ss)
	}
}
