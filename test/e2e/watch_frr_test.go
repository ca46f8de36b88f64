//go:build routing

package e2e

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSpeakerWatchesLoadBalancers: the speaker watches only LoadBalancer
// Services (the API server filters by spec.type), so a Service whose type
// changes leaves its cache through the watch's delete — and its route goes
// — and enters it again, with its new VIP announced, when it is a
// LoadBalancer again.
func TestSpeakerWatchesLoadBalancers(t *testing.T) {
	e := newEnv(t)
	frr, _, _ := e.announcedPool(`{}`)
	vip := e.servedService()
	e.waitTable("FRR", frr, map[string]route{vip.String() + "/32": {nextHop: "10.0.0.2"}})

	setType := func(typ v1.ServiceType) {
		t.Helper()
		svcs := e.CP.Client.CoreV1().Services("web")
		s, err := svcs.Get(context.Background(), "a", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Spec.Type = typ
		if _, err := svcs.Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("web/a to %s: %v", typ, err)
		}
	}
	setType(v1.ServiceTypeNodePort)
	e.waitTable("FRR, web/a a NodePort Service", frr, map[string]route{})
	setType(v1.ServiceTypeLoadBalancer)
	again := e.waitVIP("web", "a")
	e.waitTable("FRR, web/a a LoadBalancer again", frr, map[string]route{again.String() + "/32": {nextHop: "10.0.0.2"}})
}
