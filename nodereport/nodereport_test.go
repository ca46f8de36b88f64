package nodereport

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/api/v1alpha1/v1alpha1test"
)

const localWhy = "externalTrafficPolicy Local and no ready endpoint on this node"

func status(node string, st vipcastv1alpha1.SpeakerStatusStatus) vipcastv1alpha1.SpeakerStatus {
	return vipcastv1alpha1.SpeakerStatus{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: st}
}

// up is the status of a speaker of class-less Services with one
// Established session.
func up(node string) vipcastv1alpha1.SpeakerStatus {
	return status(node, vipcastv1alpha1.SpeakerStatusStatus{ServesClassless: true, SessionsConfigured: 1, SessionsEstablished: 1,
		Sessions: []vipcastv1alpha1.SpeakerSession{{Peer: "tor", State: "Established"}}})
}

func node(name string, addrs ...string) v1.Node {
	n := v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"rack": "r1"}}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
	}
	return n
}

func lb(ns, name string, policy v1.ServiceExternalTrafficPolicy, vips ...string) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: policy}}
	for _, v := range vips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: v})
	}
	return s
}

// slice is an EndpointSlice of ns/svc of family fam with one ready
// endpoint on each node.
func slice(ns, svc string, fam discoveryv1.AddressType, nodes ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: svc + "-" + strings.ToLower(string(fam)), Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: fam,
	}
	for i, n := range nodes {
		addr := fmt.Sprintf("10.244.%d.5", i)
		if fam == discoveryv1.AddressTypeIPv6 {
			addr = fmt.Sprintf("fd00:244::%d", i+5)
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: ptr.To(n)})
	}
	return s
}

