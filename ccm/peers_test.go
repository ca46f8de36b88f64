package ccm

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
)

func TestPeerStatus(t *testing.T) {
	peer := &vipcastv1alpha1.BGPPeer{
		ObjectMeta: metav1.ObjectMeta{Name: "tor", Generation: 3},
		Spec:       vipcastv1alpha1.BGPPeerSpec{PeerAddress: "192.0.2.1", PeerASN: 64500, LocalASN: 64501},
	}
	st := peerStatus(peer)
	ready := meta.FindStatusCondition(st.Conditions, vipcastv1alpha1.ConditionReady)
	if st.ObservedGeneration != 3 || ready == nil || ready.Status != metav1.ConditionTrue || ready.Reason != vipcastv1alpha1.ReasonValid || ready.ObservedGeneration != 3 {
		t.Fatalf("valid peer: status %+v", st)
	}

	// Unchanged condition: the transition time stays.
	then := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	st.Conditions[0].LastTransitionTime = then
	peer.Status = st
	if again := peerStatus(peer); !again.Conditions[0].LastTransitionTime.Equal(&then) {
		t.Errorf("transition time moved from %v to %v without a change", then, again.Conditions[0].LastTransitionTime)
	}

	// A spec vipcast cannot use (stored before the schema refused it).
	peer.Generation = 4
	peer.Spec.PeerAddress = "192.0.2.1/32"
	st = peerStatus(peer)
	ready = meta.FindStatusCondition(st.Conditions, vipcastv1alpha1.ConditionReady)
	if ready.Status != metav1.ConditionFalse || ready.Reason != vipcastv1alpha1.ReasonInvalidConfig || ready.ObservedGeneration != 4 || ready.LastTransitionTime.Equal(&then) {
		t.Fatalf("invalid peer: condition %+v", ready)
	}
}
