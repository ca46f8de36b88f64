package bgp

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// TestBFDReasonBeforeTheWatcher: Sessions reads a session's state from
// gobgp and its reason from what the watcher has seen. Right after a BFD
// failure reset an Established session, gobgp already says Idle while the
// watcher has not yet seen the change (CI runs 22 and 23, under load:
// TestBFDWithBIRD and TestBFDWithFRR read gobgp's "notification-sent code
// 6(cease) subcode 4" as the reason). The reason is the BFD failure.
func TestBFDReasonBeforeTheWatcher(t *testing.T) {
	// A peer on loopback that nothing answers: gobgp never has it
	// Established; the test plays what the watcher last saw.
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
	const why = "BFD session down: control detection time expired"
	g.smu.Lock()
	tr := g.states[router.String()]
	tr.state, tr.reason, tr.bfdDown = "Established", "", why
	g.smu.Unlock()
	ss, err := g.Sessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 1 || ss[0].State == "Established" || !strings.Contains(ss[0].Reason, why) {
		t.Errorf("sessions %+v, want one not Established, for %q", ss, why)
	}
}
