//go:build controlplane

package e2e

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/test/ccmtest"
)

// TestDataplaneConfigJudgedOnce: vipcast-ccm reports a Service whose
// scheduler annotation the dataplane cannot use with one
// InvalidDataplaneConfig Warning naming the value, and not again while it
// stays as it is (other changes sync the Service again); a new problem is
// reported anew. The Service gets its VIP all the same. (The API server
// itself refuses malformed ports and source ranges.)
func TestDataplaneConfigJudgedOnce(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	e.mustApplyPools(classPool)
	e.Namespace("web", nil)
	e.StartCCM("a")
	e.createService(ccmtest.LBService("web", "svc", withAnnotation("vipcast.io/scheduler", "bogus")))
	e.waitStatus("web", "svc", "a VIP", inVIPs)
	e.waitEventReason("web", "svc", v1.EventTypeWarning, ccm.ReasonInvalidDataplaneConfig, `"bogus"`, "vipcast.io/scheduler")

	count := func() (n int32) {
		evs, err := e.CP.Client.CoreV1().Events("web").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=svc"})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs.Items {
			if ev.Reason == ccm.ReasonInvalidDataplaneConfig {
				n += max(ev.Count, 1)
			}
		}
		return n
	}
	for i := range 3 {
		e.patchService("web", "svc", `{"metadata":{"labels":{"touch":"`+string(rune('a'+i))+`"}}}`)
	}
	time.Sleep(2 * time.Second)
	if n := count(); n != 1 {
		t.Errorf("%d InvalidDataplaneConfig Events after three more syncs, want 1", n)
	}
	e.patchService("web", "svc", `{"metadata":{"annotations":{"vipcast.io/scheduler":"fastest"}}}`)
	e.waitEventReason("web", "svc", v1.EventTypeWarning, ccm.ReasonInvalidDataplaneConfig, `"fastest"`)
}
