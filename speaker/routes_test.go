package speaker

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	fx "github.com/vipcast/vipcast/api/v1alpha1/v1alpha1test"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/lbclass"
	"github.com/vipcast/vipcast/poolspec"
)

const (
	v4 = discoveryv1.AddressTypeIPv4
	v6 = discoveryv1.AddressTypeIPv6
)

// routesConfig is the configuration of TestServiceRoutes.
func routesConfig() ([]*v1alpha1.IPPool, []*v1alpha1.BGPPeer) {
	pools := []*v1alpha1.IPPool{
		fx.Pool("p4", 0, "192.0.2.0/24"),
		fx.Pool("p6", 0, "2001:db8::/64"),
		fx.WithBGP(fx.Pool("agg", 0, "198.51.100.0/24", "2001:db8:1::/64"), v1alpha1.IPPoolBGP{
			AggregationLength: ptr.To[int32](26), AggregationLengthV6: ptr.To[int32](96)}),
		fx.WithBGP(fx.Pool("zoneb", 0, "203.0.113.0/25"), v1alpha1.IPPoolBGP{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "b"}}}),
		fx.WithBGP(fx.Pool("attrs", 0, "203.0.113.128/25"), v1alpha1.IPPoolBGP{
			Communities:      []string{"64512:100", "no-export"},
			LargeCommunities: []string{"4200000000:1:2"},
			LocalPref:        ptr.To[uint32](300),
			PeerSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{"role": "tor"}}}),
		fx.WithBGP(fx.Pool("nopeer", 0, "100.64.0.0/24"), v1alpha1.IPPoolBGP{
			PeerSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "none"}}}),
		fx.WithBGP(fx.Pool("badsel", 0, "100.64.1.0/24"), v1alpha1.IPPoolBGP{
			NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: "Equals"}}}}),
		fx.Pool("old", 0, "172.16.0.0/24"),
		fx.Pool("new", 5, "172.16.0.0/16"), // overlaps old: rejected
	}
	peers := []*v1alpha1.BGPPeer{
		mkPeer("tor-b", "10.0.0.253", map[string]string{"role": "tor"}),
		mkPeer("tor-a", "10.0.0.254", map[string]string{"role": "tor"}),
		mkPeer("rr", "10.0.0.100", map[string]string{"role": "rr"}),
	}
	return pools, peers
}

// annotated sets svc's vipcast.io/pool annotation to pool.
func annotated(svc *v1.Service, pool string) *v1.Service {
	if svc.Annotations == nil {
		svc.Annotations = map[string]string{}
	}
	svc.Annotations[poolspec.AnnotationPool] = pool
	return svc
}

// recorded sets svc's vipcast.io/allocated-from-pool annotation, the CCM's
// record, to pool.
func recorded(svc *v1.Service, pool string) *v1.Service {
	if svc.Annotations == nil {
		svc.Annotations = map[string]string{}
	}
	svc.Annotations[poolspec.AnnotationAllocatedFrom] = pool
	return svc
}

