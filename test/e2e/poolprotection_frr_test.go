//go:build routing

package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/poolspec"
	"github.com/vipcast/vipcast/test/ccmtest"
	"github.com/vipcast/vipcast/test/routers"
)

// announcedPool sets up FRR, a speaker on node-a peered with it, a pool
// "vips" (10.100.0.10-10.100.0.20, the given spec.bgp) and a CCM; it
// returns FRR's table, the CCM and the speaker.
func (e *env) announcedPool(bgp string) (table, *ccmtest.CCM, *speakerProc) {
	e.T.Helper()
	speakerAddr := netip.MustParseAddr("127.0.0.2")
	frr := routers.StartFRR(e.T, routers.FRRConfig{ASN: 64500, ListenAddress: netip.MustParseAddr("127.0.0.1"),
		Neighbors: []routers.FRRNeighbor{{Address: speakerAddr, ASN: 64501}}})
	e.node("node-a", nil, "10.0.0.2")
	e.mustApplyPools(fmt.Sprintf("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: vips}\nspec: {addresses: [10.100.0.10-10.100.0.20], bgp: %s}\n", bgp))
	e.applyPeer(peerDoc("frr", frr.Address, frr.Port, 64500, 64501, ""))
	c := e.StartCCM("first")
	s := e.startSpeaker("node-a")
	if err := frr.WaitEstablished(speakerAddr, 30*time.Second); err != nil {
		e.T.Fatal(err)
	}
	return frrTable(frr), c, s
}

