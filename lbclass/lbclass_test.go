package lbclass

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
)

func svc(typ v1.ServiceType, class string) *v1.Service {
	s := &v1.Service{Spec: v1.ServiceSpec{Type: typ}}
	if class != "" {
		s.Spec.LoadBalancerClass = &class
	}
	return s
}

func TestServes(t *testing.T) {
	const mine, other = "vipcast.io/bgp", "example.com/other"
	tests := []struct {
		name string
		sel  Selector
		svc  *v1.Service
		want bool
	}{
		{"zero serves class-less", Selector{}, svc(v1.ServiceTypeLoadBalancer, ""), true},
		{"zero ignores classes", Selector{}, svc(v1.ServiceTypeLoadBalancer, mine), false},
		{"zero ignores ClusterIP", Selector{}, svc(v1.ServiceTypeClusterIP, ""), false},
		{"class serves its class", Selector{Class: mine, NoClassless: true}, svc(v1.ServiceTypeLoadBalancer, mine), true},
		{"class ignores another", Selector{Class: mine, NoClassless: true}, svc(v1.ServiceTypeLoadBalancer, other), false},
		{"class ignores class-less", Selector{Class: mine, NoClassless: true}, svc(v1.ServiceTypeLoadBalancer, ""), false},
		{"class and class-less", Selector{Class: mine}, svc(v1.ServiceTypeLoadBalancer, ""), true},
		{"class and class-less, own class", Selector{Class: mine}, svc(v1.ServiceTypeLoadBalancer, mine), true},
		{"class ignores NodePort of its class", Selector{Class: mine}, svc(v1.ServiceTypeNodePort, mine), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.sel.Serves(tt.svc); got != tt.want {
				t.Errorf("Serves = %v (why %q), want %v", got, tt.sel.Why(tt.svc), tt.want)
			}
			if why := tt.sel.Why(tt.svc); (why == "") != tt.want {
				t.Errorf("Why = %q, inconsistent with want %v", why, tt.want)
			}
		})
	}
}

func TestNew(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		class     string
		classless *bool
		want      Selector
		err       string
	}{
		{"", nil, Selector{}, ""},
		{"vipcast.io/bgp", nil, Selector{Class: "vipcast.io/bgp", NoClassless: true}, ""},
		{"vipcast.io/bgp", &yes, Selector{Class: "vipcast.io/bgp"}, ""},
		{" vipcast.io/bgp ", &no, Selector{Class: "vipcast.io/bgp", NoClassless: true}, ""},
		{"", &yes, Selector{}, ""},
		{"", &no, Selector{}, "--serve-classless-services=false without --load-balancer-class serves no Service"},
		{"bgp", nil, Selector{}, "no domain prefix"},
		{"vipcast.io/", nil, Selector{}, "--load-balancer-class=\"vipcast.io/\" is not a valid"},
		{"Vipcast.IO/bgp", nil, Selector{}, "such as vipcast.io/bgp"},
		{"vipcast.io/a/b", nil, Selector{}, "not a valid spec.loadBalancerClass"},
	}
	for _, tt := range tests {
		got, err := New(tt.class, tt.classless)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("New(%q, %v) error = %v, want one containing %q", tt.class, tt.classless, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("New(%q, %v) = %+v, %v; want %+v", tt.class, tt.classless, got, err, tt.want)
		}
	}
}

func TestLeaseName(t *testing.T) {
	tests := []struct {
		sel  Selector
		want string
		err  bool
	}{
		{Selector{}, "vipcast-ccm", false},
		{Selector{Class: "vipcast.io/bgp", NoClassless: true}, "vipcast-ccm-vipcast.io-bgp", false},
		{Selector{Class: "vipcast.io/bgp"}, "vipcast-ccm-vipcast.io-bgp", false},
		{Selector{Class: "example.com/Edge_V2"}, "vipcast-ccm-example.com-edge-v2", false},
		{Selector{Class: "example.com/a_.b"}, "", true},
	}
	for _, tt := range tests {
		got, err := tt.sel.LeaseName("vipcast-ccm")
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("LeaseName(%+v) = %q, %v; want %q (error %v)", tt.sel, got, err, tt.want, tt.err)
		}
		if err != nil && !strings.Contains(err.Error(), "--leader-elect-resource-name") {
			t.Errorf("LeaseName error %q does not name --leader-elect-resource-name", err)
		}
	}
}

func TestServesClassOf(t *testing.T) {
	sel := Selector{Class: "vipcast.io/bgp", NoClassless: true}
	if !sel.ServesClassOf(svc(v1.ServiceTypeClusterIP, "vipcast.io/bgp")) {
		t.Error("a ClusterIP Service of the served class is of a served class")
	}
	if sel.ServesClassOf(svc(v1.ServiceTypeClusterIP, "")) {
		t.Error("a class-less Service is not of a served class when class-less Services are not served")
	}
	if !(Selector{}).ServesClassOf(svc(v1.ServiceTypeClusterIP, "")) {
		t.Error("the zero Selector serves class-less Services")
	}
	if (Selector{}).ServesClassOf(svc(v1.ServiceTypeLoadBalancer, "vipcast.io/bgp")) {
		t.Error("the zero Selector serves no class")
	}
}
