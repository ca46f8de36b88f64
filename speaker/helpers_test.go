package speaker

import (
	"context"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
)

// testNode is the node of most tests: dual-stack, labelled zone=a.
func testNode() Node {
	return Node{
		Name:   "n1",
		Labels: map[string]string{"zone": "a"},
		IPv4:   netip.MustParseAddr("10.0.0.1"),
		IPv6:   netip.MustParseAddr("fd00::1"),
	}
}

func mkPeer(name string, addr string, lbls map[string]string) *v1alpha1.BGPPeer {
	return &v1alpha1.BGPPeer{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls},
		Spec:       v1alpha1.BGPPeerSpec{PeerAddress: addr, PeerASN: 65000, LocalASN: 64512},
	}
}

// mkSvc returns a class-less Cluster-policy LoadBalancer Service with the
// given ingress IPs.
func mkSvc(name string, ips ...string) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: v1.ServiceExternalTrafficPolicyCluster},
	}
	for _, ip := range ips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip, IPMode: ptr.To(v1.LoadBalancerIPModeProxy)})
	}
	return s
}

func local(s *v1.Service) *v1.Service {
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	return s
}

// ep is an endpoint on node with the given ready and serving conditions
// (nil: unset).
type ep struct {
	node           string
	ready, serving *bool
	term           bool
}

// mkSlice returns an EndpointSlice of Service name with the endpoints.
func mkSlice(name string, fam discoveryv1.AddressType, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: fam,
	}
	for i, e := range eps {
		addr := netip.AddrFrom4([4]byte{10, 244, 0, byte(i + 1)}).String()
		if fam == discoveryv1.AddressTypeIPv6 {
			addr = netip.AddrFrom16([16]byte{0xfd, 0x44, 15: byte(i + 1)}).String()
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{addr},
			NodeName:   ptr.To(e.node),
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: ptr.To(e.term)},
		})
	}
	return s
}

var (
	yes = ptr.To(true)
	no  = ptr.To(false)
)

// host returns the route of prefix p via the test node's next hop with no
// attributes.
func route(p string) bgp.Route {
	pfx := netip.MustParsePrefix(p)
	nh := testNode().IPv4
	if pfx.Addr().Is6() {
		nh = testNode().IPv6
	}
	return bgp.Route{Prefix: pfx, NextHop: nh}
}

var zeroAddr netip.Addr

// eventually polls cond every 5 ms for up to 10 s and fails the test with
// what and state() when it never holds.
func eventually(t *testing.T, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, state())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// setScheduler sets the AnnotationScheduler of Service ns/name and returns
// the updated Service.
func setScheduler(ctx context.Context, t *testing.T, client kubernetes.Interface, name, scheduler string) *v1.Service {
	t.Helper()
	svc, err := client.CoreV1().Services("ns").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Annotations = map[string]string{AnnotationScheduler: scheduler}
	svc, err = client.CoreV1().Services("ns").Update(ctx, svc, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}