// servedService creates web/a with a ready endpoint, waits for its VIP
// and the annotations in which the CCM records its pool, and returns the
// VIP.
func (e *env) servedService() netip.Addr {
	e.T.Helper()
	e.Namespace("web", nil)
	e.createService(ccmtest.LBService("web", "a"))
	e.endpoints("web", "a", endpoint{node: "node-b", ip: "10.244.2.5", ready: true})
	vip := e.waitVIP("web", "a")
	e.Eventually(30*time.Second, "web/a annotated with pool vips", func() (bool, error) {
		s, err := e.CP.Client.CoreV1().Services("web").Get(context.Background(), "a", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return s.Annotations[ccm.AnnotationPool] == "vips" && s.Annotations[poolspec.AnnotationAllocatedFrom] == "vips",
			fmt.Errorf("annotations %v", s.Annotations)
	})
	return vip
}

// restartCCM stops c, starts another CCM and makes the service controller
// ensure web/a again.
func (e *env) restartCCM(c *ccmtest.CCM) {
	e.T.Helper()
	c.Stop(5 * time.Second)
	next := e.StartCCM("second")
	e.Eventually(30*time.Second, "the new CCM to lead", func() (bool, error) { return next.IsLeader(), nil })
	e.touchService("web", "a", "after-restart")
}

// TestPoolNarrowedKeepsVIP: narrowing a pool under a Service keeps the
// Service's VIP published (across a CCM restart) and announced with the
// pool's communities; the pool reports the address it holds outside its
// spec; a new Service gets an address inside the spec.
func TestPoolNarrowedKeepsVIP(t *testing.T) {
	e := newEnv(t)
	frr, first, _ := e.announcedPool(`{communities: ["64512:100"]}`)
	vip := e.servedService()
	if vip != netip.MustParseAddr("10.100.0.10") {
		t.Fatalf("web/a got %s, want the pool's lowest address 10.100.0.10", vip)
	}
	want := map[string]route{"10.100.0.10/32": {nextHop: "10.0.0.2", communities: []string{"64512:100"}}}
	e.waitTable("FRR", frr, want)

	e.patchPool("vips", `{"spec":{"addresses":["10.100.0.15-10.100.0.20"]}}`)
	e.Eventually(30*time.Second, "IPPool vips to report 10.100.0.10 held outside its spec by web/a", func() (bool, error) {
		st, reason, msg := e.poolCondition("vips", "HeldOutsideSpec")
		held, _, _ := unstructured.NestedInt64(e.getPool("vips").Object, "status", "heldOutsideSpec")
		return st == "True" && held == 1 && strings.Contains(msg, "10.100.0.10") && strings.Contains(msg, "web/a"),
			fmt.Errorf("heldOutsideSpec=%d condition %s/%s %q", held, st, reason, msg)
	})
	e.restartCCM(first)
	e.keepsVIP(5*time.Second, "web", "a", vip)
	e.waitTable("FRR", frr, want)

	// New allocations come from the spec only.
	e.createService(ccmtest.LBService("web", "b"))
	if got := e.waitVIP("web", "b"); got != netip.MustParseAddr("10.100.0.15") {
		t.Errorf("web/b got %s, want 10.100.0.15, the lowest address of the narrowed spec", got)
	}
	// The CCM's record (vipcast.io/allocated-from-pool), not the request
	// users edit, ties the VIP to its pool: with the request edited to a
	// pool that does not exist (which fails) or removed, web/a keeps its
	// VIP, still held by vips and announced (found by TestCCMModel: the
	// request alone used to be the record).
	e.patchService("web", "a", `{"metadata":{"annotations":{"vipcast.io/pool":"gone"}}}`)
	e.waitEventReason("web", "a", "Warning", "SyncLoadBalancerFailed", `pool "gone" does not exist`)
	e.keepsVIP(3*time.Second, "web", "a", vip)
	e.keepsTable(3*time.Second, "FRR", frr, want)
	e.patchService("web", "a", `{"metadata":{"annotations":{"vipcast.io/pool":null}}}`)
	e.touchService("web", "a", "request-removed")
	e.keepsVIP(3*time.Second, "web", "a", vip)
	e.keepsTable(3*time.Second, "FRR", frr, want)
	// Deleted, web/a lets its VIP go: nothing is held outside the spec.
	if err := e.CP.Client.CoreV1().Services("web").Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Eventually(30*time.Second, "IPPool vips to hold nothing outside its spec", func() (bool, error) {
		st, reason, msg := e.poolCondition("vips", "HeldOutsideSpec")
		return st == "False", fmt.Errorf("condition %s/%s %q", st, reason, msg)
	})
	e.waitTable("FRR", frr, map[string]route{}) // web/b has no endpoint
}

// TestPoolBrokenBGPKeepsVIP: a spec.bgp the speakers cannot use (a
// peerSelector with an unknown operator, which the API server accepts)
// refuses the pool for new VIPs, but the Service keeps its VIP across a
// CCM restart and every node keeps announcing it, with the communities
// that still decode.
func TestPoolBrokenBGPKeepsVIP(t *testing.T) {
	e := newEnv(t)
	frr, first, _ := e.announcedPool(`{communities: ["64512:100"]}`)
	vip := e.servedService()
	want := map[string]route{vip.String() + "/32": {nextHop: "10.0.0.2", communities: []string{"64512:100"}}}
	e.waitTable("FRR", frr, want)

	e.patchPool("vips", `{"spec":{"bgp":{"peerSelector":{"matchExpressions":[{"key":"fabric","operator":"Sometimes"}]}}}}`)
	e.Eventually(30*time.Second, "IPPool vips Ready=False InvalidSelector", func() (bool, error) {
		st, reason, msg := e.poolCondition("vips", "Ready")
		return st == "False" && reason == vipcastv1alpha1.ReasonInvalidSelector, fmt.Errorf("Ready=%s reason=%s message=%q", st, reason, msg)
	})
	e.restartCCM(first)
	e.keepsVIP(5*time.Second, "web", "a", vip)
	e.waitTable("FRR", frr, want)
	e.createService(ccmtest.LBService("web", "b", withAnnotation(ccm.AnnotationPool, "vips")))
	e.waitEvent("web", "b", "IPPool vips is not ready")
}