// TestWhy: each node's answer is its speaker's decision from the objects
// (the reasons are speaker.ServiceRoutes' own words), unless its status
// says the speaker stopped, its kernel refused the Service, or its routes
// reach no router.
func TestWhy(t *testing.T) {
	pools := []*vipcastv1alpha1.IPPool{
		v1alpha1test.WithBGP(v1alpha1test.Pool("main", 0, "198.51.100.0/24", "2001:db8::/120"), vipcastv1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](24)}),
		v1alpha1test.WithBGP(v1alpha1test.Pool("rack2", 1, "203.0.113.0/24"), vipcastv1alpha1.IPPoolBGP{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "r2"}}}),
	}
	nodes := []v1.Node{
		node("node-a", "10.0.0.2", "fd00::2"), node("node-b", "10.0.0.3", "fd00::3"), node("node-c"), node("node-d", "10.0.0.5"),
		node("node-e"), node("node-f", "10.0.0.7"), node("node-g", "10.0.0.8"), node("node-h", "10.0.0.9"),
	}
	refused := func(n int, keys ...string) vipcastv1alpha1.SpeakerStatus {
		st := up("x")
		st.Status.RefusedCount = int32(n) //nolint:gosec // small
		for _, k := range keys {
			st.Status.Refused = append(st.Status.Refused, vipcastv1alpha1.RefusedService{Service: k, Message: "file exists"})
		}
		return st
	}
	named := func(name string, s vipcastv1alpha1.SpeakerStatus) vipcastv1alpha1.SpeakerStatus {
		s.Name = name
		return s
	}
	old := up("node-h")
	old.Status.ServesClassless = false // written before the field: the default classes
	statuses := []vipcastv1alpha1.SpeakerStatus{
		up("node-b"), up("node-a"),
		status("node-c", vipcastv1alpha1.SpeakerStatusStatus{SessionsConfigured: 1,
			Sessions: []vipcastv1alpha1.SpeakerSession{{Peer: "tor", State: "Idle", LastError: "vipcast-speaker stopped"}}}),
		named("node-d", refused(1, "web/local")),
		status("node-f", vipcastv1alpha1.SpeakerStatusStatus{ServesClassless: true, SessionsConfigured: 2,
			Sessions: []vipcastv1alpha1.SpeakerSession{{Peer: "tor", State: "Active"}, {Peer: "tor2", State: "Connect"}}}),
		named("node-g", refused(20, "db/x")),
		old,
	}
	local := lb("web", "local", v1.ServiceExternalTrafficPolicyLocal, "198.51.100.7", "2001:db8::7")
	o := Objects{Service: local, Pools: pools, Nodes: nodes, Statuses: statuses, Slices: []*discoveryv1.EndpointSlice{
		slice("web", "local", discoveryv1.AddressTypeIPv4, "node-a", "node-d", "node-f", "node-g", "node-h"),
		slice("web", "local", discoveryv1.AddressTypeIPv6, "node-a", "node-b"),
	}}
	want := []NodeAnswer{
		// Host routes under Local; one next hop per family.
		{Node: "node-a", Announced: []string{"198.51.100.7/32", "2001:db8::7/128"}, NextHops: []string{"10.0.0.2", "fd00::2"}},
		// An IPv6 endpoint only: the IPv6 VIP announced, the IPv4 one not.
		{Node: "node-b", Announced: []string{"2001:db8::7/128"}, NextHops: []string{"fd00::3"},
			Why: "externalTrafficPolicy Local and no ready IPv4 endpoint on this node for VIP 198.51.100.7"},
		{Node: "node-c", Why: "vipcast-speaker stopped"},
		{Node: "node-d", Why: "dataplane refused it: file exists"},
		{Node: "node-e", Why: "no SpeakerStatus: no vipcast-speaker has run on this node"},
		{Node: "node-f", Announced: []string{"198.51.100.7/32"}, NextHops: []string{"10.0.0.7"},
			Why: "externalTrafficPolicy Local and no ready IPv6 endpoint on this node for VIP 2001:db8::7; announced to no router: none of its 2 BGP sessions is Established (kubectl vipcast peers)"},
		{Node: "node-g", Announced: []string{"198.51.100.7/32"}, NextHops: []string{"10.0.0.8"},
			Why: "externalTrafficPolicy Local and no ready IPv6 endpoint on this node for VIP 2001:db8::7; announced unless the node's kernel refused it: it refused 20 Services, its SpeakerStatus names 1 (see the Service's DataplaneRefused Events)"},
		{Node: "node-h", Announced: []string{"198.51.100.7/32"}, NextHops: []string{"10.0.0.9"},
			Why: "externalTrafficPolicy Local and no ready IPv6 endpoint on this node for VIP 2001:db8::7"},
	}
	if got := Why(o); !reflect.DeepEqual(got, want) {
		t.Errorf("Why =\n%+v\nwant\n%+v", got, want)
	}

	// The lab's case: Local, the only endpoint on node-a.
	v4 := lb("web", "v4", v1.ServiceExternalTrafficPolicyLocal, "198.51.100.9")
	o = Objects{Service: v4, Pools: pools, Nodes: nodes[:2], Statuses: statuses[:2],
		Slices: []*discoveryv1.EndpointSlice{slice("web", "v4", discoveryv1.AddressTypeIPv4, "node-a")}}
	if got := Why(o); len(got) != 2 || got[0].Why != "" || got[1].Why != localWhy || !slices.Equal(got[0].Announced, []string{"198.51.100.9/32"}) {
		t.Errorf("Local, endpoint on node-a only: %+v", got)
	}

	for _, tc := range []struct {
		name string
		svc  *v1.Service
		want NodeAnswer
	}{
		// Cluster: the pool's aggregate, from every node.
		{"cluster", lb("web", "local", v1.ServiceExternalTrafficPolicyCluster, "198.51.100.7"),
			NodeAnswer{Node: "node-b", Announced: []string{"198.51.100.0/24"}, NextHops: []string{"10.0.0.3"}}},
		{"pool not for the node", lb("web", "local", v1.ServiceExternalTrafficPolicyCluster, "203.0.113.4"),
			NodeAnswer{Node: "node-b", Why: "pool rack2's nodeSelector does not select this node"}},
		{"no VIP", lb("web", "local", v1.ServiceExternalTrafficPolicyCluster),
			NodeAnswer{Node: "node-b", Why: "no VIP in status.loadBalancer.ingress yet"}},
		{"another class", withClass(lb("web", "local", "", "198.51.100.7"), "example.com/other"),
			NodeAnswer{Node: "node-b", Why: "handled by loadBalancerClass example.com/other"}},
	} {
		o := Objects{Service: tc.svc, Pools: pools, Nodes: nodes[1:2], Statuses: statuses[:1], Slices: o.Slices[:0]}
		o.Slices = append(o.Slices, slice("web", "local", discoveryv1.AddressTypeIPv4, "node-a"))
		if got := Why(o); len(got) != 1 || !reflect.DeepEqual(got[0], tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	// A speaker serving a class serves that class's Services.
	classed := up("node-b")
	classed.Status.LoadBalancerClass, classed.Status.ServesClassless = "example.com/other", false
	o = Objects{Service: withClass(lb("web", "local", "", "198.51.100.7"), "example.com/other"), Pools: pools, Nodes: nodes[1:2],
		Statuses: []vipcastv1alpha1.SpeakerStatus{classed}, Slices: []*discoveryv1.EndpointSlice{slice("web", "local", discoveryv1.AddressTypeIPv4, "node-a")}}
	if got := Why(o); len(got) != 1 || got[0].Why != "" || !slices.Equal(got[0].Announced, []string{"198.51.100.0/24"}) {
		t.Errorf("a class the speaker serves: %+v", got)
	}
}

func withClass(s *v1.Service, class string) *v1.Service {
	s.Spec.LoadBalancerClass = &class
	return s
}

func TestPrint(t *testing.T) {
	var buf bytes.Buffer
	svc := lb("web", "local", v1.ServiceExternalTrafficPolicyLocal, "198.51.100.7")
	if err := PrintWhy(&buf, svc, []NodeAnswer{
		{Node: "node-a", Announced: []string{"198.51.100.7/32"}, NextHops: []string{"10.0.0.2"}},
		{Node: "node-b", Why: localWhy},
	}); err != nil {
		t.Fatal(err)
	}
	want := `Service web/local: VIPs 198.51.100.7, externalTrafficPolicy Local
NODE    ANNOUNCED        NEXT HOP  WHY NOT
node-a  198.51.100.7/32  10.0.0.2  -
node-b  -                -         ` + localWhy + `
`
	if buf.String() != want {
		t.Errorf("PrintWhy:\n%s\nwant\n%s", buf.String(), want)
	}

	buf.Reset()
	if err := PrintPeers(&buf, []vipcastv1alpha1.SpeakerStatus{
		status("node-b", vipcastv1alpha1.SpeakerStatusStatus{Sessions: []vipcastv1alpha1.SpeakerSession{{Peer: "tor-a", State: "Active", LastError: "connection refused",
			BFD: "Down", BFDDiagnostic: "control detection time expired"}}}),
		status("node-a", vipcastv1alpha1.SpeakerStatusStatus{Sessions: []vipcastv1alpha1.SpeakerSession{
			{Peer: "tor-b", State: "Established", LastError: "old"}, {Peer: "tor-a", State: "Established", BFD: "Up"}}}),
	}); err != nil {
		t.Fatal(err)
	}
	want = `NODE    tor-a                                                                  tor-b
node-a  Established, BFD Up                                                    Established
node-b  Active (connection refused), BFD Down: control detection time expired  -
`
	if buf.String() != want {
		t.Errorf("PrintPeers:\n%q\nwant\n%q", buf.String(), want)
	}
}
