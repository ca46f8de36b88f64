package bgp

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"k8s.io/klog/v2/ktesting"

	"github.com/vipcast/vipcast/bfd"
)

// TestBFDReasonSurvivesLateEstablished: gobgp's watcher can deliver the
// event of a session coming up after BFD has already failed and asked for
// the reset (CI saw it under load, TestBFDWithBIRD). That late event must
// not clear the BFD reason: the session that goes down next went down for
// BFD. An Established made after the failure (the session back) clears it.
func TestBFDReasonSurvivesLateEstablished(t *testing.T) {
	// A peer on loopback that nothing answers: the session never comes up
	// by itself; the test plays gobgp's events.
	router := netip.MustParseAddr("127.0.13.19")
	g, err := New(Config{RouterID: netip.MustParseAddr("127.0.13.18"), ListenPort: -1, Logger: ktesting.NewLogger(t, ktesting.NewConfig())})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); _ = g.Stop(context.Background()) })
	if err := g.SetPeers(ctx, []Peer{{Name: "router", Address: router, Port: 1, ASN: 65013, LocalASN: 64512}}); err != nil {
		t.Fatal(err)
	}
	event := func(state bgp.FSMState, at time.Time) {
		ev := &apiutil.WatchEventMessage_PeerEvent{Type: apiutil.PEER_EVENT_STATE}
		ev.Peer.State.NeighborAddress = router
		ev.Peer.State.SessionState = state
		g.onPeerEvent(ev, at)
	}
	reason := func() string {
		g.smu.Lock()
		defer g.smu.Unlock()
		return g.states[router.String()].reason
	}
	upAt := time.Now()
	g.handleBFD(ctx, bfd.Event{Key: "router", From: bfd.Up, To: bfd.Down, Diag: bfd.DiagDetectionTimeExpired, RemoteState: bfd.Up})
	event(bgp.BGP_FSM_ESTABLISHED, upAt) // made before the failure, delivered after it
	event(bgp.BGP_FSM_IDLE, time.Now())
	if r := reason(); !strings.Contains(r, "BFD session down") {
		t.Errorf("reason after a late Established and the reset: %q, want the BFD reason", r)
	}
	event(bgp.BGP_FSM_ESTABLISHED, time.Now()) // back, after the failure
	if r := reason(); r != "" {
		t.Errorf("reason once Established again: %q, want none", r)
	}
}
