//go:build controlplane

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/test/ccmtest"
)

// TestPoolDeletionProtection: an IPPool carries the vipcast.io/pool-protection
// finalizer; deleting it while a Service holds one of its addresses leaves
// it Terminating, with Ready=False (reason Terminating) and a Warning Event
// that name the holder; the Service keeps its VIP and no new VIP comes from
// the pool. Once the last holder is deleted, the pool goes.
func TestPoolDeletionProtection(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	e.mustApplyPools("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: prot}\nspec: {addresses: [10.100.3.0/28]}\n")
	e.StartCCM("a")
	e.Namespace("web", nil)
	e.createService(ccmtest.LBService("web", "holder"))
	vip := e.waitVIP("web", "holder")
	e.Eventually(30*time.Second, "the pool-protection finalizer on IPPool prot", func() (bool, error) {
		fin := e.getPool("prot").GetFinalizers()
		return slices.Contains(fin, "vipcast.io/pool-protection"), fmt.Errorf("finalizers %v", fin)
	})

	if err := e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).Delete(context.Background(), "prot", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Eventually(30*time.Second, "IPPool prot Ready=False Terminating naming web/holder", func() (bool, error) {
		st, reason, msg := e.poolCondition("prot", "Ready")
		return st == "False" && reason == "Terminating" && strings.Contains(msg, "web/holder"), fmt.Errorf("Ready=%s reason=%s message=%q", st, reason, msg)
	})
	e.waitEventReason("default", "prot", v1.EventTypeWarning, "DeletionBlocked", "web/holder", "1 Service")
	if e.getPool("prot") == nil {
		t.Fatal("IPPool prot was deleted while web/holder holds one of its addresses")
	}
	e.touchService("web", "holder", "1")
	e.keepsVIP(3*time.Second, "web", "holder", vip)
	// A Terminating pool hands out nothing new.
	e.createService(ccmtest.LBService("web", "late", withAnnotation(ccm.AnnotationPool, "prot")))
	e.waitEvent("web", "late", "prot", "being deleted")

	for _, name := range []string{"holder", "late"} {
		if err := e.CP.Client.CoreV1().Services("web").Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.Eventually(30*time.Second, "IPPool prot to be deleted once no Service holds its addresses", func() (bool, error) {
		u := e.getPool("prot")
		if u == nil {
			return true, nil
		}
		_, _, msg := e.poolCondition("prot", "Ready")
		return false, fmt.Errorf("still there: finalizers %v, Ready message %q", u.GetFinalizers(), msg)
	})
}
