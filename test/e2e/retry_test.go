//go:build controlplane

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/test/ccmtest"
)

// TestFailedServicesRetriedOnChange: a Service that could not get a VIP is
// retried as soon as an address may have become available, not after its
// back-off: when the IPPool it names is created, and when another Service
// releases the address it waits for. Each has failed three times first, so
// its next back-off retry is 20 s away (5 s doubling); the test wants the
// VIP well before that, which only the immediate retry gives.
func TestFailedServicesRetriedOnChange(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	const (
		failures = 3                // 5 s + 10 s of back-off; the next is 20 s
		soon     = 10 * time.Second // half the next back-off
	)
	e := newEnv(t)
	e.mustApplyPools("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: one}\nspec: {addresses: [10.100.9.1/32]}\n")
	e.StartCCM("a")
	e.Namespace("retry", nil)
	e.createService(ccmtest.LBService("retry", "holder", withAnnotation(ccm.AnnotationPool, "one")))
	e.waitVIP("retry", "holder")
	e.createService(ccmtest.LBService("retry", "waits-for-address", withAnnotation(ccm.AnnotationPool, "one")))
	e.createService(ccmtest.LBService("retry", "waits-for-pool", withAnnotation(ccm.AnnotationPool, "later")))
	for _, name := range []string{"waits-for-address", "waits-for-pool"} {
		e.Eventually(90*time.Second, fmt.Sprintf("%d failed syncs of retry/%s", failures, name), func() (bool, error) {
			n := e.failedSyncs("retry", name)
			return n >= failures, fmt.Errorf("%d failed syncs", n)
		})
	}

	start := time.Now()
	e.mustApplyPools("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: later}\nspec: {addresses: [10.100.9.16/32]}\n")
	e.Eventually(soon, "retry/waits-for-pool to get a VIP once its pool exists", func() (bool, error) {
		ips := e.serviceVIPs("retry", "waits-for-pool")
		return len(ips) == 1, fmt.Errorf("VIPs %v", ips)
	})
	t.Logf("retry/waits-for-pool got its VIP %v after its pool was created", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	if err := e.CP.Client.CoreV1().Services("retry").Delete(context.Background(), "holder", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Eventually(soon, "retry/waits-for-address to get the VIP retry/holder released", func() (bool, error) {
		ips := e.serviceVIPs("retry", "waits-for-address")
		return len(ips) == 1 && ips[0].String() == "10.100.9.1", fmt.Errorf("VIPs %v", ips)
	})
	t.Logf("retry/waits-for-address got its VIP %v after retry/holder was deleted", time.Since(start).Round(time.Millisecond))
}

// failedSyncs counts the SyncLoadBalancerFailed Events on a Service,
// repeats included.
func (e *env) failedSyncs(ns, name string) int {
	evs, err := e.CP.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: "involvedObject.name=" + name + ",reason=SyncLoadBalancerFailed",
	})
	if err != nil {
		e.T.Fatal(err)
	}
	n := 0
	for _, ev := range evs.Items {
		if ev.Type == v1.EventTypeWarning {
			n += int(max(ev.Count, 1))
		}
	}
	return n
}
