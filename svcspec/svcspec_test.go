package svcspec

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestProblems: each unusable port, scheduler annotation or source range
// is one problem naming the field; a usable Service has none.
func TestProblems(t *testing.T) {
	svc := func(f func(*v1.Service)) *v1.Service {
		s := &v1.Service{Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, Ports: []v1.ServicePort{{Port: 80, Protocol: v1.ProtocolTCP}}}}
		f(s)
		return s
	}
	for _, tc := range []struct {
		name string
		svc  *v1.Service
		want []string // one substring per problem
	}{
		{"usable", svc(func(s *v1.Service) {
			s.Annotations = map[string]string{"vipcast.io/scheduler": " wlc ", v1.AnnotationLoadBalancerSourceRangesKey: "10.0.0.0/8, 2001:db8::/48"}
		}), nil},
		{"scheduler", svc(func(s *v1.Service) { s.Annotations = map[string]string{"vipcast.io/scheduler": "fastest"} }),
			[]string{`annotation vipcast.io/scheduler: unknown IPVS scheduler "fastest"`}},
		{"port and protocol", svc(func(s *v1.Service) {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Port: 70000}, v1.ServicePort{Port: 53, Protocol: "QUIC"})
		}), []string{"spec.ports[1]: port 70000 is out of range", `spec.ports[2]: unknown protocol "QUIC"`}},
		{"source ranges, annotation", svc(func(s *v1.Service) {
			s.Annotations = map[string]string{v1.AnnotationLoadBalancerSourceRangesKey: "10.0.0.0/8,bogus"}
		}), []string{`annotation service.beta.kubernetes.io/load-balancer-source-ranges: "bogus": not a source range`}},
		{"all three, in order", svc(func(s *v1.Service) {
			s.Spec.Ports[0].Port = 0
			s.Spec.LoadBalancerSourceRanges = []string{"x"}
			s.Annotations = map[string]string{"vipcast.io/scheduler": "x"}
		}), []string{"spec.ports[0]", "vipcast.io/scheduler", "spec.loadBalancerSourceRanges"}},
	} {
		got := Problems(tc.svc)
		if len(got) != len(tc.want) {
			t.Errorf("%s: %q, want %d problems", tc.name, got, len(tc.want))
			continue
		}
		for i, w := range tc.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: problem %d %q, want it to say %q", tc.name, i, got[i], w)
			}
		}
	}
}
