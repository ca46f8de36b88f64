package ccm

import (
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// withIngress sets the Service's load-balancer status ingress entries.
func withIngress(ing ...v1.LoadBalancerIngress) svcOption {
	return func(svc *v1.Service) { svc.Status.LoadBalancer.Ingress = ing }
}

func TestStatusIPs(t *testing.T) {
	tests := []struct {
		name    string
		ingress []v1.LoadBalancerIngress
		want    []string
	}{
		{name: "no ingress"},
		{
			name:    "IPv4 and IPv6",
			ingress: []v1.LoadBalancerIngress{{IP: "192.0.2.1"}, {IP: "2001:db8::1"}},
			want:    []string{"192.0.2.1", "2001:db8::1"},
		},
		{
			name: "hostnames and garbage are skipped, mapped addresses unmapped",
			ingress: []v1.LoadBalancerIngress{
				{IP: "192.0.2.1"},
				{Hostname: "lb.example.com"},
				{IP: "not-an-ip"},
				{IP: ""},
				{IP: "::ffff:192.0.2.2"},
				{IP: "2001:db8::1"},
			},
			want: []string{"192.0.2.1", "192.0.2.2", "2001:db8::1"},
		},
		{
			name:    "only hostnames",
			ingress: []v1.LoadBalancerIngress{{Hostname: "lb.example.com"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := statusIPs(newService(withIngress(tc.ingress...)))
			want := addrs(t, tc.want...)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("statusIPs = %v, want %v", got, want)
			}
		})
	}
}

func TestSameIPs(t *testing.T) {
	tests := []struct {
		name string
		a, b []string
		want bool
	}{
		{name: "both empty", want: true},
		{name: "equal", a: []string{"192.0.2.1"}, b: []string{"192.0.2.1"}, want: true},
		{name: "order does not matter", a: []string{"192.0.2.1", "2001:db8::1"}, b: []string{"2001:db8::1", "192.0.2.1"}, want: true},
		{name: "different address", a: []string{"192.0.2.1"}, b: []string{"192.0.2.2"}},
		{name: "different length", a: []string{"192.0.2.1"}, b: []string{"192.0.2.1", "2001:db8::1"}},
		{name: "empty and non-empty", b: []string{"192.0.2.1"}},
		{name: "multiplicity counts", a: []string{"192.0.2.1", "192.0.2.1"}, b: []string{"192.0.2.1", "192.0.2.2"}},
		{name: "same multiset with repeats", a: []string{"192.0.2.1", "192.0.2.2", "192.0.2.1"}, b: []string{"192.0.2.1", "192.0.2.1", "192.0.2.2"}, want: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := addrs(t, tc.a...), addrs(t, tc.b...)
			if got := sameIPs(a, b); got != tc.want {
				t.Errorf("sameIPs(%v, %v) = %v, want %v", a, b, got, tc.want)
			}
			if got := sameIPs(b, a); got != tc.want {
				t.Errorf("sameIPs(%v, %v) = %v, want %v (not symmetric)", b, a, got, tc.want)
			}
		})
	}
}

func TestNewIPs(t *testing.T) {
	tests := []struct {
		name       string
		a, b, want []string
	}{
		{name: "both empty"},
		{name: "all new", b: []string{"192.0.2.1", "2001:db8::1"}, want: []string{"192.0.2.1", "2001:db8::1"}},
		{name: "nothing new", a: []string{"192.0.2.1", "2001:db8::1"}, b: []string{"2001:db8::1", "192.0.2.1"}},
		{name: "removed only", a: []string{"192.0.2.1"}},
		{name: "one replaced", a: []string{"192.0.2.1", "2001:db8::1"}, b: []string{"192.0.2.9", "2001:db8::1"}, want: []string{"192.0.2.9"}},
		{name: "keeps b's order", a: []string{"192.0.2.5"}, b: []string{"2001:db8::1", "192.0.2.5", "192.0.2.1"}, want: []string{"2001:db8::1", "192.0.2.1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := addrs(t, tc.a...), addrs(t, tc.b...)
			if got, want := newIPs(a, b), addrs(t, tc.want...); !reflect.DeepEqual(got, want) {
				t.Errorf("newIPs(%v, %v) = %v, want %v", a, b, got, want)
			}
		})
	}
}

func TestLBStatus(t *testing.T) {
	tests := []struct {
		name string
		ips  []string
	}{
		{name: "no addresses"},
		{name: "IPv4", ips: []string{"192.0.2.1"}},
		{name: "dual stack, order kept", ips: []string{"2001:db8::1", "192.0.2.1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := lbStatus(addrs(t, tc.ips...))
			if st == nil {
				t.Fatal("lbStatus returned nil")
			}
			if len(st.Ingress) != len(tc.ips) {
				t.Fatalf("lbStatus has %d ingress entries, want %d: %+v", len(st.Ingress), len(tc.ips), st.Ingress)
			}
			for i, ing := range st.Ingress {
				if ing.IP != tc.ips[i] {
					t.Errorf("ingress[%d].IP = %q, want %q", i, ing.IP, tc.ips[i])
				}
				if ing.Hostname != "" || len(ing.Ports) != 0 {
					t.Errorf("ingress[%d] has hostname %q or ports %v, want none", i, ing.Hostname, ing.Ports)
				}
				if ing.IPMode == nil || *ing.IPMode != v1.LoadBalancerIPModeProxy {
					t.Errorf("ingress[%d].IPMode = %v, want %q", i, ing.IPMode, v1.LoadBalancerIPModeProxy)
				}
			}
		})
	}

	t.Run("round trips through statusIPs", func(t *testing.T) {
		ips := addrs(t, "192.0.2.1", "2001:db8::1")
		svc := newService(withIngress(lbStatus(ips).Ingress...))
		if got := statusIPs(svc); !reflect.DeepEqual(got, ips) {
			t.Errorf("statusIPs(lbStatus(%v)) = %v", ips, got)
		}
	})
}

// TestWithdrawnStatus: a Service whose allocation failed withdraws from its
// status every address it no longer holds (a VIP it may no longer share
// with the Services holding it) and keeps the rest; a status that lists
// only held addresses stays as it is.
func TestWithdrawnStatus(t *testing.T) {
	tests := []struct {
		name      string
		published []string
		kept      []string
		want      []string // nil: no change
	}{
		{name: "nothing published"},
		{name: "keeps what it holds", published: []string{"192.0.2.1"}, kept: []string{"192.0.2.1"}},
		{name: "holds more than it publishes", kept: []string{"192.0.2.1"}},
		{name: "gave up its only VIP", published: []string{"192.0.2.1"}, want: []string{}},
		{name: "gave up one family", published: []string{"192.0.2.1", "2001:db8::1"}, kept: []string{"2001:db8::1"}, want: []string{"2001:db8::1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ing []v1.LoadBalancerIngress
			for _, ip := range tc.published {
				ing = append(ing, v1.LoadBalancerIngress{IP: ip})
			}
			got := withdrawnStatus(newService(withIngress(ing...)), addrs(t, tc.kept...))
			switch {
			case tc.want == nil && got != nil:
				t.Fatalf("withdrawnStatus = %+v, want no change", got)
			case tc.want == nil:
			case got == nil:
				t.Fatalf("withdrawnStatus = no change, want %v", tc.want)
			case !reflect.DeepEqual(statusIPs(&v1.Service{Status: v1.ServiceStatus{LoadBalancer: *got}}), addrs(t, tc.want...)):
				t.Fatalf("withdrawnStatus = %+v, want %v", got, tc.want)
			}
		})
	}
}
