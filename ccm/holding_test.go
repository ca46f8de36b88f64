package ccm

import (
	"maps"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/poolspec"
)

// TestHoldingChanged: the pools' status is recomputed for a Service update
// that can change which pool holds which published address, and not for
// the rest (finalizer, Events' touches, other annotations, ports).
func TestHoldingChanged(t *testing.T) {
	base := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns", Annotations: map[string]string{AnnotationPool: "p"}},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer},
		Status:     v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: "192.0.2.1"}}}},
	}
	for _, tc := range []struct {
		name   string
		change func(*v1.Service)
		want   bool
	}{
		{"nothing", func(*v1.Service) {}, false},
		{"finalizer", func(s *v1.Service) { s.Finalizers = []string{"service.kubernetes.io/load-balancer-cleanup"} }, false},
		{"another annotation", func(s *v1.Service) { s.Annotations["x"] = "y" }, false},
		{"ports", func(s *v1.Service) { s.Spec.Ports = []v1.ServicePort{{Port: 80}} }, false},
		{"status address", func(s *v1.Service) { s.Status.LoadBalancer.Ingress[0].IP = "192.0.2.2" }, true},
		{"status cleared", func(s *v1.Service) { s.Status.LoadBalancer.Ingress = nil }, true},
		{"pool annotation", func(s *v1.Service) { s.Annotations[AnnotationPool] = "q" }, true},
		{"pool annotation removed", func(s *v1.Service) { delete(s.Annotations, AnnotationPool) }, true},
		{"record written", func(s *v1.Service) { s.Annotations[poolspec.AnnotationAllocatedFrom] = "q" }, true},
		{"record written, naming the requested pool", func(s *v1.Service) { s.Annotations[poolspec.AnnotationAllocatedFrom] = "p" }, false},
		{"type", func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeClusterIP }, true},
		{"class", func(s *v1.Service) { s.Spec.LoadBalancerClass = ptr.To("example.com/x") }, true},
	} {
		cur := base.DeepCopy()
		tc.change(cur)
		if got := holdingChanged(base, cur); got != tc.want {
			t.Errorf("%s: holdingChanged = %v, want %v", tc.name, got, tc.want)
		}
	}
	if !holdingChanged(base, "not a Service") {
		t.Error("an object that is not a Service must count as a change")
	}
}

// TestPoolAnnotations: the CCM records the pool of every Service's VIPs,
// and fills in the request only when the Service has none, never
// overwriting one its user wrote.
func TestPoolAnnotations(t *testing.T) {
	rec := poolspec.AnnotationAllocatedFrom
	for _, tc := range []struct {
		name string
		cur  map[string]string
		want map[string]string
	}{
		{"fresh auto-assigned Service", nil, map[string]string{rec: "p", AnnotationPool: "p"}},
		{"asked for p", map[string]string{AnnotationPool: "p"}, map[string]string{rec: "p"}},
		{"already recorded", map[string]string{AnnotationPool: "p", rec: "p"}, map[string]string{}},
		{"moved from q to p", map[string]string{AnnotationPool: "p", rec: "q"}, map[string]string{rec: "p"}},
		{"request edited meanwhile to another pool: kept", map[string]string{AnnotationPool: "other", rec: "q"}, map[string]string{rec: "p"}},
		{"published by a release without the record", map[string]string{AnnotationPool: "p", "unrelated": "x"}, map[string]string{rec: "p"}},
		{"asked for p in MetalLB's spelling: not doubled in vipcast's", map[string]string{"metallb.io/address-pool": "p"}, map[string]string{rec: "p"}},
		{"asked in MetalLB's older spelling", map[string]string{"metallb.universe.tf/address-pool": "p"}, map[string]string{rec: "p"}},
	} {
		if got := poolAnnotations(tc.cur, "p"); !maps.Equal(got, tc.want) {
			t.Errorf("%s: poolAnnotations(%v, p) = %v, want %v", tc.name, tc.cur, got, tc.want)
		}
	}
}