func TestServiceRoutes(t *testing.T) {
	readyHere := mkSlice("s", v4, ep{node: "n2", ready: yes}, ep{node: "n1", ready: yes})
	readyElsewhere := mkSlice("s", v4, ep{node: "n2", ready: yes})
	attrs := route("203.0.113.130/32")
	attrs.Communities = []uint32{64512<<16 | 100, 0xFFFFFF01}
	attrs.LargeCommunities = []bgp.LargeCommunity{{Global: 4200000000, Local1: 1, Local2: 2}}
	attrs.LocalPref = ptr.To[uint32](300)
	attrs.Peers = []string{"tor-a", "tor-b"}

	tests := []struct {
		name   string
		svc    *v1.Service
		slices []*discoveryv1.EndpointSlice
		node   func(*Node)
		want   []bgp.Route
		reason string // substring; "" means the reason must be empty
	}{
		// Whose Service.
		{name: "ClusterIP is not ours", svc: func() *v1.Service { s := mkSvc("s", "192.0.2.1"); s.Spec.Type = v1.ServiceTypeClusterIP; return s }(),
			slices: []*discoveryv1.EndpointSlice{readyHere}, reason: "not a LoadBalancer Service"},
		{name: "NodePort is not ours", svc: func() *v1.Service { s := mkSvc("s", "192.0.2.1"); s.Spec.Type = v1.ServiceTypeNodePort; return s }(),
			slices: []*discoveryv1.EndpointSlice{readyHere}, reason: "not a LoadBalancer Service"},
		{name: "foreign loadBalancerClass", svc: func() *v1.Service {
			s := mkSvc("s", "192.0.2.1")
			s.Spec.LoadBalancerClass = ptr.To("example.com/other")
			return s
		}(), slices: []*discoveryv1.EndpointSlice{readyHere}, reason: "handled by loadBalancerClass example.com/other"},
		{name: "ours: class-less LoadBalancer", svc: mkSvc("s", "192.0.2.1"), slices: []*discoveryv1.EndpointSlice{readyHere},
			want: []bgp.Route{route("192.0.2.1/32")}},
		{name: "no VIP yet", svc: mkSvc("s"), slices: []*discoveryv1.EndpointSlice{readyHere}, reason: "no VIP"},
		{name: "hostnames and unparsable IPs are skipped", svc: func() *v1.Service {
			s := mkSvc("s", "192.0.2.300")
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{Hostname: "lb.example.com"}, v1.LoadBalancerIngress{IP: "192.0.2.7"})
			return s
		}(), slices: []*discoveryv1.EndpointSlice{readyHere}, want: []bgp.Route{route("192.0.2.7/32")}},
		{name: "IPv4-mapped ingress IP is unmapped, duplicates collapse", svc: mkSvc("s", "::ffff:192.0.2.5", "192.0.2.5"),
			slices: []*discoveryv1.EndpointSlice{readyHere}, want: []bgp.Route{route("192.0.2.5/32")}},

		// This node.
		{name: "node excluded by label", svc: mkSvc("s", "192.0.2.1"), slices: []*discoveryv1.EndpointSlice{readyHere},
			node: func(n *Node) { n.Excluded = true }, reason: "node excluded by label node.kubernetes.io/exclude-from-external-load-balancers"},
		{name: "node cordoned", svc: mkSvc("s", "192.0.2.1"), slices: []*discoveryv1.EndpointSlice{readyHere},
			node: func(n *Node) { n.Cordoned = true }, reason: "node cordoned"},
		{name: "Local node excluded even with a local endpoint", svc: local(mkSvc("s", "192.0.2.1")), slices: []*discoveryv1.EndpointSlice{readyHere},
			node: func(n *Node) { n.Excluded = true }, reason: "node excluded"},

		// Endpoints, Cluster policy.
		{name: "Cluster: ready endpoint on another node", svc: mkSvc("s", "192.0.2.1"), slices: []*discoveryv1.EndpointSlice{readyElsewhere},
			want: []bgp.Route{route("192.0.2.1/32")}},
		{name: "Cluster: default policy (unset) is Cluster", svc: func() *v1.Service { s := mkSvc("s", "192.0.2.1"); s.Spec.ExternalTrafficPolicy = ""; return s }(),
			slices: []*discoveryv1.EndpointSlice{readyElsewhere}, want: []bgp.Route{route("192.0.2.1/32")}},
		{name: "Cluster: no slices", svc: mkSvc("s", "192.0.2.1"), reason: "no ready endpoints"},
		{name: "Cluster: empty slice", svc: mkSvc("s", "192.0.2.1"), slices: []*discoveryv1.EndpointSlice{mkSlice("s", v4)}, reason: "no ready endpoints"},
		{name: "Cluster: ready false everywhere", svc: mkSvc("s", "192.0.2.1"),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n1", ready: no}, ep{node: "n2", ready: no})}, reason: "no ready endpoints"},
		{name: "Cluster: ready nil counts as ready", svc: mkSvc("s", "192.0.2.1"),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n2"})}, want: []bgp.Route{route("192.0.2.1/32")}},
		// KEP-1669's fallback: with no ready endpoint, serving terminating
		// ones keep the VIP announced (serving unset means serving).
		{name: "Cluster: only serving terminating endpoints", svc: mkSvc("s", "192.0.2.1"),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n1", ready: no, term: true}, ep{node: "n2", ready: no, serving: yes, term: true})},
			want:   []bgp.Route{route("192.0.2.1/32")}},
		{name: "Cluster: only terminating endpoints that no longer serve", svc: mkSvc("s", "192.0.2.1"),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n1", ready: no, serving: no, term: true}, ep{node: "n2", ready: no, serving: no, term: true})}, reason: "no ready endpoints"},
		{name: "Cluster: not ready, not terminating", svc: mkSvc("s", "192.0.2.1"),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n1", ready: no, serving: yes})}, reason: "no ready endpoints"},
		{name: "Cluster: ready endpoint in a second slice", svc: mkSvc("s", "192.0.2.1"),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n1", ready: no}), readyElsewhere}, want: []bgp.Route{route("192.0.2.1/32")}},
		{name: "slices of another Service are ignored", svc: mkSvc("s", "192.0.2.1"),
			slices: []*discoveryv1.EndpointSlice{mkSlice("other", v4, ep{node: "n1", ready: yes}), func() *discoveryv1.EndpointSlice {
				s := mkSlice("s", v4, ep{node: "n1", ready: yes})
				s.Namespace = "elsewhere"
				return s
			}()}, reason: "no ready endpoints"},
		{name: "FQDN slices are ignored", svc: mkSvc("s", "192.0.2.1"),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", discoveryv1.AddressTypeFQDN, ep{node: "n1", ready: yes})}, reason: "no ready endpoints"},

		// Endpoints, Local policy.
		{name: "Local: ready endpoint on this node", svc: local(mkSvc("s", "192.0.2.1")), slices: []*discoveryv1.EndpointSlice{readyHere},
			want: []bgp.Route{route("192.0.2.1/32")}},
		{name: "Local: ready endpoint elsewhere only", svc: local(mkSvc("s", "192.0.2.1")), slices: []*discoveryv1.EndpointSlice{readyElsewhere},
			reason: "externalTrafficPolicy Local and no ready endpoint on this node"},
		{name: "Local: no endpoints at all", svc: local(mkSvc("s", "192.0.2.1")),
			reason: "externalTrafficPolicy Local and no ready endpoint on this node"},
		{name: "Local: local ready nil counts", svc: local(mkSvc("s", "192.0.2.1")),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n1"})}, want: []bgp.Route{route("192.0.2.1/32")}},
		{name: "Local: local ready false", svc: local(mkSvc("s", "192.0.2.1")),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n1", ready: no}, ep{node: "n2", ready: yes})},
			reason: "externalTrafficPolicy Local and no ready endpoint on this node"},
		{name: "Local: local endpoint terminating, ready elsewhere: withdraw", svc: local(mkSvc("s", "192.0.2.1")),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n1", ready: no, term: true}, ep{node: "n2", ready: yes})},
			reason: "this node's IPv4 endpoints for VIP 192.0.2.1 are all terminating, while other nodes have ready ones"},
		{name: "Local: no ready endpoint anywhere, a serving terminating one here: announce", svc: local(mkSvc("s", "192.0.2.1")),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n1", ready: no, serving: yes, term: true}, ep{node: "n2", ready: no})},
			want:   []bgp.Route{route("192.0.2.1/32")}},
		{name: "Local: no ready endpoint anywhere, serving terminating ones elsewhere only", svc: local(mkSvc("s", "192.0.2.1")),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n1", ready: no, serving: no, term: true}, ep{node: "n2", ready: no, term: true})},
			reason: "externalTrafficPolicy Local and no ready endpoint on this node"},
		{name: "Local: endpoint without nodeName is not local", svc: local(mkSvc("s", "192.0.2.1")),
			slices: []*discoveryv1.EndpointSlice{func() *discoveryv1.EndpointSlice {
				s := mkSlice("s", v4, ep{ready: yes})
				s.Endpoints[0].NodeName = nil
				return s
			}()}, reason: "no ready endpoint on this node"},

		// Pools.
		{name: "VIP outside every pool", svc: mkSvc("s", "10.9.9.9"), slices: []*discoveryv1.EndpointSlice{readyHere},
			reason: "VIP 10.9.9.9 is in no IPPool"},
		{name: "overlap: VIP in the older pool", svc: mkSvc("s", "172.16.0.9"), slices: []*discoveryv1.EndpointSlice{readyHere},
			want: []bgp.Route{route("172.16.0.9/32")}},
		{name: "overlap: VIP only in the rejected newer pool is held by it, host route", svc: mkSvc("s", "172.16.1.9"), slices: []*discoveryv1.EndpointSlice{readyHere},
			want: []bgp.Route{route("172.16.1.9/32")}},
		// The holding rule (poolspec.Admission.Holder): a VIP its pool no
		// longer covers stays announced, as a host route with the pool's
		// attributes, while the Service names the pool.
		{name: "narrowed out: held by the annotated pool, with its attributes", svc: annotated(mkSvc("s", "10.9.9.9"), "attrs"), slices: []*discoveryv1.EndpointSlice{readyHere},
			want: []bgp.Route{func() bgp.Route { r := attrs; r.Prefix = netip.MustParsePrefix("10.9.9.9/32"); return r }()}},
		{name: "narrowed out of an aggregating pool: host route, not the aggregate", svc: annotated(mkSvc("s", "10.9.9.9"), "agg"), slices: []*discoveryv1.EndpointSlice{readyElsewhere},
			want: []bgp.Route{route("10.9.9.9/32")}},
		{name: "narrowed out, annotation names no pool", svc: annotated(mkSvc("s", "10.9.9.9"), "gone"), slices: []*discoveryv1.EndpointSlice{readyHere},
			reason: "VIP 10.9.9.9 is in no IPPool"},
		{name: "narrowed out, the request edited to a pool that does not exist: the CCM's record holds it", svc: recorded(annotated(mkSvc("s", "10.9.9.9"), "gone"), "agg"),
			slices: []*discoveryv1.EndpointSlice{readyElsewhere}, want: []bgp.Route{route("10.9.9.9/32")}},
		{name: "narrowed out, the request removed: the CCM's record holds it", svc: recorded(mkSvc("s", "10.9.9.9"), "agg"),
			slices: []*discoveryv1.EndpointSlice{readyElsewhere}, want: []bgp.Route{route("10.9.9.9/32")}},
		{name: "pool nodeSelector does not select this node", svc: mkSvc("s", "203.0.113.1"), slices: []*discoveryv1.EndpointSlice{readyHere},
			reason: "pool zoneb's nodeSelector does not select this node"},
		{name: "pool nodeSelector selects this node", svc: mkSvc("s", "203.0.113.1"), slices: []*discoveryv1.EndpointSlice{readyHere},
			node: func(n *Node) { n.Labels = map[string]string{"zone": "b"} }, want: []bgp.Route{route("203.0.113.1/32")}},
		{name: "pool refused for a malformed nodeSelector still holds its VIPs: every node announces", svc: mkSvc("s", "100.64.1.1"), slices: []*discoveryv1.EndpointSlice{readyHere},
			want: []bgp.Route{route("100.64.1.1/32")}},

		// Prefixes.
		{name: "aggregation IPv4 under Cluster", svc: mkSvc("s", "198.51.100.77"), slices: []*discoveryv1.EndpointSlice{readyElsewhere},
			want: []bgp.Route{route("198.51.100.64/26")}},
		{name: "aggregation IPv6 under Cluster", svc: mkSvc("s", "2001:db8:1::2:3"), slices: []*discoveryv1.EndpointSlice{mkSlice("s", v6, ep{node: "n2"})},
			want: []bgp.Route{route("2001:db8:1::/96")}},
		{name: "Local forces host routes despite aggregation", svc: local(mkSvc("s", "198.51.100.77", "2001:db8:1::2:3")),
			slices: []*discoveryv1.EndpointSlice{readyHere, mkSlice("s", v6, ep{node: "n1"})},
			want:   []bgp.Route{route("198.51.100.77/32"), route("2001:db8:1::2:3/128")}},

		// Families and next hops.
		{name: "dual-stack, sorted IPv4 first", svc: mkSvc("s", "2001:db8::5", "192.0.2.5"),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v6, ep{node: "n2"}), readyElsewhere},
			want:   []bgp.Route{route("192.0.2.5/32"), route("2001:db8::5/128")}},
		{name: "dual-stack on a node without IPv6", svc: mkSvc("s", "192.0.2.5", "2001:db8::5"),
			slices: []*discoveryv1.EndpointSlice{mkSlice("s", v6, ep{node: "n2"}), readyElsewhere},
			node:   func(n *Node) { n.IPv6 = zeroAddr }, want: []bgp.Route{route("192.0.2.5/32")},
			reason: "node has no IPv6 address (InternalIP or ExternalIP) to announce VIP 2001:db8::5 with"},
		{name: "IPv4 VIP on an IPv6-only node", svc: mkSvc("s", "192.0.2.5"), slices: []*discoveryv1.EndpointSlice{readyHere},
			node: func(n *Node) { n.IPv4 = zeroAddr }, reason: "node has no IPv4 address"},
		{name: "Cluster dual-stack with IPv4 endpoints only", svc: mkSvc("s", "192.0.2.5", "2001:db8::5"),
			slices: []*discoveryv1.EndpointSlice{readyElsewhere}, want: []bgp.Route{route("192.0.2.5/32")},
			reason: "no ready IPv6 endpoints for VIP 2001:db8::5"},
		{name: "Local dual-stack with a local IPv6 endpoint only", svc: local(mkSvc("s", "192.0.2.5", "2001:db8::5")),
			slices: []*discoveryv1.EndpointSlice{readyElsewhere, mkSlice("s", v6, ep{node: "n1"})}, want: []bgp.Route{route("2001:db8::5/128")},
			reason: "externalTrafficPolicy Local and no ready IPv4 endpoint on this node for VIP 192.0.2.5"},

		// Attributes and peers.
		{name: "communities, well-known, large, localPref, peers", svc: mkSvc("s", "203.0.113.130"), slices: []*discoveryv1.EndpointSlice{readyHere},
			want: []bgp.Route{attrs}},
		{name: "peerSelector selecting no peer", svc: mkSvc("s", "100.64.0.1"), slices: []*discoveryv1.EndpointSlice{readyHere},
			reason: "pool nopeer's peerSelector selects none of this node's BGPPeers"},
		{name: "one VIP fails, the other is announced, reasons combined", svc: mkSvc("s", "100.64.0.1", "2001:db8::5", "10.9.9.9"),
			slices: []*discoveryv1.EndpointSlice{readyHere, mkSlice("s", v6, ep{node: "n1"})}, want: []bgp.Route{route("2001:db8::5/128")},
			reason: "pool nopeer's peerSelector selects none of this node's BGPPeers; VIP 10.9.9.9 is in no IPPool"},
	}
	pools, peers := routesConfig()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := testNode()
			if tc.node != nil {
				tc.node(&node)
			}
			view, _ := Compile(pools, peers, node)
			got, reason := ServiceRoutes(tc.svc, tc.slices, view)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("routes:\n got %+v\nwant %+v", got, tc.want)
			}
			if tc.reason == "" && reason != "" {
				t.Errorf("reason = %q, want none", reason)
			}
			if !strings.Contains(reason, tc.reason) {
				t.Errorf("reason = %q, want it to contain %q", reason, tc.reason)
			}
			if len(got) == 0 && reason == "" {
				t.Errorf("no routes and no reason")
			}
		})
	}
}

