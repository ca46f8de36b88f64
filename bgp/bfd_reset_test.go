//go:build routing

package bgp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"k8s.io/klog/v2/ktesting"

	"github.com/vipcast/vipcast/bfd"
	"github.com/vipcast/vipcast/bgp/bgptest"
)

// TestBFDResetOnlyEstablished checks the BGP reset a BFD failure asks for
// against a raw router on loopback: while the session is Established the
// router gets a Cease "Administrative Reset" and the session comes back;
// when the router ended the session first (before the failure, or at the
// same moment, as when a frozen node thaws), the session comes back and no
// reset is left queued in gobgp to end it the moment it comes up.
func TestBFDResetOnlyEstablished(t *testing.T) {
	self := netip.MustParseAddr("127.0.13.8")
	router := bgptest.StartRawPeer(t, netip.MustParseAddr("127.0.13.9"), 65013)
	g, err := New(Config{RouterID: self, ListenPort: -1, Logger: ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = g.Stop(context.Background()) })
	if err := g.SetPeers(ctx, []Peer{{Name: "router", Address: router.Addr, Port: uint16(router.Port), ASN: 65013, LocalASN: 64512, SourceAddress: self}}); err != nil {
		t.Fatal(err)
	}
	failure := bfd.Event{Key: "router", From: bfd.Up, To: bfd.Down, Diag: bfd.DiagDetectionTimeExpired, RemoteState: bfd.Up}
	// up waits for the router's nth session and then watches it for a
	// while: a reset queued in gobgp ends it within milliseconds.
	up := func(what string, n int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for router.Established() < n && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(2 * time.Second)
		if err := router.WaitEstablished(0); err != nil || router.Established() != n {
			t.Fatalf("%s: %d sessions established, the last one up: %v; want %d, up", what, router.Established(), err, n)
		}
	}
	up("the first session", 1)

	// Established: the failure resets the session.
	g.handleBFD(ctx, failure)
	deadline := time.Now().Add(5 * time.Second)
	for len(router.Notifications()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := router.Notifications(); len(n) != 1 || n[0].Code != 6 || n[0].Subcode != 4 {
		t.Fatalf("router got %v after a BFD failure of an Established session, want one Cease/Administrative Reset", n)
	}
	up("after the reset", 2)

	// The router ends the session, then BFD fails.
	router.Drop()
	for state := api.PeerState_SESSION_STATE_ESTABLISHED; state == api.PeerState_SESSION_STATE_ESTABLISHED; {
		if err := g.srv.ListPeer(ctx, &api.ListPeerRequest{Address: router.Addr.String()}, func(p *api.Peer) { state = p.GetState().GetSessionState() }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	g.handleBFD(ctx, failure)
	up("after the router ended the session before the BFD failure", 3)

	// BFD fails, and the router ends the session at the same moment:
	// either may win; the next session stays up either way.
	g.handleBFD(ctx, failure)
	router.Drop()
	up("after the router ended the session as BFD failed", 4)
	for _, n := range router.Notifications() {
		if n.Code != 6 || n.Subcode != 4 {
			t.Errorf("router got %v; want only Cease/Administrative Reset", router.Notifications())
		}
	}
}
