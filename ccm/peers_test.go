package ccm

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
)

func TestPeerStatus(t *testing.T) {
	peer := &vipcastv1alpha1.BGPPeer{
		ObjectMeta: metav1.ObjectMeta{Name: "tor", Generation: 3},
		Spec:       vipcastv1alpha1.BGPPeerSpec{PeerAddress: "192.0.2.1", PeerASN: 64500, LocalASN: 64501},
	}
	st := peerStatus(peer, "", 0, 0)
	ready := meta.FindStatusCondition(st.Conditions, vipcastv1alpha1.ConditionReady)
	if st.ObservedGeneration != 3 || ready == nil || ready.Status != metav1.ConditionTrue || ready.Reason != vipcastv1alpha1.ReasonValid || ready.ObservedGeneration != 3 {
		t.Fatalf("valid peer: status %+v", st)
	}

	// Unchanged condition: the transition time stays.
	then := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	st.Conditions[0].LastTransitionTime = then
	peer.Status = st
	if again := peerStatus(peer, "", 0, 0); !again.Conditions[0].LastTransitionTime.Equal(&then) {
		t.Errorf("transition time moved from %v to %v without a change", then, again.Conditions[0].LastTransitionTime)
	}

	// A spec vipcast cannot use (stored before the schema refused it).
	peer.Generation = 4
	peer.Spec.PeerAddress = "192.0.2.1/32"
	st = peerStatus(peer, "", 0, 0)
	ready = meta.FindStatusCondition(st.Conditions, vipcastv1alpha1.ConditionReady)
	if ready.Status != metav1.ConditionFalse || ready.Reason != vipcastv1alpha1.ReasonInvalidConfig || ready.ObservedGeneration != 4 || ready.LastTransitionTime.Equal(&then) {
		t.Fatalf("invalid peer: condition %+v", ready)
	}
}

