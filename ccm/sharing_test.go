package ccm

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/vipcast/vipcast/ipam"
)

// inNamespace moves the Service to namespace ns.
func inNamespace(ns string) svcOption {
	return func(svc *v1.Service) { svc.Namespace = ns }
}

// TestSharingBetweenServices translates pairs of Services and asks the
// allocator whether the second may join the first's VIP: by asking for it
// (refused with a reason naming the first and the fix) and automatically
// (joins, or gets another VIP). The first Service's VIP never changes.
func TestSharingBetweenServices(t *testing.T) {
	key := withAnnotation(AnnotationSharingKey, "k")
	sel := withSelector(map[string]string{"app": "shop"})
	// shop's Services name other, other's name shop.
	withShop := withAnnotation(AnnotationAllowSharedIPAcrossNamespaces, "other")
	withOther := withAnnotation(AnnotationAllowSharedIPAcrossNamespaces, "shop, team-c")
	tests := []struct {
		name        string
		first, next []svcOption
		reason      ipam.Reason // "" shares
		frags       []string
	}{
		{
			name:  "both Cluster share",
			first: []svcOption{key, sel, withPorts(port("", 80))},
			next:  []svcOption{withName("api"), key, withPorts(port("", 443))},
		},
		{
			name:  "both Local with the same pods share",
			first: []svcOption{key, sel, withLocalPolicy(), withPorts(port("", 80))},
			next:  []svcOption{withName("api"), key, sel, withLocalPolicy(), withPorts(port("UDP", 80))},
		},
		{
			name:   "both Local with other pods",
			first:  []svcOption{key, sel, withLocalPolicy(), withPorts(port("", 80))},
			next:   []svcOption{withName("api"), key, withSelector(map[string]string{"app": "api"}), withLocalPolicy(), withPorts(port("", 443))},
			reason: ipam.ReasonPortClash,
			frags:  []string{"shop/web", "select the same pods"},
		},
		{
			name:   "Local joining Cluster",
			first:  []svcOption{key, sel, withPorts(port("", 80))},
			next:   []svcOption{withName("api"), key, sel, withLocalPolicy(), withPorts(port("", 443))},
			reason: ipam.ReasonPolicyClash,
			frags:  []string{"shop/api has externalTrafficPolicy Local and shop/web has Cluster", "give both the same externalTrafficPolicy"},
		},
		{
			name:   "Cluster joining Local",
			first:  []svcOption{key, sel, withLocalPolicy(), withPorts(port("", 80))},
			next:   []svcOption{withName("api"), key, sel, withPorts(port("", 443))},
			reason: ipam.ReasonPolicyClash,
			frags:  []string{"shop/api has externalTrafficPolicy Cluster and shop/web has Local"},
		},
		{
			name:   "another namespace with the same key",
			first:  []svcOption{key, withPorts(port("", 80))},
			next:   []svcOption{inNamespace("other"), key, withPorts(port("", 443))},
			reason: ipam.ReasonInUse,
			frags:  []string{"other/web", "shop/web, of another namespace", "sharing keys are per namespace", AnnotationAllowSharedIPAcrossNamespaces, "other/web does not name shop; shop/web does not name other"},
		},
		{
			name:   "another namespace, only the newcomer names the other",
			first:  []svcOption{key, withPorts(port("", 80))},
			next:   []svcOption{inNamespace("other"), key, withOther, withPorts(port("", 443))},
			reason: ipam.ReasonInUse,
			frags:  []string{"shop/web does not name other"},
		},
		{
			name:   "another namespace, the first names a third one",
			first:  []svcOption{key, withAnnotation(AnnotationAllowSharedIPAcrossNamespaces, "team-c"), withPorts(port("", 80))},
			next:   []svcOption{inNamespace("other"), key, withOther, withPorts(port("", 443))},
			reason: ipam.ReasonInUse,
			frags:  []string{"shop/web does not name other"},
		},
		{
			name:  "another namespace, each names the other",
			first: []svcOption{key, withShop, withPorts(port("", 80))},
			next:  []svcOption{inNamespace("other"), key, withOther, withPorts(port("", 443))},
		},
		{
			name:   "another namespace, each names the other, both Local with the same selector",
			first:  []svcOption{key, withShop, sel, withLocalPolicy(), withPorts(port("", 80))},
			next:   []svcOption{inNamespace("other"), key, withOther, sel, withLocalPolicy(), withPorts(port("", 443))},
			reason: ipam.ReasonPolicyClash,
			frags:  []string{"of another namespace", "a pod selector selects pods of its own namespace only", "use Cluster on both"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := ipam.New()
			if errs := a.SetPools([]ipam.Pool{{Name: "p", Addresses: []string{"192.0.2.0/29"}, AutoAssign: true}}); errs != nil {
				t.Fatal(errs)
			}
			assign := func(opts ...svcOption) (ipam.Assignment, error) {
				req, err := RequestFor(newService(opts...), nil)
				if err != nil {
					t.Fatalf("RequestFor: %v", err)
				}
				return a.Assign(req)
			}
			first, err := assign(tc.first...)
			if err != nil {
				t.Fatal(err)
			}
			vip := first.IPs[0].String()
			asked, err := assign(append(tc.next, withAnnotation(AnnotationIPs, vip))...)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("asking for the shared VIP: %v", err)
			case tc.reason == "" && asked.IPs[0].String() != vip:
				t.Fatalf("asking for the shared VIP got %v", asked.IPs)
			case tc.reason != "":
				if ipam.ReasonOf(err) != tc.reason {
					t.Fatalf("asking for the VIP: %v, want reason %s", err, tc.reason)
				}
				for _, f := range tc.frags {
					if !strings.Contains(err.Error(), f) {
						t.Errorf("error %q does not mention %q", err, f)
					}
				}
			}
			auto, err := assign(tc.next...)
			if err != nil {
				t.Fatal(err)
			}
			if shared := auto.IPs[0].String() == vip; shared != (tc.reason == "") {
				t.Errorf("automatic allocation got %v, shared = %v", auto.IPs, shared)
			}
			if got, _ := a.Assigned("shop/web"); got.IPs[0].String() != vip {
				t.Errorf("the first Service's VIP moved from %s to %v", vip, got.IPs)
			}
		})
	}
}
