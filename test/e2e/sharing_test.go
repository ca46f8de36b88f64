package e2e

import (
	"context"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipcast/vipcast/ccm"
)

const sharingPools = `
apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: share}
spec:
  addresses: ["10.70.0.0/28"]
`

func withLocal() svcOpt {
	return func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }
}

func withSelector(sel map[string]string) svcOpt {
	return func(s *v1.Service) { s.Spec.Selector = sel }
}

// waitVIP waits until ns/name has a VIP and returns it.
func (e *env) waitVIP(ns, name string) netip.Addr {
	e.t.Helper()
	var ip netip.Addr
	e.eventually(60*time.Second, ns+"/"+name+" to get a VIP", func() (bool, error) {
		s, err := e.cp.Client.CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if ips := ingressIPs(e.t, s); len(ips) > 0 {
			ip = ips[0]
			return true, nil
		}
		return false, nil
	})
	return ip
}

// snapshotAll returns the published VIPs of every Service in namespaces.
func (e *env) snapshotAll(namespaces ...string) map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	for _, ns := range namespaces {
		for k, v := range e.snapshot(ns) {
			out[k] = v
		}
	}
	return out
}

// TestSharingRefusals: a Service that may not share a VIP with its holder
// gets an Event naming the holder and the fix when it asks for the VIP, and
// another VIP when it does not; the holder's VIP never changes.
func TestSharingRefusals(t *testing.T) {
	e := newEnv(t)
	e.mustApplyPools(sharingPools)
	e.startCCM("a")
	e.namespace("team-a", nil)

	app := withSelector(map[string]string{"app": "web"})
	key := withAnnotation(ccm.AnnotationSharingKey, "web")
	e.createService(lbService("team-a", "web", key, app, withAnnotation(ccm.AnnotationIPs, "10.70.0.5"), withPorts(80)))
	if ip := e.waitVIP("team-a", "web"); ip.String() != "10.70.0.5" {
		t.Fatalf("team-a/web got %s, want 10.70.0.5", ip)
	}
	before := e.snapshotAll("team-a")

	// Case 2: a Local Service with the same key and pods, on other ports.
	e.createService(lbService("team-a", "local-asks", key, app, withLocal(), withAnnotation(ccm.AnnotationIPs, "10.70.0.5"), withPorts(443)))
	e.createService(lbService("team-a", "local-auto", key, app, withLocal(), withPorts(8443)))
	e.waitEvent("team-a", "local-asks", "10.70.0.5", "team-a/web",
		"team-a/local-asks has externalTrafficPolicy Local and team-a/web has Cluster",
		"give both the same externalTrafficPolicy")
	if ip := e.waitVIP("team-a", "local-auto"); ip.String() == "10.70.0.5" {
		t.Errorf("team-a/local-auto (Local) joined team-a/web's (Cluster) VIP %s", ip)
	}
	// A Cluster Service with the same key still joins.
	e.createService(lbService("team-a", "cluster-auto", key, withPorts(8080)))
	if ip := e.waitVIP("team-a", "cluster-auto"); ip.String() != "10.70.0.5" {
		t.Errorf("team-a/cluster-auto got %s, want to share 10.70.0.5", ip)
	}

	now := e.listServices("team-a")
	checkUnchanged(t, before, now)
	if ing := now["team-a/local-asks"].Status.LoadBalancer.Ingress; len(ing) != 0 {
		t.Errorf("team-a/local-asks got %v despite the refusal", ing)
	}
}

// TestSharingUpgrade: Services that share a VIP the way an earlier release
// allowed (their status written before this CCM starts) keep it across the
// CCM's restore, each gets a LegacySharedVIP Event naming the other, and a
// newcomer cannot join them that way.
func TestSharingUpgrade(t *testing.T) {
	e := newEnv(t)
	e.mustApplyPools(sharingPools)
	e.namespace("team-a", nil)

	app := withSelector(map[string]string{"app": "old"})
	key := withAnnotation(ccm.AnnotationSharingKey, "old")
	published := func(s *v1.Service, ip string) {
		s = e.createService(s)
		s.Status.LoadBalancer = *lbStatusFor(ip)
		if _, err := e.cp.Client.CoreV1().Services(s.Namespace).UpdateStatus(context.Background(), s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	published(lbService("team-a", "old-cluster", key, app, withPorts(80)), "10.70.0.9")
	published(lbService("team-a", "old-local", key, app, withLocal(), withPorts(443)), "10.70.0.9")
	before := e.snapshotAll("team-a")

	e.startCCM("a")
	e.waitEventReason("team-a", "old-local", v1.EventTypeWarning, ccm.ReasonLegacySharedVIP,
		"keeps its VIP", "team-a/old-cluster", "externalTrafficPolicy")
	e.waitEventReason("team-a", "old-cluster", v1.EventTypeWarning, ccm.ReasonLegacySharedVIP, "team-a/old-local")
	for _, name := range []string{"old-cluster", "old-local"} {
		e.waitEventReason("team-a", name, v1.EventTypeNormal, "EnsuredLoadBalancer")
	}

	// Newcomers follow today's rules against every holder.
	e.createService(lbService("team-a", "new-cluster", key, app, withAnnotation(ccm.AnnotationIPs, "10.70.0.9"), withPorts(8080)))
	e.waitEvent("team-a", "new-cluster", "10.70.0.9", "team-a/old-local", "externalTrafficPolicy")

	now := e.listServices("team-a")
	checkUnchanged(t, before, now)
}
