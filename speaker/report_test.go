package speaker

import (
	"net/netip"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
)

// TestSessionChangedEvents checks the Events a session's changes record on
// its BGPPeer: one when BGP or BFD comes up or goes down, none for a
// change that leaves both as they were.
func TestSessionChangedEvents(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	rec := record.NewFakeRecorder(20)
	r := newReporter(rec, "node1")
	tor := &vipcastv1alpha1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "tor"}}
	peer := func(string) *vipcastv1alpha1.BGPPeer { return tor }
	addr := netip.MustParseAddr("192.0.2.1")
	steps := []struct {
		s    bgp.SessionState
		want []string
	}{
		{bgp.SessionState{State: "Active", BFD: "Down"}, nil},
		{bgp.SessionState{State: "Established", BFD: "Down"}, []string{"Normal SessionEstablished node node1: session with 192.0.2.1 established"}},
		{bgp.SessionState{State: "Established", BFD: "Init"}, nil},
		{bgp.SessionState{State: "Established", BFD: "Up"}, []string{"Normal BFDUp node node1: BFD session with 192.0.2.1 up"}},
		{bgp.SessionState{State: "Established", BFD: "Down", BFDDiag: "control detection time expired"},
			[]string{"Warning BFDDown node node1: BFD session with 192.0.2.1 went Down: control detection time expired"}},
		{bgp.SessionState{State: "Idle", BFD: "Down", Reason: "BFD session down: control detection time expired"},
			[]string{"Warning SessionDown node node1: session with 192.0.2.1 went down (Idle): BFD session down: control detection time expired"}},
		{bgp.SessionState{State: "Established", BFD: "Up"}, []string{
			"Normal BFDUp node node1: BFD session with 192.0.2.1 up",
			"Normal SessionEstablished node node1: session with 192.0.2.1 established"}},
		// A peer without BFD records nothing about BFD.
		{bgp.SessionState{State: "Established"}, nil},
	}
	for i, st := range steps {
		st.s.Peer, st.s.Address = "tor", addr
		r.sessionChanged(ctx, st.s, peer)
		var got []string
		for len(rec.Events) > 0 {
			got = append(got, <-rec.Events)
		}
		if !slices.Equal(got, st.want) {
			t.Errorf("step %d (%s, BFD %s): events %q, want %q", i, st.s.State, st.s.BFD, got, st.want)
		}
	}
}
