//go:build controlplane

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/test/ccmtest"
)

const badInputPools = `
apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: main}
spec:
  addresses: ["10.60.0.0/28"]
---
apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: tiny}
spec:
  addresses: ["10.61.0.1/32"]
  autoAssign: false
---
apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata: {name: ns-only}
spec:
  addresses: ["10.62.0.0/28"]
  autoAssign: false
  allocation: {namespaces: ["elsewhere"]}
`

// TestBadInput: every kind of bad request yields an Event naming the cause
// and a retry, and leaves every other Service's VIP alone.
func TestBadInput(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	e.mustApplyPools(badInputPools)
	e.StartCCM("a")
	e.Namespace("bad", nil)

	// A Service of another load-balancer implementation publishes
	// 10.60.0.7 (inside our pool): vipcast must never hand it out.
	foreign := ccmtest.LBService("bad", "foreign")
	class := "other.example/lb"
	foreign.Spec.LoadBalancerClass = &class
	foreign = e.createService(foreign)
	foreign.Status.LoadBalancer = *lbStatusFor("10.60.0.7")
	if _, err := e.CP.Client.CoreV1().Services("bad").UpdateStatus(context.Background(), foreign, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Good Services first; their VIPs must survive everything below.
	e.createService(ccmtest.LBService("bad", "g1"))
	e.createService(ccmtest.LBService("bad", "g2", withAnnotation(ccm.AnnotationIPs, "10.60.0.5")))
	e.createService(ccmtest.LBService("bad", "g3", withAnnotation(ccm.AnnotationIPs, "10.60.0.6"),
		withAnnotation(ccm.AnnotationSharingKey, "s")))
	e.createService(ccmtest.LBService("bad", "tiny1", withAnnotation(ccm.AnnotationPool, "tiny")))
	e.waitAllAllocated(30*time.Second, "bad", func(*v1.Service) int { return 1 })
	good := e.snapshot("bad")

	lbIPConflict := ccmtest.LBService("bad", "lbip-conflict", withAnnotation(ccm.AnnotationIPs, "10.60.0.9"))
	lbIPConflict.Spec.LoadBalancerIP = "10.60.0.10"
	cases := []struct {
		svc  *v1.Service
		want []string // substrings of the Event message
	}{
		{ccmtest.LBService("bad", "unknown-pool", withAnnotation(ccm.AnnotationPool, "nope")), []string{"nope"}},
		{ccmtest.LBService("bad", "outside", withAnnotation(ccm.AnnotationIPs, "192.0.2.77")), []string{"192.0.2.77"}},
		{ccmtest.LBService("bad", "taken", withAnnotation(ccm.AnnotationIPs, "10.60.0.5")), []string{"10.60.0.5", "bad/g2"}},
		{ccmtest.LBService("bad", "steal-foreign", withAnnotation(ccm.AnnotationIPs, "10.60.0.7")), []string{"10.60.0.7", "bad/foreign"}},
		{ccmtest.LBService("bad", "port-clash", withAnnotation(ccm.AnnotationIPs, "10.60.0.6"),
			withAnnotation(ccm.AnnotationSharingKey, "s")), []string{"bad/g3"}},
		{ccmtest.LBService("bad", "tiny2", withAnnotation(ccm.AnnotationPool, "tiny")), []string{"tiny"}},
		{ccmtest.LBService("bad", "bad-ips", withAnnotation(ccm.AnnotationIPs, "10.0.0.300")), []string{ccm.AnnotationIPs, "10.0.0.300"}},
		{ccmtest.LBService("bad", "bad-pool-name", withAnnotation(ccm.AnnotationPool, "Bad_Pool!")), []string{ccm.AnnotationPool}},
		{ccmtest.LBService("bad", "two-v4", withAnnotation(ccm.AnnotationIPs, "10.60.0.11,10.60.0.12")), []string{ccm.AnnotationIPs, "at most one VIP per family"}},
		{lbIPConflict, []string{"spec.loadBalancerIP", ccm.AnnotationIPs}},
		{ccmtest.LBService("bad", "wrong-ns", withAnnotation(ccm.AnnotationPool, "ns-only")), []string{"ns-only"}},
	}
	for _, c := range cases {
		e.createService(c.svc)
	}
	for _, c := range cases {
		e.waitEvent("bad", c.svc.Name, c.want...)
	}
	now := e.ListServices("bad")
	checkUnchanged(t, good, now)
	for _, c := range cases {
		if ing := now["bad/"+c.svc.Name].Status.LoadBalancer.Ingress; len(ing) != 0 {
			t.Errorf("bad/%s got %v despite its bad input", c.svc.Name, ing)
		}
	}
	checkNoDoubleHolders(t, now)

	// The error is retried: once g2 is gone, "taken" gets the address.
	if err := e.CP.Client.CoreV1().Services("bad").Delete(context.Background(), "g2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Eventually(90*time.Second, "bad/taken to get 10.60.0.5 after g2 released it", func() (bool, error) {
		s, err := e.CP.Client.CoreV1().Services("bad").Get(context.Background(), "taken", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ips := ingressIPs(t, s)
		return len(ips) == 1 && ips[0].String() == "10.60.0.5", nil
	})

	// Narrowing a pool's namespaces never takes a VIP from a Service that
	// already holds one from it, even though its pool annotation (written
	// by vipcast) names the pool.
	e.Eventually(30*time.Second, "bad/g1 to carry its pool annotation", func() (bool, error) {
		s, err := e.CP.Client.CoreV1().Services("bad").Get(context.Background(), "g1", metav1.GetOptions{})
		return err == nil && s.Annotations[ccm.AnnotationPool] == "main", err
	})
	// vipcast-ccm writes the pool's status meanwhile: a conflict is retried.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		main, err := e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).Get(context.Background(), "main", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := unstructured.SetNestedStringSlice(main.Object, []string{"elsewhere"}, "spec", "allocation", "namespaces"); err != nil {
			return err
		}
		_, err = e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).Update(context.Background(), main, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	e.Eventually(30*time.Second, "pool main's new generation to be loaded", func() (bool, error) {
		u, err := e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).Get(context.Background(), "main", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		gen, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
		return gen == u.GetGeneration(), nil
	})
	g1, err := e.CP.Client.CoreV1().Services("bad").Get(context.Background(), "g1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ensured := func() int32 {
		evs, err := e.CP.Client.CoreV1().Events("bad").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=g1,reason=EnsuredLoadBalancer"})
		if err != nil || len(evs.Items) == 0 {
			return 0
		}
		return evs.Items[0].Count
	}
	// Let the re-sync that the pool annotation itself caused finish first.
	time.Sleep(2 * time.Second)
	syncs := ensured()
	g1.Annotations["touch"] = "1" // makes the service controller sync g1 again
	if _, err := e.CP.Client.CoreV1().Services("bad").Update(context.Background(), g1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Eventually(30*time.Second, "bad/g1 to be synced again", func() (bool, error) {
		return ensured() > syncs, nil
	})
	evs, err := e.CP.Client.CoreV1().Events("bad").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=g1,reason=SyncLoadBalancerFailed"})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) > 0 {
		t.Errorf("g1 failed to sync after its pool was narrowed: %s", evs.Items[0].Message)
	}
	if g1, err = e.CP.Client.CoreV1().Services("bad").Get(context.Background(), "g1", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if ips := ingressIPs(t, g1); len(ips) != 1 || !equalAddrs(ips, good["bad/g1"]) {
		t.Errorf("g1's VIP changed from %v to %v", good["bad/g1"], ips)
	}
}

// TestPoolValidation: the API server rejects malformed IPPools, BGPPeers
// and NodeTunnels with a message naming the field; an overlapping pool (which only the CCM
// can see) is reported Ready=False and takes nothing from the older pool.
func TestPoolValidation(t *testing.T) {
	t.Parallel() // control plane and vipcast-ccm only (see TestMain)
	e := newEnv(t)
	// The samples of api/v1alpha1/testdata: every invalid one must be
	// rejected by the real API server with its field and message, every
	// valid one accepted.
	files, _ := filepath.Glob("../../api/v1alpha1/testdata/*.yaml")
	if len(files) == 0 {
		t.Fatal("no samples in api/v1alpha1/testdata")
	}
	rejected, accepted := 0, 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		valid := strings.HasSuffix(f, "-valid.yaml")
		for _, doc := range splitYAML(string(data)) {
			obj := mustUnstructured(t, doc)
			if obj.Object == nil {
				continue
			}
			res, ok := map[string]schema.GroupVersionResource{
				"IPPool": vipcastv1alpha1.IPPoolsResource, "BGPPeer": vipcastv1alpha1.BGPPeersResource,
				"NodeTunnel": vipcastv1alpha1.NodeTunnelsResource,
			}[obj.GetKind()]
			if !ok {
				t.Fatalf("%s: a sample of kind %q: add its resource here", f, obj.GetKind())
			}
			_, err := e.CP.Dynamic.Resource(res).Create(context.Background(), obj, metav1.CreateOptions{})
			ann := obj.GetAnnotations()
			switch {
			case valid && err != nil:
				t.Errorf("%s %s was rejected: %v", obj.GetKind(), obj.GetName(), err)
			case valid:
				accepted++
			case err == nil:
				t.Errorf("%s %s was accepted, want rejection at %s", obj.GetKind(), obj.GetName(), ann["test.vipcast.io/expect-field"])
			default:
				rejected++
				for _, w := range []string{ann["test.vipcast.io/expect-field"], ann["test.vipcast.io/expect-error"]} {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s %s: rejection does not mention %q: %v", obj.GetKind(), obj.GetName(), w, err)
					}
				}
			}
		}
	}
	t.Logf("API server rejected %d malformed samples and accepted %d valid ones", rejected, accepted)
	// Clear the valid samples so they cannot overlap the pools below.
	for _, res := range []schema.GroupVersionResource{vipcastv1alpha1.IPPoolsResource, vipcastv1alpha1.BGPPeersResource, vipcastv1alpha1.NodeTunnelsResource} {
		if err := e.CP.Dynamic.Resource(res).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Overlap: both are valid objects, the newer one is rejected by the CCM.
	e.mustApplyPools("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: older}\nspec: {addresses: [10.70.0.0/24]}\n")
	time.Sleep(1100 * time.Millisecond) // creation timestamps have one-second resolution
	e.mustApplyPools("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: newer}\nspec: {addresses: [10.70.0.128/25]}\n")
	e.StartCCM("a")
	e.Namespace("ov", nil)
	e.createService(ccmtest.LBService("ov", "s", withAnnotation(ccm.AnnotationIPs, "10.70.0.200")))
	e.Eventually(30*time.Second, "IPPool newer to be Ready=False naming the older pool", func() (bool, error) {
		ready, reason, msg := e.poolReady("newer")
		return ready == "False" && strings.Contains(msg, "older"), fmt.Errorf("Ready=%s reason=%s message=%q", ready, reason, msg)
	})
	e.Eventually(30*time.Second, "IPPool older to be Ready=True", func() (bool, error) {
		ready, _, _ := e.poolReady("older")
		return ready == "True", nil
	})
	// A pool the speakers could not announce (its aggregate would cover
	// addresses outside it; only the CCM can see that) hands out nothing.
	e.mustApplyPools("apiVersion: vipcast.io/v1alpha1\nkind: IPPool\nmetadata: {name: dark}\nspec: {addresses: [10.71.0.10-10.71.0.20], bgp: {aggregationLength: 24}}\n")
	e.Eventually(30*time.Second, "IPPool dark to be Ready=False naming spec.bgp.aggregationLength", func() (bool, error) {
		ready, reason, msg := e.poolReady("dark")
		return ready == "False" && reason == vipcastv1alpha1.ReasonInvalidAddresses && strings.Contains(msg, "spec.bgp.aggregationLength 24"),
			fmt.Errorf("Ready=%s reason=%s message=%q", ready, reason, msg)
	})
	e.createService(ccmtest.LBService("ov", "dark", withAnnotation(ccm.AnnotationIPs, "10.71.0.15")))
	e.waitEvent("ov", "dark", "10.71.0.15", "IPPool dark is not ready: InvalidAddresses: spec.bgp.aggregationLength 24")
	if s, err := e.CP.Client.CoreV1().Services("ov").Get(context.Background(), "dark", metav1.GetOptions{}); err != nil || len(s.Status.LoadBalancer.Ingress) != 0 {
		t.Fatalf("Service ov/dark from the unannounceable pool: ingress %v (err %v), want none", s.Status.LoadBalancer.Ingress, err)
	}
	e.waitAllAllocated(30*time.Second, "ov", func(s *v1.Service) int {
		if s.Name == "dark" {
			return 0
		}
		return 1
	})
	e.Eventually(30*time.Second, "ov/s to be annotated with pool older", func() (bool, error) {
		s, err := e.CP.Client.CoreV1().Services("ov").Get(context.Background(), "s", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ann := s.Annotations[ccm.AnnotationPool]
		return ann == "older", fmt.Errorf("annotation %q", ann)
	})
}

func (e *env) poolReady(name string) (status, reason, message string) {
	u, err := e.CP.Dynamic.Resource(vipcastv1alpha1.IPPoolsResource).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return "", "", err.Error()
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" {
			return fmt.Sprint(m["status"]), fmt.Sprint(m["reason"]), fmt.Sprint(m["message"])
		}
	}
	return "", "", "no Ready condition"
}
