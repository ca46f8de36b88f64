package v1alpha1

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// OlderFirst orders objects by creation time, then namespace/name. It is
// vipcast's precedence rule wherever two objects compete: of two
// overlapping IPPools the older one wins, of two BGPPeers with the same
// address on a node the older one wins (ShadowedPeers), and VIPs are
// restored from the oldest Service first. The CCM and the speaker must agree on it.
func OlderFirst(a, b metav1.Object) bool { return CompareAge(a, b) < 0 }

// CompareAge is OlderFirst as a comparison for slices.SortFunc: negative
// when a is older, positive when b is, 0 for the same object.
func CompareAge(a, b metav1.Object) int {
	ta, tb := a.GetCreationTimestamp(), b.GetCreationTimestamp()
	if !ta.Equal(&tb) {
		return ta.Compare(tb.Time)
	}
	return strings.Compare(a.GetNamespace()+"/"+a.GetName(), b.GetNamespace()+"/"+b.GetName())
}