// TestServiceRoutesPeerNodeSelector checks that a pool's peerSelector is
// resolved among the peers of this node only.
func TestServiceRoutesPeerNodeSelector(t *testing.T) {
	pools := []*v1alpha1.IPPool{fx.WithBGP(fx.Pool("p", 0, "192.0.2.0/24"), v1alpha1.IPPoolBGP{
		PeerSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "tor"}}})}
	torA := mkPeer("tor-a", "10.0.0.254", map[string]string{"role": "tor"})
	torA.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "a"}}
	torB := mkPeer("tor-b", "10.1.0.254", map[string]string{"role": "tor"})
	torB.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "b"}}
	peers := []*v1alpha1.BGPPeer{torA, torB}
	svc := mkSvc("s", "192.0.2.1")
	slices := []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "x", ready: yes})}

	for zone, want := range map[string][]string{"a": {"tor-a"}, "b": {"tor-b"}} {
		n := testNode()
		n.Labels = map[string]string{"zone": zone}
		view, _ := Compile(pools, peers, n)
		got, _ := ServiceRoutes(svc, slices, view)
		if len(got) != 1 || !reflect.DeepEqual(got[0].Peers, want) {
			t.Errorf("zone %s: routes %+v, want peers %v", zone, got, want)
		}
	}
	n := testNode()
	n.Labels = map[string]string{"zone": "c"}
	view, _ := Compile(pools, peers, n)
	if got, reason := ServiceRoutes(svc, slices, view); len(got) != 0 || !strings.Contains(reason, "selects none") {
		t.Errorf("zone c: %+v, %q", got, reason)
	}
}

