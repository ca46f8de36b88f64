//go:build routing

package e2e

import (
	"context"
	"flag"
	"net/netip"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/test/harness"
	"github.com/vipcast/vipcast/test/routers"
)

// bfdTrials is how many times TestSpeakerFabricBFD freezes a speaker;
// `make bench` runs more.
var bfdTrials = flag.Int("bfd-trials", 20, "SIGSTOP trials of TestSpeakerFabricBFD")

// TestSpeakerFabricBFD is the namespace tier with BFD at 100ms x 3 between
// each speaker and FRR's bfdd, and a 9s hold time: both BFD sessions come
// Up with the configured timers; a frozen speaker (SIGSTOP) leaves the
// ToR's ECMP route through BFD, long before the hold time, every time,
// and comes back when thawed; a timer change in the BGPPeer is
// renegotiated without a BFD or BGP flap; removing bfd from the BGPPeer
// takes the BFD sessions AdminDown, which the ToR does not count as a
// failure.
func TestSpeakerFabricBFD(t *testing.T) {
	e := newEnv(t)
	const holdTime = 9 * time.Second
	b := &routers.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3}
	f := newFabric(t, e, fabricOptions{HoldTime: holdTime, KeepaliveTime: 3 * time.Second, BFD: b})
	nodes := []netip.Addr{f.node1, f.node2}
	for _, a := range nodes {
		p := torBFDUp(t, f, a)
		if p.RemoteTransmitInterval != b.MinTx || p.RemoteReceiveInterval != b.MinRx || p.RemoteDetectMultiplier != b.Multiplier {
			t.Errorf("ToR's BFD session with %s: remote timers tx %v rx %v x%d, want %v %v x%d", a,
				p.RemoteTransmitInterval, p.RemoteReceiveInterval, p.RemoteDetectMultiplier, b.MinTx, b.MinRx, b.Multiplier)
		}
	}
	for _, node := range []string{"node1", "node2"} {
		e.waitSpeakerStatus(node, "with BFD Up", func(st vipcastv1alpha1.SpeakerStatusStatus) bool {
			return len(st.Sessions) == 1 && st.Sessions[0].BFD == "Up"
		})
	}

	// Frozen speakers: BFD removes them, every time.
	target := time.Duration(b.Multiplier)*b.MinTx + 100*time.Millisecond
	var took, back []time.Duration
	for range *bfdTrials {
		if err := f.tor.WaitBFDUp(f.node2, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		f.speakers["node2"].Signal(syscall.SIGSTOP)
		d := waitNexthops(t, f.tor, f.vip, holdTime+5*time.Second, f.node1)
		took = append(took, d)
		f.speakers["node2"].Signal(syscall.SIGCONT)
		if d >= holdTime/3 {
			t.Errorf("frozen speaker left the ToR's route after %v: the hold timer (%v), not BFD, removed it", d, holdTime)
		}
		back = append(back, waitNexthops(t, f.tor, f.vip, 30*time.Second, f.node1, f.node2))
	}
	t.Logf("node2's speaker frozen (SIGSTOP): its next hop left the ToR's kernel route after %s (BFD %v x %d; hold time %v)",
		harness.Distribution(took, target), b.MinTx, b.Multiplier, holdTime)
	// A figure, not an assertion: gobgp's connection wait (up to 2 s) is
	// most of it.
	t.Logf("node2's speaker thawed: its next hop back in the ToR's kernel route after %s", harness.Distribution(back, 3*time.Second))
	// node1's BFD session never went down meanwhile.
	if p, err := f.tor.BFDPeer(f.node1); err != nil || p.SessionDownEvents != 0 {
		t.Errorf("node1's BFD session at the ToR: %+v, %v; want no down event", p, err)
	}

	// A timer change renegotiates without a flap.
	before := map[netip.Addr]routers.BFDPeer{}
	bgpBefore := map[netip.Addr]routers.NeighborState{}
	for _, a := range nodes {
		before[a] = torBFDUp(t, f, a)
		var err error
		if bgpBefore[a], err = f.tor.Neighbor(a); err != nil {
			t.Fatal(err)
		}
	}
	patchPeer(t, e, `{"spec":{"bfd":{"minTx":"300ms","minRx":"200ms","multiplier":4}}}`)
	for _, a := range nodes {
		deadline := time.Now().Add(20 * time.Second)
		for {
			p, err := f.tor.BFDPeer(a)
			if err != nil {
				t.Fatal(err)
			}
			if p.RemoteTransmitInterval == 300*time.Millisecond && p.RemoteReceiveInterval == 200*time.Millisecond && p.RemoteDetectMultiplier == 4 {
				if p.SessionDownEvents != before[a].SessionDownEvents || p.Status != "up" {
					t.Errorf("BFD session with %s flapped on the timer change: %+v (before %+v)", a, p, before[a])
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("BFD session with %s: %+v 20s after the timer change, want remote tx 300ms rx 200ms x4", a, p)
			}
			time.Sleep(50 * time.Millisecond)
		}
		n, err := f.tor.Neighbor(a)
		if err != nil {
			t.Fatal(err)
		}
		if n.EstablishedCount != bgpBefore[a].EstablishedCount || n.DroppedCount != bgpBefore[a].DroppedCount {
			t.Errorf("BGP session with %s reset on a BFD timer change: %+v, before %+v", a, n, bgpBefore[a])
		}
	}

	// bfd removed from the BGPPeer: the speakers take the BFD sessions
	// AdminDown (RFC 5882: not a failure). FRR 8.4's bgpd still drops
	// its BGP session when its BFD session goes down that way, so the
	// docs say to remove BFD on the router first; here the sessions and
	// the route come back without BFD.
	patchPeer(t, e, `{"spec":{"bfd":null}}`)
	for _, a := range nodes {
		deadline := time.Now().Add(20 * time.Second)
		for {
			p, err := f.tor.BFDPeer(a)
			if err != nil {
				t.Fatal(err)
			}
			if p.Status != "up" {
				if p.RemoteDiagnostic != "administratively down" {
					t.Errorf("ToR's BFD session with %s went %s with remote diagnostic %q, want administratively down", a, p.Status, p.RemoteDiagnostic)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("ToR's BFD session with %s still up 20s after bfd was removed", a)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for _, a := range nodes {
		if err := f.tor.WaitEstablished(a, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		var nbr map[string]struct {
			LastReset string `json:"lastResetDueTo"`
		}
		if err := f.tor.VtyshJSON("show bgp neighbors "+a.String()+" json", &nbr); err != nil {
			t.Fatal(err)
		}
		n, _ := f.tor.Neighbor(a)
		t.Logf("BGP session with %s after bfd was removed: dropped %d times before, %d now; FRR's last reset: %q",
			a, bgpBefore[a].DroppedCount, n.DroppedCount, nbr[a.String()].LastReset)
	}
	for _, node := range []string{"node1", "node2"} {
		e.waitSpeakerStatus(node, "without BFD", func(st vipcastv1alpha1.SpeakerStatusStatus) bool {
			return len(st.Sessions) == 1 && st.Sessions[0].BFD == "" && st.Sessions[0].State == "Established"
		})
	}
	waitNexthops(t, f.tor, f.vip, 20*time.Second, f.node1, f.node2)
}

// torBFDUp waits until the ToR's BFD session with a is up and returns it.
func torBFDUp(t *testing.T, f *fabric, a netip.Addr) routers.BFDPeer {
	t.Helper()
	if err := f.tor.WaitBFDUp(a, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	p, err := f.tor.BFDPeer(a)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// patchPeer merge-patches the fabric's BGPPeer "tor".
func patchPeer(t *testing.T, e *env, patch string) {
	t.Helper()
	if _, err := e.CP.Dynamic.Resource(vipcastv1alpha1.BGPPeersResource).Patch(context.Background(), "tor", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patching BGPPeer tor with %s: %v", patch, err)
	}
}
