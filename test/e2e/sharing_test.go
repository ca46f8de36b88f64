//go:build controlplane

package e2e

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/test/ccmtest"
)

const sharingPools = `
apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: share}
spec:
  addresses: ["10.70.0.0/28"]
`

func withSelector(sel map[string]string) ccmtest.ServiceOption {
	return func(s *v1.Service) { s.Spec.Selector = sel }
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
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	e.mustApplyPools(sharingPools)
	e.StartCCM("a")
	e.Namespace("team-a", nil)

	app := withSelector(map[string]string{"app": "web"})
	key := withAnnotation(ccm.AnnotationSharingKey, "web")
	e.createService(ccmtest.LBService("team-a", "web", key, app, withAnnotation(ccm.AnnotationIPs, "10.70.0.5"), withPorts(80)))
	if ip := e.waitVIP("team-a", "web"); ip.String() != "10.70.0.5" {
		t.Fatalf("team-a/web got %s, want 10.70.0.5", ip)
	}
	before := e.snapshotAll("team-a")

	// Case 2: a Local Service with the same key and pods, on other ports.
	e.createService(ccmtest.LBService("team-a", "local-asks", key, app, withLocal(), withAnnotation(ccm.AnnotationIPs, "10.70.0.5"), withPorts(443)))
	e.createService(ccmtest.LBService("team-a", "local-auto", key, app, withLocal(), withPorts(8443)))
	e.waitEvent("team-a", "local-asks", "10.70.0.5", "team-a/web",
		"team-a/local-asks has externalTrafficPolicy Local and team-a/web has Cluster",
		"give both the same externalTrafficPolicy")
	if ip := e.waitVIP("team-a", "local-auto"); ip.String() == "10.70.0.5" {
		t.Errorf("team-a/local-auto (Local) joined team-a/web's (Cluster) VIP %s", ip)
	}

	// Case 3: a Service of another namespace with the same key.
	e.Namespace("team-b", nil)
	e.createService(ccmtest.LBService("team-b", "asks", key, withAnnotation(ccm.AnnotationIPs, "10.70.0.5"), withPorts(22)))
	e.createService(ccmtest.LBService("team-b", "auto", key, withPorts(2222)))
	e.waitEvent("team-b", "asks", "10.70.0.5", "team-a/web", "sharing keys are per namespace",
		ccm.AnnotationAllowSharedIPAcrossNamespaces, "team-b/asks does not name team-a; team-a/web does not name team-b")
	if ip := e.waitVIP("team-b", "auto"); ip.String() == "10.70.0.5" {
		t.Errorf("team-b/auto joined team-a/web's VIP %s across namespaces", ip)
	}
	// Naming the other namespace on one side only changes nothing.
	namesA := withAnnotation(ccm.AnnotationAllowSharedIPAcrossNamespaces, "team-a")
	e.createService(ccmtest.LBService("team-b", "asks-opted-in", key, namesA, withAnnotation(ccm.AnnotationIPs, "10.70.0.5"), withPorts(23)))
	e.waitEvent("team-b", "asks-opted-in", "team-a/web", "team-a/web does not name team-b")
	// When each names the other's namespace, they share.
	e.Namespace("team-c", nil)
	e.createService(ccmtest.LBService("team-a", "dns", withAnnotation(ccm.AnnotationSharingKey, "dns"),
		withAnnotation(ccm.AnnotationAllowSharedIPAcrossNamespaces, "team-c"), withPorts(53)))
	dns := e.waitVIP("team-a", "dns")
	e.createService(ccmtest.LBService("team-c", "dns", withAnnotation(ccm.AnnotationSharingKey, "dns"), namesA, withPorts(5353)))
	if ip := e.waitVIP("team-c", "dns"); ip != dns {
		t.Errorf("team-c/dns got %s, want to share team-a/dns's %s (each names the other)", ip, dns)
	}
	// team-b knows the key and names team-a, which does not name it: it
	// does not join (the old "true" let it).
	e.createService(ccmtest.LBService("team-b", "dns", withAnnotation(ccm.AnnotationSharingKey, "dns"), namesA,
		withAnnotation(ccm.AnnotationIPs, dns.String()), withPorts(5354)))
	e.waitEvent("team-b", "dns", dns.String(), "does not name team-b")
	// A malformed opt-in, and the old "true", are Events naming the
	// annotation and the fix.
	e.createService(ccmtest.LBService("team-b", "bad-opt-in", key, withAnnotation(ccm.AnnotationAllowSharedIPAcrossNamespaces, "Team_A")))
	e.waitEvent("team-b", "bad-opt-in", ccm.AnnotationAllowSharedIPAcrossNamespaces, `"Team_A" is not a namespace name`)
	e.createService(ccmtest.LBService("team-b", "any-opt-in", key, withAnnotation(ccm.AnnotationAllowSharedIPAcrossNamespaces, "true")))
	e.waitEvent("team-b", "any-opt-in", ccm.AnnotationAllowSharedIPAcrossNamespaces, "name the namespaces")

	// A Cluster Service of team-a with the same key still joins.
	e.createService(ccmtest.LBService("team-a", "cluster-auto", key, withPorts(8080)))
	if ip := e.waitVIP("team-a", "cluster-auto"); ip.String() != "10.70.0.5" {
		t.Errorf("team-a/cluster-auto got %s, want to share 10.70.0.5", ip)
	}

	now := e.ListServices("team-a", "team-b")
	checkUnchanged(t, before, now)
	for _, name := range []string{"team-a/local-asks", "team-b/asks", "team-b/asks-opted-in", "team-b/dns", "team-b/bad-opt-in", "team-b/any-opt-in"} {
		if ing := now[name].Status.LoadBalancer.Ingress; len(ing) != 0 {
			t.Errorf("%s got %v despite the refusal", name, ing)
		}
	}
}