func TestServiceRoutesNilView(t *testing.T) {
	if got, reason := ServiceRoutes(mkSvc("s", "192.0.2.1"), nil, nil); got != nil || reason != "configuration not loaded yet" {
		t.Errorf("nil view: %v, %q", got, reason)
	}
}

// TestCompileDoesNotModifyInput checks that Compile sorts a copy.
func TestCompileDoesNotModifyInput(t *testing.T) {
	pools, peers := routesConfig()
	first, firstPeer := pools[0].Name, peers[0].Name
	for range 2 {
		Compile(pools, peers, testNode())
	}
	if pools[0].Name != first || peers[0].Name != firstPeer {
		t.Errorf("input reordered: %s, %s", pools[0].Name, peers[0].Name)
	}
}

// TestServiceRoutesClasses checks that a speaker given a class announces
// and programs exactly the Services of that class (and class-less ones only
// when told), by the rule the CCM applies (lbclass).
func TestServiceRoutesClasses(t *testing.T) {
	pools, peers := routesConfig()
	slices := []*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n1", ready: yes})}
	withClass := func(class string) *v1.Service {
		s := mkSvc("s", "192.0.2.1")
		if class != "" {
			s.Spec.LoadBalancerClass = ptr.To(class)
		}
		return s
	}
	tests := []struct {
		classes lbclass.Selector
		class   string
		served  bool
	}{
		{lbclass.Selector{Class: "vipcast.io/bgp", NoClassless: true}, "vipcast.io/bgp", true},
		{lbclass.Selector{Class: "vipcast.io/bgp", NoClassless: true}, "", false},
		{lbclass.Selector{Class: "vipcast.io/bgp", NoClassless: true}, "vipcast.io/other", false},
		{lbclass.Selector{Class: "vipcast.io/bgp"}, "", true},
		{lbclass.Selector{}, "vipcast.io/bgp", false},
	}
	for _, tc := range tests {
		view, _ := Compile(pools, peers, testNode())
		view.Classes = tc.classes
		svc := withClass(tc.class)
		routes, reason := ServiceRoutes(svc, slices, view)
		vs, _ := ServiceDataplane(svc, slices, view)
		if !tc.served && vs != nil {
			t.Errorf("%v, class %q: virtual servers %+v for a Service not served", tc.classes, tc.class, vs)
		}
		if (len(routes) > 0) != tc.served {
			t.Errorf("%v, class %q: %d routes (%q), %d virtual servers; want served=%v", tc.classes, tc.class, len(routes), reason, len(vs), tc.served)
		}
		if !tc.served && reason != tc.classes.Why(svc) {
			t.Errorf("%v, class %q: reason %q, want lbclass's %q", tc.classes, tc.class, reason, tc.classes.Why(svc))
		}
	}
}