func TestPeerConflicts(t *testing.T) {
	peer := func(name, addr string, sec int, sel map[string]string) *vipcastv1alpha1.BGPPeer {
		p := &vipcastv1alpha1.BGPPeer{
			ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(1700000000+int64(sec), 0))},
			Spec:       vipcastv1alpha1.BGPPeerSpec{PeerAddress: addr, PeerASN: 64500, LocalASN: 64501},
		}
		if sel != nil {
			p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: sel}
		}
		return p
	}
	node := func(name string, lbls map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls}}
	}
	rackA, rackB := map[string]string{"rack": "a"}, map[string]string{"rack": "b"}
	nodes := []*corev1.Node{node("n3", rackB), node("n1", rackA), node("n2", rackA)}
	tests := []struct {
		name  string
		peers []*vipcastv1alpha1.BGPPeer
		nodes []*corev1.Node
		// want: peer → substrings of its conflict message
		want map[string][]string
	}{{
		name:  "different addresses",
		peers: []*vipcastv1alpha1.BGPPeer{peer("a", "192.0.2.1", 1, nil), peer("b", "192.0.2.2", 2, nil)},
		nodes: nodes,
	}, {
		name:  "both select every node: the newer conflicts, naming the older and the nodes",
		peers: []*vipcastv1alpha1.BGPPeer{peer("z-old", "192.0.2.1", 1, nil), peer("a-new", "192.0.2.1", 2, nil), peer("other", "192.0.2.2", 3, nil)},
		nodes: nodes,
		want:  map[string][]string{"a-new": {"spec.peerAddress 192.0.2.1", "older BGPPeer z-old", "nodes n1, n2, n3", "delete one of them", "nodeSelectors"}},
	}, {
		name:  "same creation time: the larger name conflicts",
		peers: []*vipcastv1alpha1.BGPPeer{peer("b", "192.0.2.1", 1, nil), peer("a", "192.0.2.1", 1, nil)},
		nodes: nodes,
		want:  map[string][]string{"b": {"BGPPeer a"}},
	}, {
		name:  "IPv4-mapped IPv6 is the IPv4 address",
		peers: []*vipcastv1alpha1.BGPPeer{peer("old", "192.0.2.1", 1, nil), peer("new", "::ffff:192.0.2.1", 2, nil)},
		nodes: nodes,
		want:  map[string][]string{"new": {"BGPPeer old"}},
	}, {
		name:  "disjoint nodeSelectors: no conflict",
		peers: []*vipcastv1alpha1.BGPPeer{peer("old", "192.0.2.1", 1, rackA), peer("new", "192.0.2.1", 2, rackB)},
		nodes: nodes,
	}, {
		name:  "overlapping selection only on existing nodes counts",
		peers: []*vipcastv1alpha1.BGPPeer{peer("old", "192.0.2.1", 1, rackA), peer("new", "192.0.2.1", 2, nil)},
		nodes: nodes,
		want:  map[string][]string{"new": {"BGPPeer old", "nodes n1, n2;"}},
	}, {
		name:  "no node selected by both (yet): no conflict",
		peers: []*vipcastv1alpha1.BGPPeer{peer("old", "192.0.2.1", 1, rackA), peer("new", "192.0.2.1", 2, nil)},
		nodes: []*corev1.Node{node("n3", rackB)},
	}, {
		name:  "no nodes at all: no conflict",
		peers: []*vipcastv1alpha1.BGPPeer{peer("old", "192.0.2.1", 1, nil), peer("new", "192.0.2.1", 2, nil)},
	}, {
		name: "the oldest overlapping peer is named",
		peers: []*vipcastv1alpha1.BGPPeer{
			peer("p1", "2001:db8::1", 1, rackB), peer("p2", "2001:db8::1", 2, rackA), peer("p3", "2001:db8::1", 3, nil),
		},
		nodes: nodes,
		want: map[string][]string{
			"p2": nil, // p2 and p1 select different nodes
			"p3": {"BGPPeer p1", "node n3;"},
		},
	}, {
		name: "an older peer that fails Check does not count",
		peers: []*vipcastv1alpha1.BGPPeer{
			func() *vipcastv1alpha1.BGPPeer {
				p := peer("old", "192.0.2.1", 1, nil)
				p.Spec.SourceAddress = "2001:db8::1"
				return p
			}(),
			peer("new", "192.0.2.1", 2, nil),
		},
		nodes: nodes,
	}, {
		name: "a different port is still the same address",
		peers: []*vipcastv1alpha1.BGPPeer{peer("old", "192.0.2.1", 1, nil), func() *vipcastv1alpha1.BGPPeer {
			p := peer("new", "192.0.2.1", 2, nil)
			p.Spec.Port = ptr.To[int32](1179)
			return p
		}()},
		nodes: nodes,
		want:  map[string][]string{"new": {"BGPPeer old"}},
	}, {
		name:  "more than three nodes are counted",
		peers: []*vipcastv1alpha1.BGPPeer{peer("old", "192.0.2.1", 1, nil), peer("new", "192.0.2.1", 2, nil)},
		nodes: append(slices.Clone(nodes), node("n4", nil), node("n5", nil)),
		want:  map[string][]string{"new": {"nodes n1, n2, n3 and 2 more"}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := peerConflicts(tc.peers, tc.nodes)
			for name, subs := range tc.want {
				if subs == nil {
					if msg, ok := got[name]; ok {
						t.Errorf("%s: conflict %q, want none", name, msg)
					}
					continue
				}
				msg, ok := got[name]
				if !ok {
					t.Errorf("%s: no conflict, want one", name)
				}
				for _, s := range subs {
					if !strings.Contains(msg, s) {
						t.Errorf("%s: message %q does not contain %q", name, msg, s)
					}
				}
			}
			for name, msg := range got {
				if tc.want[name] == nil {
					t.Errorf("%s: unexpected conflict %q", name, msg)
				}
			}
		})
	}
}