// TestSharingUpgrade: Services that share a VIP the way an earlier release
// allowed (their status written before this CCM starts) keep it across the
// CCM's restore, each gets a LegacySharedVIP Event naming the other, and a
// newcomer cannot join them that way.
func TestSharingUpgrade(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	e.mustApplyPools(sharingPools)
	e.Namespace("team-a", nil)

	app := withSelector(map[string]string{"app": "old"})
	key := withAnnotation(ccm.AnnotationSharingKey, "old")
	published := func(s *v1.Service, ip string) {
		s = e.createService(s)
		s.Status.LoadBalancer = *lbStatusFor(ip)
		if _, err := e.CP.Client.CoreV1().Services(s.Namespace).UpdateStatus(context.Background(), s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	published(ccmtest.LBService("team-a", "old-cluster", key, app, withPorts(80)), "10.70.0.9")
	published(ccmtest.LBService("team-a", "old-local", key, app, withLocal(), withPorts(443)), "10.70.0.9")
	// Keys were cluster-wide: a Service of team-b shares team-a's VIP.
	e.Namespace("team-b", nil)
	published(ccmtest.LBService("team-a", "old-web", key, withPorts(80)), "10.70.0.10")
	published(ccmtest.LBService("team-b", "old-web", key, withPorts(443)), "10.70.0.10")
	// Both opted in with the old "true", which this release refuses: they
	// keep the VIP they share.
	anyNS := withAnnotation(ccm.AnnotationAllowSharedIPAcrossNamespaces, "true")
	published(ccmtest.LBService("team-a", "old-dns", withAnnotation(ccm.AnnotationSharingKey, "dns"), anyNS, withPorts(53)), "10.70.0.11")
	published(ccmtest.LBService("team-b", "old-dns", withAnnotation(ccm.AnnotationSharingKey, "dns"), anyNS, withPorts(5353)), "10.70.0.11")
	before := e.snapshotAll("team-a", "team-b")

	e.StartCCM("a")
	e.waitEventReason("team-a", "old-local", v1.EventTypeWarning, ccm.ReasonLegacySharedVIP,
		"keeps its VIP", "team-a/old-cluster", "externalTrafficPolicy")
	e.waitEventReason("team-a", "old-cluster", v1.EventTypeWarning, ccm.ReasonLegacySharedVIP, "team-a/old-local")
	for _, name := range []string{"old-cluster", "old-local"} {
		e.waitEventReason("team-a", name, v1.EventTypeNormal, "EnsuredLoadBalancer")
	}

	e.waitEventReason("team-b", "old-web", v1.EventTypeWarning, ccm.ReasonLegacySharedVIP,
		"team-a/old-web", "per namespace", ccm.AnnotationAllowSharedIPAcrossNamespaces)
	e.waitEventReason("team-a", "old-web", v1.EventTypeWarning, ccm.ReasonLegacySharedVIP, "team-b/old-web")
	for _, key := range []string{"team-a/old-web", "team-b/old-web"} {
		ns, name, _ := strings.Cut(key, "/")
		e.waitEventReason(ns, name, v1.EventTypeNormal, "EnsuredLoadBalancer")
	}

	e.waitEventReason("team-b", "old-dns", v1.EventTypeWarning, ccm.ReasonLegacySharedVIP, "team-a/old-dns", "does not name team-a")
	e.waitEvent("team-a", "old-dns", ccm.AnnotationAllowSharedIPAcrossNamespaces, "name the namespaces")

	// Newcomers follow today's rules against every holder.
	e.createService(ccmtest.LBService("team-a", "new-cluster", key, app, withAnnotation(ccm.AnnotationIPs, "10.70.0.9"), withPorts(8080)))
	e.waitEvent("team-a", "new-cluster", "10.70.0.9", "team-a/old-local", "externalTrafficPolicy")
	e.createService(ccmtest.LBService("team-a", "new-web", key, withAnnotation(ccm.AnnotationIPs, "10.70.0.10"), withPorts(8080)))
	e.waitEvent("team-a", "new-web", "10.70.0.10", "team-b/old-web", "per namespace")

	now := e.ListServices("team-a", "team-b")
	checkUnchanged(t, before, now)
}
