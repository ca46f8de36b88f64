//go:build routing

package bgp_test

import (
	"testing"
	"time"

	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/test/routers"
)

// TestBFDWithoutRouterBFD: a router that runs no BFD still peers with a
// BGPPeer that asks for BFD (the BGP session does not wait for BFD), the
// session reports BFD Down, and changing, adding or removing BFD alone
// never resets the BGP session.
func TestBFDWithoutRouterBFD(t *testing.T) {
	self := ip("127.0.9.2")
	f := routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: ip("127.0.9.1"),
		Neighbors: []routers.FRRNeighbor{{Address: self, ASN: localASN}}})
	s, _ := newSpeaker(t, self.String())
	peer := bgp.Peer{Name: "frr", Address: f.Address, Port: uint16(f.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: self,
		BFD: &bgp.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3}}
	if err := s.SetPeers(ctxT(), []bgp.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	if err := f.WaitEstablished(self, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	session := func() bgp.SessionState { return onlySession(t, s) }
	// Three slow (1 s) detection times with no answer: still Down, no
	// effect on BGP.
	time.Sleep(3 * time.Second)
	if ss := session(); ss.State != "Established" || ss.BFD != "Down" || ss.BFDDowns != 0 {
		t.Fatalf("session %+v, want Established with BFD Down and no BFD down transition", ss)
	}
	before, err := f.Neighbor(self)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []*bgp.BFD{
		{MinTx: 300 * time.Millisecond, MinRx: 300 * time.Millisecond, Multiplier: 5},
		nil,
		{MinTx: 50 * time.Millisecond, MinRx: 50 * time.Millisecond, Multiplier: 3, Multihop: true},
	} {
		peer.BFD = b
		if err := s.SetPeers(ctxT(), []bgp.Peer{peer}); err != nil {
			t.Fatal(err)
		}
		want := "Down"
		if b == nil {
			want = ""
		}
		if ss := session(); ss.BFD != want {
			t.Fatalf("BFD %+v: session %+v, want BFD %q", b, ss, want)
		}
	}
	time.Sleep(time.Second)
	after, err := f.Neighbor(self)
	if err != nil {
		t.Fatal(err)
	}
	if after.State != "Established" || after.EstablishedCount != before.EstablishedCount || after.DroppedCount != before.DroppedCount {
		t.Fatalf("BGP session %+v after BFD-only changes, want it untouched (before %+v)", after, before)
	}
}
