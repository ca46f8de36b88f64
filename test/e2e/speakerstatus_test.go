//go:build controlplane

package e2e

import (
	"context"
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
)

// TestPeerStatusWithoutSpeakerStatuses: a CCM upgraded without this
// release's SpeakerStatus CRD (helm upgrade does not apply crds/) still
// writes the BGPPeers' Ready condition; the session counts stay 0.
func TestPeerStatusWithoutSpeakerStatuses(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	if err := e.CP.APIExtensions.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(),
		"speakerstatuses.vipcast.io", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.applyPeer(peerDoc("tor", netip.MustParseAddr("192.0.2.1"), 179, 64500, 64501, ""))
	e.StartCCM("first")
	e.waitPeerReady("tor", "True", vipcastv1alpha1.ReasonValid)
	e.waitPeerSessions("tor", 0, 0)
}
