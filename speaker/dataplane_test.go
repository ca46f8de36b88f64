package speaker

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	fx "github.com/vipcast/vipcast/api/v1alpha1/v1alpha1test"
	"github.com/vipcast/vipcast/ipvs"
	"github.com/vipcast/vipcast/poolspec"
)

// dpView is the view of the dataplane tests: an IPv4 and an IPv6 pool, a
// pool whose nodeSelector does not select the test node (Disabled), and a
// pool refused for its spec.bgp ("dark", owning nothing but still holding
// the VIPs published in it).
func dpView(t testing.TB, node Node) *View {
	t.Helper()
	pools := []*v1alpha1.IPPool{
		fx.Pool("p4", 0, "192.0.2.0/24"),
		fx.Pool("p6", 0, "2001:db8::/64"),
		fx.WithBGP(fx.Pool("zoneb", 0, "203.0.113.0/25"), v1alpha1.IPPoolBGP{
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "b"}}}),
		fx.WithBGP(fx.Pool("dark", 0, "198.18.0.0/24"), v1alpha1.IPPoolBGP{Communities: []string{"not-a-community"}}),
	}
	view, errs := Compile(pools, nil, node)
	if len(errs) != 1 || errs[0].Pool != "dark" {
		t.Fatalf("Compile errors %v, want only pool dark refused", errs)
	}
	return view
}

// dpSvc returns a Cluster-policy LoadBalancer Service "s" with the given
// ingress IPs and one port, http 80/TCP.
func dpSvc(ips ...string) *v1.Service {
	s := mkSvc("s", ips...)
	s.Spec.Ports = []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}
	return s
}

func withPorts(s *v1.Service, ports ...v1.ServicePort) *v1.Service {
	s.Spec.Ports = ports
	return s
}

func sport(name string, port int32, proto v1.Protocol) v1.ServicePort {
	return v1.ServicePort{Name: name, Port: port, Protocol: proto}
}

// eport is an EndpointSlice port; proto "" leaves the protocol unset (TCP).
func eport(name string, port int32, proto v1.Protocol) discoveryv1.EndpointPort {
	p := discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(port)}
	if proto != "" {
		p.Protocol = ptr.To(proto)
	}
	return p
}

// dpEP is an endpoint: its address, node ("" leaves nodeName unset) and
// conditions (nil: unset).
type dpEP struct {
	addr                 string
	node                 string
	ready, serving, term *bool
}

func readyEP(addr, node string) dpEP { return dpEP{addr: addr, node: node, ready: yes} }
func termEP(addr, node string) dpEP  { return dpEP{addr: addr, node: node, ready: no, term: yes} }

// dpSlice returns an EndpointSlice of Service s with the given ports and
// endpoints.
func dpSlice(fam discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...dpEP) *discoveryv1.EndpointSlice {
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "s-x", Labels: map[string]string{discoveryv1.LabelServiceName: "s"}},
		AddressType: fam,
		Ports:       ports,
	}
	for _, e := range eps {
		sl.Endpoints = append(sl.Endpoints, e.endpoint())
	}
	return sl
}

// clientIPWith is a sessionAffinity ClientIP Service whose scheduler
// annotation names sched.
func clientIPWith(sched string) *v1.Service {
	s := dpSvc("192.0.2.10")
	s.Annotations = map[string]string{AnnotationScheduler: sched}
	s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	return s
}

// affine is sessionAffinity ClientIP as the speaker programs it: mh
// without port hashing, persistent for timeout seconds.
func affine(timeout uint32) func(*ipvs.Service) {
	return func(s *ipvs.Service) {
		s.Scheduler, s.Flags, s.Persistent = ipvs.DefaultScheduler, ipvs.FlagMHFallback, timeout
	}
}

func (e dpEP) endpoint() discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{
		Addresses:  []string{e.addr},
		Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.term},
	}
	if e.node != "" {
		ep.NodeName = ptr.To(e.node)
	}
	return ep
}

func ports(ps ...discoveryv1.EndpointPort) []discoveryv1.EndpointPort { return ps }

// httpPorts is the usual slice port: http -> 8080/TCP.
var httpPorts = ports(eport("http", 8080, ""))

// vs returns the virtual server VIP:port/proto of a Cluster Service with
// the default scheduler and no affinity.
func vs(vip string, port uint16, proto ipvs.Protocol, bs ...ipvs.Backend) ipvs.Service {
	return ipvs.Service{VIP: netip.MustParseAddr(vip), Port: port, Protocol: proto, SNAT: true, Backends: bs}
}

func be(addr string, port uint16, w int) ipvs.Backend {
	return ipvs.Backend{Addr: netip.MustParseAddr(addr), Port: port, Weight: w}
}

func with(s ipvs.Service, f func(*ipvs.Service)) ipvs.Service {
	f(&s)
	return s
}

func noSNAT(s *ipvs.Service) { s.SNAT = false }

func TestServiceDataplane(t *testing.T) {
	tests := []struct {
		name     string
		svc      *v1.Service
		slices   []*discoveryv1.EndpointSlice
		node     func(*Node)
		want     []ipvs.Service
		problems []string // substrings, one per problem
	}{
		// Ours or not.
		{name: "not LoadBalancer", svc: func() *v1.Service {
			s := dpSvc("192.0.2.10")
			s.Spec.Type = v1.ServiceTypeNodePort
			return s
		}(), slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n1"))}},
		{name: "loadBalancerClass", svc: func() *v1.Service {
			s := dpSvc("192.0.2.10")
			s.Spec.LoadBalancerClass = ptr.To("other.io/lb")
			return s
		}(), slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n1"))}},
		{name: "no VIP yet", svc: dpSvc(),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n1"))}},
		{name: "hostname and garbage ingress skipped", svc: func() *v1.Service {
			s := dpSvc("192.0.2.10")
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress,
				v1.LoadBalancerIngress{Hostname: "lb.example"}, v1.LoadBalancerIngress{IP: "nope"})
			return s
		}(), want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP)}},

		// Pools.
		{name: "VIP outside every pool", svc: dpSvc("198.51.100.1"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n1"))}},
		{name: "VIP of a refused pool is still held, and forwarded", svc: dpSvc("198.18.0.5"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n1"))},
			want:   []ipvs.Service{vs("198.18.0.5", 80, ipvs.TCP, be("10.244.0.1", 8080, 1))}},
		{name: "VIP narrowed out of its annotated pool is still forwarded", svc: func() *v1.Service {
			s := dpSvc("198.51.100.1")
			s.Annotations = map[string]string{poolspec.AnnotationPool: "p4"}
			return s
		}(), slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n1"))},
			want: []ipvs.Service{vs("198.51.100.1", 80, ipvs.TCP, be("10.244.0.1", 8080, 1))}},
		{name: "one VIP of two outside every pool", svc: dpSvc("198.51.100.1", "192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n1"))},
			want:   []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 1))}},
		{name: "pool not announced from this node still programmed", svc: dpSvc("203.0.113.5"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n2"))},
			want:   []ipvs.Service{vs("203.0.113.5", 80, ipvs.TCP, be("10.244.0.1", 8080, 1))}},
		{name: "node excluded still programmed", svc: dpSvc("192.0.2.10"),
			node:   func(n *Node) { n.Excluded = true },
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n2"))},
			want:   []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 1))}},
		{name: "node cordoned still programmed", svc: local(dpSvc("192.0.2.10")),
			node:   func(n *Node) { n.Cordoned = true },
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n1"))},
			want:   []ipvs.Service{with(vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 1)), noSNAT)}},

		// Ports and protocols.
		{name: "one virtual server per port and protocol, sorted",
			svc: withPorts(dpSvc("192.0.2.10"),
				sport("http", 80, v1.ProtocolTCP), sport("dns-tcp", 53, v1.ProtocolTCP),
				sport("dns", 53, v1.ProtocolUDP), sport("sctp", 9000, v1.ProtocolSCTP), sport("dflt", 81, "")),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, ports(
				eport("dns", 5353, v1.ProtocolUDP), eport("dns-tcp", 5353, v1.ProtocolTCP),
				eport("http", 8080, v1.ProtocolTCP), eport("sctp", 9999, v1.ProtocolSCTP), eport("dflt", 8081, "")),
				readyEP("10.244.0.1", "n2"))},
			want: []ipvs.Service{
				vs("192.0.2.10", 53, ipvs.TCP, be("10.244.0.1", 5353, 1)),
				vs("192.0.2.10", 53, ipvs.UDP, be("10.244.0.1", 5353, 1)),
				vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 1)),
				vs("192.0.2.10", 81, ipvs.TCP, be("10.244.0.1", 8081, 1)),
				vs("192.0.2.10", 9000, ipvs.SCTP, be("10.244.0.1", 9999, 1)),
			}},
		{name: "same name, other protocol: no match",
			svc: withPorts(dpSvc("192.0.2.10"), sport("dns", 53, v1.ProtocolUDP)),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, ports(eport("dns", 5353, v1.ProtocolTCP)),
				readyEP("10.244.0.1", "n2"))},
			want: []ipvs.Service{vs("192.0.2.10", 53, ipvs.UDP)}},
		{name: "named port: slice port of another name gives no backend",
			svc: dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, ports(eport("web", 8080, ""), eport("", 8081, "")),
				readyEP("10.244.0.1", "n2"))},
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP)}},
		{name: "unnamed port matches the unnamed slice port",
			svc: withPorts(dpSvc("192.0.2.10"), sport("", 80, v1.ProtocolTCP)),
			slices: []*discoveryv1.EndpointSlice{
				dpSlice(v4, ports(eport("http", 9090, "")), readyEP("10.244.0.9", "n2")),
				dpSlice(v4, []discoveryv1.EndpointPort{{Port: ptr.To[int32](8080)}}, readyEP("10.244.0.1", "n2")),
			},
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 1))}},
		{name: "slice port without a port number is skipped",
			svc: dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, []discoveryv1.EndpointPort{{Name: ptr.To("http")}},
				readyEP("10.244.0.1", "n2"))},
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP)}},
		{name: "bad ServicePorts reported and skipped, duplicates merged",
			svc: withPorts(dpSvc("192.0.2.10"),
				sport("http", 80, v1.ProtocolTCP), sport("icmp", 7, "ICMP"), sport("zero", 0, v1.ProtocolTCP),
				sport("http-again", 80, v1.ProtocolTCP)),
			slices:   []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n2"))},
			want:     []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 1))},
			problems: []string{`spec.ports[1]: unknown protocol "ICMP"`, "spec.ports[2]: port 0 is out of range"}},
		{name: "no usable port", svc: withPorts(dpSvc("192.0.2.10"), sport("icmp", 7, "ICMP")),
			problems: []string{"spec.ports[0]"}},

		// Families.
		{name: "dual-stack: each VIP gets its family's endpoints, VIPs sorted",
			svc: dpSvc("2001:db8::10", "192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{
				dpSlice(v6, httpPorts, readyEP("fd44::1", "n2"), readyEP("10.244.0.7", "n2")), // wrong family inside
				dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n2"), readyEP("fd44::7", "n2"), readyEP("::ffff:10.244.0.2", "n2")),
				dpSlice(discoveryv1.AddressTypeFQDN, httpPorts, readyEP("backend.example", "n2")),
			},
			want: []ipvs.Service{
				vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 1), be("10.244.0.2", 8080, 1)),
				vs("2001:db8::10", 80, ipvs.TCP, be("fd44::1", 8080, 1)),
			}},
		{name: "IPv4-only Service ignores IPv6 slices",
			svc: dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{
				dpSlice(v6, httpPorts, readyEP("fd44::1", "n2")),
			},
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP)}},
		{name: "slices of another Service or namespace ignored",
			svc: dpSvc("192.0.2.10"),
			slices: func() []*discoveryv1.EndpointSlice {
				other := dpSlice(v4, httpPorts, readyEP("10.244.0.8", "n2"))
				other.Labels[discoveryv1.LabelServiceName] = "other"
				ns := dpSlice(v4, httpPorts, readyEP("10.244.0.9", "n2"))
				ns.Namespace = "kube-system"
				unlabelled := dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n2"))
				unlabelled.Labels = nil
				return []*discoveryv1.EndpointSlice{other, nil, ns, unlabelled}
			}(),
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 1))}},

		// Traffic policy.
		{name: "Cluster: every node's endpoints, SNAT",
			svc: dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts,
				readyEP("10.244.0.3", "n3"), readyEP("10.244.0.1", "n1"), readyEP("10.244.0.2", ""))},
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP,
				be("10.244.0.1", 8080, 1), be("10.244.0.2", 8080, 1), be("10.244.0.3", 8080, 1))}},
		{name: "Local: this node's endpoints only, no SNAT",
			svc: local(dpSvc("192.0.2.10")),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts,
				readyEP("10.244.0.3", "n3"), readyEP("10.244.0.1", "n1"), readyEP("10.244.0.2", ""), termEP("10.244.0.4", "n1"))},
			want: []ipvs.Service{with(vs("192.0.2.10", 80, ipvs.TCP,
				be("10.244.0.1", 8080, 1), be("10.244.0.4", 8080, 0)), noSNAT)}},
		{name: "Local without endpoint here: empty virtual server",
			svc:    local(dpSvc("192.0.2.10")),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.3", "n3"))},
			want:   []ipvs.Service{with(vs("192.0.2.10", 80, ipvs.TCP), noSNAT)}},

		// Conditions.
		{name: "ready unset or true: weight 1; false: weight 0 (it keeps its connections); terminating: weight 0",
			svc: dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts,
				dpEP{addr: "10.244.0.1", node: "n2"},                                    // ready unset
				dpEP{addr: "10.244.0.2", node: "n2", ready: yes, term: no},              // ready
				dpEP{addr: "10.244.0.3", node: "n2", ready: no},                         // not ready
				dpEP{addr: "10.244.0.4", node: "n2", ready: no, term: no},               // not ready
				termEP("10.244.0.5", "n2"),                                              // serving, terminating: drains while some are ready
				dpEP{addr: "10.244.0.6", node: "n2", ready: yes, term: yes},             // ready wins
				dpEP{addr: "10.244.0.7", node: "n2", ready: no, serving: no, term: yes}, // no longer serving: drains
			)},
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP,
				be("10.244.0.1", 8080, 1), be("10.244.0.2", 8080, 1), be("10.244.0.3", 8080, 0), be("10.244.0.4", 8080, 0),
				be("10.244.0.5", 8080, 0), be("10.244.0.6", 8080, 1), be("10.244.0.7", 8080, 0))}},
		// As kube-proxy: a not-ready or no longer serving endpoint's TCP
		// connections go on (their conntrack entries stay), its UDP flows
		// are balanced afresh (conntrack.CleanStaleEntries keeps only the
		// serving endpoints' entries).
		{name: "UDP: only serving endpoints; one not ready or no longer serving is left out",
			svc: withPorts(dpSvc("192.0.2.10"), sport("dns", 53, v1.ProtocolUDP)),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, ports(eport("dns", 5353, v1.ProtocolUDP)),
				readyEP("10.244.0.1", "n2"),
				dpEP{addr: "10.244.0.3", node: "n2", ready: no}, // not ready
				termEP("10.244.0.5", "n2"),                      // serving, terminating: drains while some are ready
				dpEP{addr: "10.244.0.7", node: "n2", ready: no, serving: no, term: yes},
			)},
			want: []ipvs.Service{vs("192.0.2.10", 53, ipvs.UDP, be("10.244.0.1", 5353, 1), be("10.244.0.5", 5353, 0))}},
		// KEP-1669, as kube-proxy's CategorizeEndpoints: when no endpoint
		// of the category is ready, the serving terminating ones take new
		// flows; those that no longer serve never do.
		{name: "no ready endpoint: serving terminating ones get weight 1, the others 0",
			svc: dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts,
				termEP("10.244.0.1", "n2"),
				dpEP{addr: "10.244.0.2", node: "n3", ready: no, serving: yes, term: yes},
				dpEP{addr: "10.244.0.3", node: "n2", ready: no, serving: no, term: yes},
				dpEP{addr: "10.244.0.4", node: "n2", ready: no, serving: yes}, // not terminating: no new flows
			)},
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP,
				be("10.244.0.1", 8080, 1), be("10.244.0.2", 8080, 1), be("10.244.0.3", 8080, 0), be("10.244.0.4", 8080, 0))}},
		{name: "Local: no ready endpoint on this node: its serving terminating ones, though other nodes have ready ones",
			svc: local(dpSvc("192.0.2.10")),
			slices: []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts,
				termEP("10.244.0.1", "n1"), readyEP("10.244.0.2", "n2"),
				dpEP{addr: "10.244.0.3", node: "n1", ready: no, serving: no, term: yes})},
			want: []ipvs.Service{with(vs("192.0.2.10", 80, ipvs.TCP,
				be("10.244.0.1", 8080, 1), be("10.244.0.3", 8080, 0)), noSNAT)}},
		{name: "the fallback is per port: one port's ready endpoints leave the other's terminating ones",
			svc: withPorts(dpSvc("192.0.2.10"), sport("http", 80, v1.ProtocolTCP), sport("alt", 81, v1.ProtocolTCP)),
			slices: []*discoveryv1.EndpointSlice{
				dpSlice(v4, ports(eport("http", 8080, ""), eport("alt", 8081, "")), termEP("10.244.0.1", "n2")),
				dpSlice(v4, ports(eport("http", 8080, "")), readyEP("10.244.0.2", "n2")),
			},
			want: []ipvs.Service{
				vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 0), be("10.244.0.2", 8080, 1)),
				vs("192.0.2.10", 81, ipvs.TCP, be("10.244.0.1", 8081, 1)),
			}},
		{name: "endpoint without address or with a bad one skipped",
			svc: dpSvc("192.0.2.10"),
			slices: func() []*discoveryv1.EndpointSlice {
				s := dpSlice(v4, httpPorts, readyEP("bogus", "n2"), readyEP("0.0.0.0", "n2"), readyEP("10.244.0.1", "n2"))
				s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{})
				return []*discoveryv1.EndpointSlice{s}
			}(),
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 1))}},
		{name: "only the first address of an endpoint",
			svc: dpSvc("192.0.2.10"),
			slices: func() []*discoveryv1.EndpointSlice {
				s := dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n2"))
				s.Endpoints[0].Addresses = append(s.Endpoints[0].Addresses, "10.244.0.99")
				return []*discoveryv1.EndpointSlice{s}
			}(),
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 1))}},
		{name: "dedupe across slices: ready wins over terminating",
			svc: dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{
				dpSlice(v4, httpPorts, termEP("10.244.0.1", "n2"), readyEP("10.244.0.2", "n2")),
				dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n2"), readyEP("10.244.0.2", "n2"), termEP("10.244.0.3", "n2")),
				dpSlice(v4, httpPorts, termEP("10.244.0.3", "n2")),
				dpSlice(v4, ports(eport("http", 9090, "")), readyEP("10.244.0.1", "n2")), // other port: another backend
			},
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP,
				be("10.244.0.1", 8080, 1), be("10.244.0.1", 9090, 1), be("10.244.0.2", 8080, 1), be("10.244.0.3", 8080, 0))}},
		{name: "no endpoints: virtual servers without backends",
			svc:  withPorts(dpSvc("192.0.2.10", "2001:db8::10"), sport("http", 80, v1.ProtocolTCP), sport("dns", 53, v1.ProtocolUDP)),
			want: []ipvs.Service{vs("192.0.2.10", 53, ipvs.UDP), vs("192.0.2.10", 80, ipvs.TCP), vs("2001:db8::10", 53, ipvs.UDP), vs("2001:db8::10", 80, ipvs.TCP)}},

		// Scheduler.
		{name: "scheduler annotation empty: default", svc: withAnnotation(dpSvc("192.0.2.10"), AnnotationScheduler, "  "),
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP)}},
		{name: "scheduler annotation wlc", svc: withAnnotation(dpSvc("192.0.2.10"), AnnotationScheduler, " wlc"),
			want: []ipvs.Service{with(vs("192.0.2.10", 80, ipvs.TCP), func(s *ipvs.Service) { s.Scheduler = "wlc" })}},
		{name: "scheduler annotation mh: default flags", svc: withAnnotation(dpSvc("192.0.2.10"), AnnotationScheduler, "mh"),
			want: []ipvs.Service{with(vs("192.0.2.10", 80, ipvs.TCP), func(s *ipvs.Service) {
				s.Scheduler, s.Flags = "mh", ipvs.DefaultSchedulerFlags
			})}},
		{name: "scheduler annotation invalid: default kept, reported",
			svc:      withAnnotation(dpSvc("192.0.2.10"), AnnotationScheduler, "fastest"),
			slices:   []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n2"))},
			want:     []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 1))},
			problems: []string{`annotation vipcast.io/scheduler: unknown IPVS scheduler "fastest" (allowed: rr, wrr, lc, wlc`}},

		// Session affinity.
		{name: "ClientIP affinity without timeout: 10800", svc: func() *v1.Service {
			s := dpSvc("192.0.2.10")
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			return s
		}(), want: []ipvs.Service{with(vs("192.0.2.10", 80, ipvs.TCP), affine(10800))}},
		{name: "ClientIP affinity with timeout", svc: func() *v1.Service {
			s := dpSvc("192.0.2.10")
			s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}}
			return s
		}(), want: []ipvs.Service{with(vs("192.0.2.10", 80, ipvs.TCP), affine(600))}},
		{name: "ClientIP affinity with the mh annotation: mh without the port", svc: clientIPWith("mh"),
			want: []ipvs.Service{with(vs("192.0.2.10", 80, ipvs.TCP), affine(10800))}},
		{name: "ClientIP affinity with another scheduler: its own flags (per node)", svc: clientIPWith("sh"),
			want: []ipvs.Service{with(vs("192.0.2.10", 80, ipvs.TCP), func(s *ipvs.Service) { s.Scheduler, s.Persistent = "sh", 10800 })}},
		{name: "affinity None ignores a config", svc: func() *v1.Service {
			s := dpSvc("192.0.2.10")
			s.Spec.SessionAffinity = v1.ServiceAffinityNone
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}}
			return s
		}(), want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP)}},

		// Source ranges.
		{name: "source ranges: each VIP its family's ranges", svc: withRanges(dpSvc("192.0.2.10", "2001:db8::10"), "10.20.0.0/16", " 2001:db8:5::/48", "198.51.100.7/24"),
			want: []ipvs.Service{
				restrictTo(vs("192.0.2.10", 80, ipvs.TCP), "10.20.0.0/16", "198.51.100.0/24"),
				restrictTo(vs("2001:db8::10", 80, ipvs.TCP), "2001:db8:5::/48"),
			}},
		{name: "source ranges: no range of a VIP's family admits no one", svc: withRanges(dpSvc("192.0.2.10", "2001:db8::10"), "10.20.0.0/16"),
			want: []ipvs.Service{
				restrictTo(vs("192.0.2.10", 80, ipvs.TCP), "10.20.0.0/16"),
				restrictTo(vs("2001:db8::10", 80, ipvs.TCP)),
			}},
		{name: "source ranges holding the node's address admit the VIP itself", svc: withRanges(dpSvc("192.0.2.10", "2001:db8::10"), "10.0.0.0/8", "fd00::/8"),
			want: []ipvs.Service{
				restrictTo(vs("192.0.2.10", 80, ipvs.TCP), "10.0.0.0/8", "192.0.2.10/32"),
				restrictTo(vs("2001:db8::10", 80, ipvs.TCP), "fd00::/8", "2001:db8::10/128"),
			}},
		{name: "source ranges annotation", svc: withAnnotation(dpSvc("192.0.2.10"), v1.AnnotationLoadBalancerSourceRangesKey, " 10.20.0.0/16, 10.30.0.0/16 "),
			want: []ipvs.Service{restrictTo(vs("192.0.2.10", 80, ipvs.TCP), "10.20.0.0/16", "10.30.0.0/16")}},
		{name: "source ranges: the field wins over the annotation", svc: withAnnotation(withRanges(dpSvc("192.0.2.10"), "10.20.0.0/16"), v1.AnnotationLoadBalancerSourceRangesKey, "0.0.0.0/0,junk"),
			want: []ipvs.Service{restrictTo(vs("192.0.2.10", 80, ipvs.TCP), "10.20.0.0/16")}},
		{name: "source ranges annotation malformed: fails closed, reported", svc: withAnnotation(dpSvc("192.0.2.10"), v1.AnnotationLoadBalancerSourceRangesKey, "10.20.0.0/33"),
			want:     []ipvs.Service{restrictTo(vs("192.0.2.10", 80, ipvs.TCP))},
			problems: []string{`annotation service.beta.kubernetes.io/load-balancer-source-ranges: "10.20.0.0/33": not a source range (a CIDR such as 10.20.0.0/16 or 2001:db8::/48); the VIP admits no client until it is fixed`}},
		{name: "source ranges annotation partly malformed: only the valid ones", svc: withAnnotation(dpSvc("192.0.2.10"), v1.AnnotationLoadBalancerSourceRangesKey, "10.20.0.0/16,10.30.0.0"),
			want:     []ipvs.Service{restrictTo(vs("192.0.2.10", 80, ipvs.TCP), "10.20.0.0/16")},
			problems: []string{`"10.30.0.0": not a source range`}},
		{name: "source ranges annotation blank: every client", svc: withAnnotation(dpSvc("192.0.2.10"), v1.AnnotationLoadBalancerSourceRangesKey, "  "),
			want: []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := testNode()
			if tc.node != nil {
				tc.node(&node)
			}
			got, problems := ServiceDataplane(tc.svc, tc.slices, dpView(t, node))
			checkDataplane(t, got, problems, tc.want, tc.problems)
		})
	}
}

func withRanges(s *v1.Service, ranges ...string) *v1.Service {
	s.Spec.LoadBalancerSourceRanges = ranges
	return s
}

// restrictTo restricts s to ranges (none: no client).
func restrictTo(s ipvs.Service, ranges ...string) ipvs.Service {
	s.Restricted, s.SourceRanges = true, nil
	for _, r := range ranges {
		s.SourceRanges = append(s.SourceRanges, netip.MustParsePrefix(r))
	}
	return s
}

func withAnnotation(s *v1.Service, k, v string) *v1.Service {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[k] = v
	return s
}

func TestServiceDataplaneNilView(t *testing.T) {
	got, problems := ServiceDataplane(dpSvc("192.0.2.10"), nil, nil)
	if got != nil || problems != nil {
		t.Errorf("nil view: got %v, %q; want nothing", got, problems)
	}
}

// Two VIPs of one family get equal but separate Backends slices.
func TestServiceDataplaneBackendsNotShared(t *testing.T) {
	got, _ := ServiceDataplane(dpSvc("192.0.2.10", "192.0.2.11"),
		[]*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n2"))}, dpView(t, testNode()))
	if len(got) != 2 || !reflect.DeepEqual(got[0].Backends, got[1].Backends) {
		t.Fatalf("got %v", got)
	}
	got[0].Backends[0].Weight = 7
	if got[1].Backends[0].Weight != 1 {
		t.Error("the two virtual servers share their Backends")
	}
}

// The output is already in the form the ipvs package normalizes to.
func TestServiceDataplaneNormalized(t *testing.T) {
	got, _ := ServiceDataplane(withAnnotation(dpSvc("192.0.2.10"), AnnotationScheduler, "mh"),
		[]*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.2", "n2"), termEP("10.244.0.1", "n2"))},
		dpView(t, testNode()))
	for _, s := range got {
		if n := s.Normalize(); !reflect.DeepEqual(n, s) {
			t.Errorf("not normalized:\n got %v\nnorm %v", s, n)
		}
	}
	// The default scheduler ("") normalizes to the same virtual server as
	// an explicit mh.
	def, _ := ServiceDataplane(dpSvc("192.0.2.10"),
		[]*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.2", "n2"), termEP("10.244.0.1", "n2"))},
		dpView(t, testNode()))
	if !reflect.DeepEqual(def[0].Normalize(), got[0]) {
		t.Errorf("default %v != mh %v", def[0].Normalize(), got[0])
	}
}

// Fuzzing universe: VIPs (the last outside every pool), ServicePorts,
// EndpointSlice ports and endpoint addresses (of both families, mapped,
// and garbage), so that inputs collide often.
var (
	fuzzVIPs      = []string{"192.0.2.1", "192.0.2.2", "2001:db8::1", "2001:db8::2", "::ffff:192.0.2.3", "198.51.100.1"}
	fuzzSvcPorts  = []v1.ServicePort{sport("http", 80, v1.ProtocolTCP), sport("dns", 53, v1.ProtocolUDP), sport("", 53, v1.ProtocolTCP), sport("x", 80, "")}
	fuzzEndPorts  = []discoveryv1.EndpointPort{eport("http", 8080, ""), eport("dns", 5353, v1.ProtocolUDP), eport("", 53, ""), eport("x", 81, v1.ProtocolTCP), eport("dns", 5300, v1.ProtocolTCP), {Name: ptr.To("http")}}
	fuzzAddrs     = []string{"10.244.0.1", "10.244.0.2", "fd44::1", "fd44::2", "::ffff:10.244.0.3", "bogus", "fe80::1%eth0", "10.244.0.1"}
	fuzzFams      = []discoveryv1.AddressType{v4, v6, discoveryv1.AddressTypeFQDN, v4}
	fuzzNodes     = []string{"", "n1", "n2", "n1"}
	fuzzConds     = []*bool{nil, yes, no, no}
	fuzzAnnotated = []string{"", "rr", "bad", "mh"}
)

// FuzzServiceDataplane builds a Service and EndpointSlices from random
// bytes and checks that ServiceDataplane never panics, and that its output
// is sorted, deduplicated, of valid virtual servers whose backends are of
// the VIP's family, and equal to a naive model of the rules.
func FuzzServiceDataplane(f *testing.F) {
	f.Add([]byte{0x3f, 0x0f, 0x00, 0x02, 0x00, 0x3f, 0x12, 0x34, 0x56})
	f.Add([]byte{0x81, 0xff, 0xc5, 0x01, 0x1b, 0x3f, 0xff, 0x00, 0x4d, 0x01, 0x2c, 0x05, 0xaa})
	f.Add([]byte{0x07, 0x03, 0x40, 0x03, 0x00, 0x3f, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07})
	view := dpView(f, testNode())
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzBytes{data: data}
		svc, eps := fuzzInput(r)
		got, _ := ServiceDataplane(svc, eps, view)

		for i, s := range got {
			if i > 0 && compareKeys(got[i-1].Key(), s.Key()) >= 0 {
				t.Fatalf("not sorted or duplicated: %v then %v", got[i-1].Key(), s.Key())
			}
			if err := s.Validate(); err != nil {
				t.Fatal(err)
			}
			for j, b := range s.Backends {
				if b.Addr.Is4() != s.VIP.Is4() || b.Addr.Is4In6() {
					t.Fatalf("%v: backend %v of another family", s.Key(), b)
				}
				if b.Weight != 0 && b.Weight != 1 {
					t.Fatalf("%v: backend %v weight", s.Key(), b)
				}
				if j > 0 && s.Backends[j-1].AddrPort().Compare(b.AddrPort()) >= 0 {
					t.Fatalf("%v: backends not sorted or duplicated: %v", s.Key(), s.Backends)
				}
			}
		}
		if want := naiveDataplane(svc, eps, view); !reflect.DeepEqual(asMap(got), want) {
			t.Fatalf("got %v\nwant %v", asMap(got), want)
		}
		checkInCluster(t, svc, eps, view, got)
	})
}

// checkInCluster checks the in-cluster endpoints of got, ServiceDataplane's
// answer for svc in one tier: under Local, each virtual server's are the
// real servers the same Service gets under Cluster policy; under Cluster,
// none.
func checkInCluster(t *testing.T, svc *v1.Service, eps []*discoveryv1.EndpointSlice, view *View, got []ipvs.Service) {
	t.Helper()
	if svc.Spec.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal {
		for _, s := range got {
			if s.Cluster != nil {
				t.Fatalf("%v: Cluster policy in one tier, in-cluster endpoints %v", s.Key(), s.Cluster)
			}
		}
		return
	}
	cl := svc.DeepCopy()
	cl.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
	asCluster, _ := ServiceDataplane(cl, eps, view)
	if len(asCluster) != len(got) {
		t.Fatalf("%d virtual servers under Local, %d under Cluster", len(got), len(asCluster))
	}
	for i, s := range got {
		if !reflect.DeepEqual(s.Cluster, asCluster[i].Backends) {
			t.Fatalf("%v: in-cluster endpoints %v, want the Cluster policy's real servers %v", s.Key(), s.Cluster, asCluster[i].Backends)
		}
	}
}

// TestServiceDataplaneInCluster: the in-cluster endpoints
// (ipvs.Service.Cluster) are every endpoint under the Cluster rules
// (terminating ones at weight 0, serving terminating ones when none is
// ready), for one tier under Local, also on a node without an endpoint,
// and for two tiers under either policy; none for one tier under Cluster,
// whose IPVS real servers reach every endpoint already.
func TestServiceDataplaneInCluster(t *testing.T) {
	tunnels := map[string]netip.Addr{"n1": netip.MustParseAddr("10.52.0.1"), "n2": netip.MustParseAddr("10.52.0.2")}
	both := []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n1"), readyEP("10.244.1.1", "n2"), termEP("10.244.1.2", "n2"))}
	onN2 := []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.1.1", "n2"))}
	all := []ipvs.Backend{be("10.244.0.1", 8080, 1), be("10.244.1.1", 8080, 1), be("10.244.1.2", 8080, 0)}
	for _, tc := range []struct {
		name    string
		svc     *v1.Service
		slices  []*discoveryv1.EndpointSlice
		twoTier bool
		want    []ipvs.Backend
	}{
		{"one tier, Cluster: none", dpSvc("192.0.2.10"), both, false, nil},
		{"one tier, Local: every endpoint", local(dpSvc("192.0.2.10")), both, false, all},
		{"one tier, Local, no endpoint on this node", local(dpSvc("192.0.2.10")), onN2, false, []ipvs.Backend{be("10.244.1.1", 8080, 1)}},
		// internalTrafficPolicy governs the ClusterIP only: kube-proxy sends
		// in-cluster traffic to an external destination to its cluster
		// policy chain (every endpoint) whatever it says.
		{"one tier, Local, internalTrafficPolicy Local: every endpoint still", func() *v1.Service {
			s := local(dpSvc("192.0.2.10"))
			s.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
			return s
		}(), onN2, false, []ipvs.Backend{be("10.244.1.1", 8080, 1)}},
		{"one tier, Local, none ready: the serving terminating ones",
			local(dpSvc("192.0.2.10")), []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, termEP("10.244.1.2", "n2"))}, false, []ipvs.Backend{be("10.244.1.2", 8080, 1)}},
		{"two tiers, Cluster: every endpoint", dpSvc("192.0.2.10"), both, true, all},
		{"two tiers, Local: every endpoint", local(dpSvc("192.0.2.10")), both, true, all},
		{"no endpoint anywhere", local(dpSvc("192.0.2.10")), nil, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := testNode()
			node.Name = "n1"
			view := dpView(t, node)
			if tc.twoTier {
				view.Tunnels = tunnels
			}
			got, problems := ServiceDataplane(tc.svc, tc.slices, view)
			if len(got) != 1 || len(problems) != 0 {
				t.Fatalf("got %v, problems %q; want one virtual server, no problem", got, problems)
			}
			if !reflect.DeepEqual(got[0].Cluster, tc.want) {
				t.Errorf("in-cluster endpoints %v, want %v", got[0].Cluster, tc.want)
			}
		})
	}
}

type fuzzBytes struct{ data []byte }

func (r *fuzzBytes) next() byte {
	if len(r.data) == 0 {
		return 0
	}
	b := r.data[0]
	r.data = r.data[1:]
	return b
}

// fuzzInput reads a Service (VIP mask, port mask, policy/affinity/scheduler
// byte) and then slices (family/port-mask byte, endpoint count, then two
// bytes per endpoint) until the data runs out.
func fuzzInput(r *fuzzBytes) (*v1.Service, []*discoveryv1.EndpointSlice) {
	vipMask, portMask, opts := r.next(), r.next(), r.next()
	var ips []string
	for i, ip := range fuzzVIPs {
		if vipMask&(1<<i) != 0 {
			ips = append(ips, ip)
		}
	}
	if vipMask&0x80 != 0 {
		slices.Reverse(ips)
	}
	svc := mkSvc("s", ips...)
	for i, p := range fuzzSvcPorts {
		if portMask&(1<<i) != 0 {
			svc.Spec.Ports = append(svc.Spec.Ports, p)
		}
	}
	if portMask&0x80 != 0 {
		slices.Reverse(svc.Spec.Ports)
	}
	if opts&1 != 0 {
		local(svc)
	}
	if opts&2 != 0 {
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	}
	withAnnotation(svc, AnnotationScheduler, fuzzAnnotated[opts>>2&3])

	var eps []*discoveryv1.EndpointSlice
	for len(r.data) > 0 {
		head, n := r.next(), int(r.next()%6)
		var ps []discoveryv1.EndpointPort
		for i, p := range fuzzEndPorts {
			if head>>2&(1<<i) != 0 {
				ps = append(ps, p)
			}
		}
		sl := dpSlice(fuzzFams[head&3], ps)
		for range n {
			a, c := r.next(), r.next()
			e := dpEP{addr: fuzzAddrs[a&7], node: fuzzNodes[a>>3&3], ready: fuzzConds[c&3], term: fuzzConds[c>>2&3], serving: fuzzConds[c>>4&3]}
			sl.Endpoints = append(sl.Endpoints, e.endpoint())
		}
		eps = append(eps, sl)
	}
	return svc, eps
}

type modelService struct {
	sched      string
	flags      uint32
	persistent uint32
	snat       bool
	backends   map[netip.AddrPort]int
}

func asMap(ss []ipvs.Service) map[ipvs.Key]modelService {
	m := map[ipvs.Key]modelService{}
	for _, s := range ss {
		ms := modelService{s.Scheduler, s.Flags, s.Persistent, s.SNAT, map[netip.AddrPort]int{}}
		for _, b := range s.Backends {
			ms.backends[b.AddrPort()] = b.Weight
		}
		m[s.Key()] = ms
	}
	return m
}

// naiveDataplane is the rules written the slow, obvious way.
func naiveDataplane(svc *v1.Service, eps []*discoveryv1.EndpointSlice, view *View) map[ipvs.Key]modelService {
	m := map[ipvs.Key]modelService{}
	var sched string
	var flags uint32
	switch a := svc.Annotations[AnnotationScheduler]; a {
	case "rr":
		sched = "rr"
	case "mh":
		sched, flags = "mh", ipvs.DefaultSchedulerFlags
	}
	var persistent uint32
	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		persistent = 10800
		if sched == "" || sched == "mh" {
			sched, flags = "mh", ipvs.FlagMHFallback
		}
	}
	isLocal := svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	type cand struct {
		ap   netip.AddrPort
		rank int // 2 ready, 1 serving and terminating, 0 terminating
	}
	cands := map[ipvs.Key][]cand{}
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		vip := netip.MustParseAddr(ing.IP).Unmap()
		if view.PoolFor(vip) == nil {
			continue
		}
		for _, sp := range svc.Spec.Ports {
			proto, _ := ipvs.ParseProtocol(string(sp.Protocol))
			key := ipvs.Key{VIP: vip, Port: uint16(sp.Port), Protocol: proto}
			if _, dup := m[key]; dup {
				continue
			}
			ms := modelService{sched, flags, persistent, !isLocal, map[netip.AddrPort]int{}}
			m[key] = ms
			for _, sl := range eps {
				if (sl.AddressType == v4) != vip.Is4() || sl.AddressType == discoveryv1.AddressTypeFQDN {
					continue
				}
				var target int32
				for _, p := range sl.Ports {
					var pp v1.Protocol
					if p.Protocol != nil {
						pp = *p.Protocol
					}
					if pproto, _ := ipvs.ParseProtocol(string(pp)); *p.Name == sp.Name && pproto == proto && p.Port != nil {
						target = *p.Port
						break
					}
				}
				if target == 0 {
					continue
				}
				for _, e := range sl.Endpoints {
					if isLocal && (e.NodeName == nil || *e.NodeName != "n1") {
						continue
					}
					a, err := netip.ParseAddr(e.Addresses[0])
					if err != nil || a.Zone() != "" || a.Unmap().Is4() != vip.Is4() {
						continue
					}
					ap := netip.AddrPortFrom(a.Unmap(), uint16(target))
					ready := e.Conditions.Ready == nil || *e.Conditions.Ready
					serving := e.Conditions.Serving == nil || *e.Conditions.Serving
					term := e.Conditions.Terminating != nil && *e.Conditions.Terminating
					switch {
					case ready:
						cands[key] = append(cands[key], cand{ap, 2})
					case term && serving:
						cands[key] = append(cands[key], cand{ap, 1})
					case term:
						cands[key] = append(cands[key], cand{ap, 0})
					}
				}
			}
		}
	}
	// Weights: ready 1; serving and terminating 1 when no candidate of
	// the virtual server is ready, else 0; not serving 0. An address seen
	// twice keeps its highest weight.
	for key, cs := range cands {
		anyReady := slices.ContainsFunc(cs, func(c cand) bool { return c.rank == 2 })
		for _, c := range cs {
			w := 0
			if c.rank == 2 || (c.rank == 1 && !anyReady) {
				w = 1
			}
			if old, seen := m[key].backends[c.ap]; !seen || w > old {
				m[key].backends[c.ap] = w
			}
		}
	}
	return m
}

// BenchmarkServiceDataplane measures ServiceDataplane for 10,000 Services
// of 10 endpoints each (8 ready on 5 nodes, 1 terminating, 1 not ready),
// two ports (http 80, https 443). ns/op is per Service.
//
//   - Cluster, Local: one IPv4 VIP and one IPv4 EndpointSlice;
//   - DualStack: an IPv4 and an IPv6 VIP, an EndpointSlice of 10 per
//     family.
func BenchmarkServiceDataplane(b *testing.B) {
	view := dpView(b, testNode())
	for _, bc := range []struct {
		name        string
		local, dual bool
	}{{"Cluster", false, false}, {"Local", true, false}, {"DualStack", false, true}} {
		svcs, eps := dpBenchFixture(bc.local, bc.dual)
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			backends := 0
			n := 0
			for b.Loop() {
				i := n % len(svcs)
				n++
				got, _ := ServiceDataplane(svcs[i], eps[i], view)
				for _, s := range got {
					backends += len(s.Backends)
				}
			}
			b.ReportMetric(float64(backends)/float64(n), "backends/op")
		})
	}
}

func dpBenchFixture(localPolicy, dual bool) (svcs []*v1.Service, eps [][]*discoveryv1.EndpointSlice) {
	const services, endpoints = 10000, 10
	ps := ports(eport("http", 8080, ""), eport("https", 8443, ""))
	for i := range services {
		ips := []string{netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}).String()}
		if dual {
			ips = append(ips, netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)}).String())
		}
		s := withPorts(mkSvc("s", ips...), sport("http", 80, v1.ProtocolTCP), sport("https", 443, v1.ProtocolTCP))
		if localPolicy {
			local(s)
		}
		var e4, e6 []dpEP
		for j := range endpoints {
			node := fmt.Sprintf("n%d", j%5+1)
			c := dpEP{node: node, ready: yes}
			switch j {
			case 8:
				c = dpEP{node: node, ready: no, term: yes}
			case 9:
				c = dpEP{node: node, ready: no}
			}
			c.addr = netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), byte(j + 1)}).String()
			e4 = append(e4, c)
			c.addr = netip.AddrFrom16([16]byte{0xfd, 0x44, 12: byte(i >> 8), 13: byte(i), 15: byte(j + 1)}).String()
			e6 = append(e6, c)
		}
		sl := []*discoveryv1.EndpointSlice{dpSlice(v4, ps, e4...)}
		if dual {
			sl = append(sl, dpSlice(v6, ps, e6...))
		}
		svcs = append(svcs, s)
		eps = append(eps, sl)
	}
	return svcs, eps
}

// TestServiceDataplaneTwoTier: with view.Tunnels, an IPv4 VIP's virtual
// servers get tier 1 over the nodes that host endpoints (their tunnel
// addresses, weighted by ready endpoints) and tier 2 from this node's
// endpoints, the same for Cluster and Local, without SNAT; an IPv6 VIP
// too with view.TunnelIPv6 (tier 1 over the IPv6 tunnel addresses of
// view.Tunnels6, or without them over the IPv4 ones, weighted by the IPv6
// endpoints), and keeps one tier without it.
func TestServiceDataplaneTwoTier(t *testing.T) {
	tun := func(a string, w int) ipvs.Backend {
		return ipvs.Backend{Addr: netip.MustParseAddr(a), Port: 80, Weight: w, Tunnel: true}
	}
	twoTier := func(vip string, nodes, local []ipvs.Backend) ipvs.Service {
		return ipvs.Service{VIP: netip.MustParseAddr(vip), Port: 80, Protocol: ipvs.TCP, Backends: nodes, Local: local}
	}
	local := func(s *v1.Service) *v1.Service {
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		return s
	}
	tunnels := map[string]netip.Addr{"n1": netip.MustParseAddr("10.52.0.1"), "n2": netip.MustParseAddr("10.52.0.2")}
	eps := dpSlice(discoveryv1.AddressTypeIPv4, httpPorts,
		readyEP("10.1.0.1", "n1"), readyEP("10.1.0.2", "n1"), termEP("10.1.0.3", "n1"),
		readyEP("10.2.0.1", "n2"), termEP("10.3.0.1", "n3"), readyEP("10.4.0.1", ""))
	eps6 := dpSlice(discoveryv1.AddressTypeIPv6, httpPorts,
		readyEP("2001:db8:1::1", "n1"), readyEP("2001:db8:2::1", "n2"), readyEP("2001:db8:2::2", "n2"), termEP("2001:db8:2::3", "n2"))
	eps6.Name = "s-y"
	tunnels6 := map[string]netip.Addr{"n1": netip.MustParseAddr("fd00:52::1")} // n2 has none
	tests := []struct {
		name       string
		svc        *v1.Service
		slices     []*discoveryv1.EndpointSlice
		tunnelIPv6 bool
		tunnels6   map[string]netip.Addr
		ready      map[string]bool // View.SpeakersReady
		want       []ipvs.Service
		problems   []string
	}{
		{
			name: "a node whose speaker is not ready drains",
			svc:  dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(discoveryv1.AddressTypeIPv4, httpPorts,
				readyEP("10.1.0.1", "n1"), readyEP("10.2.0.1", "n2"))},
			ready: map[string]bool{}, // n1 is this node: always ready
			want: []ipvs.Service{twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.1", 1), tun("10.52.0.2", 0)},
				[]ipvs.Backend{be("10.1.0.1", 8080, 1)})},
		},
		{
			// Its connections go on through tier 1 and tier 2 (weight 0),
			// as a node's whose endpoints all terminate.
			name: "a node whose only endpoint is not ready drains, and keeps it in tier 2",
			svc:  dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(discoveryv1.AddressTypeIPv4, httpPorts,
				dpEP{addr: "10.1.0.1", node: "n1", ready: no}, readyEP("10.2.0.1", "n2"))},
			ready: map[string]bool{"n2": true},
			want: []ipvs.Service{twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.1", 0), tun("10.52.0.2", 1)},
				[]ipvs.Backend{be("10.1.0.1", 8080, 0)})},
		},
		{
			name: "a node whose speaker is ready takes flows",
			svc:  dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(discoveryv1.AddressTypeIPv4, httpPorts,
				readyEP("10.1.0.1", "n1"), readyEP("10.2.0.1", "n2"))},
			ready: map[string]bool{"n2": true, "n3": false},
			want: []ipvs.Service{twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.1", 1), tun("10.52.0.2", 1)},
				[]ipvs.Backend{be("10.1.0.1", 8080, 1)})},
		},
		{
			name: "only nodes whose speaker is not ready host endpoints: they keep their weight",
			svc:  dpSvc("192.0.2.10", "2001:db8::10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(discoveryv1.AddressTypeIPv4, httpPorts,
				readyEP("10.2.0.1", "n2")), eps6},
			tunnelIPv6: true,
			ready:      map[string]bool{"n3": true},
			want: []ipvs.Service{
				twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.2", 1)}, nil),
				// IPv6: n1 (this node) is ready, so n2 drains.
				twoTier("2001:db8::10", []ipvs.Backend{tun("10.52.0.1", 1), tun("10.52.0.2", 0)},
					[]ipvs.Backend{be("2001:db8:1::1", 8080, 1)}),
			},
			problems: []string{"no node whose speaker is ready hosts a ready endpoint"},
		},
		{
			name:       "dual stack with IPv6 tunnel addresses: IPv6 tier 1 over them, IPv4 over the IPv4 ones",
			svc:        dpSvc("192.0.2.10", "2001:db8::10"),
			slices:     []*discoveryv1.EndpointSlice{eps, eps6},
			tunnelIPv6: true,
			tunnels6:   tunnels6,
			want: []ipvs.Service{
				twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.1", 2), tun("10.52.0.2", 1)},
					[]ipvs.Backend{be("10.1.0.1", 8080, 1), be("10.1.0.2", 8080, 1), be("10.1.0.3", 8080, 0)}),
				twoTier("2001:db8::10", []ipvs.Backend{tun("fd00:52::1", 1)},
					[]ipvs.Backend{be("2001:db8:1::1", 8080, 1)}),
			},
			problems: []string{"without nodeName", "node n2 get no traffic: that node has no IPv6 tunnel address", "node n3 get no traffic: that node has no tunnel address"},
		},
		{
			name:   "cluster",
			svc:    dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{eps},
			want: []ipvs.Service{twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.1", 2), tun("10.52.0.2", 1)},
				[]ipvs.Backend{be("10.1.0.1", 8080, 1), be("10.1.0.2", 8080, 1), be("10.1.0.3", 8080, 0)})},
			problems: []string{"without nodeName", "node n3 get no traffic: that node has no tunnel address"},
		},
		{
			name:   "local policy: the same tiers",
			svc:    local(dpSvc("192.0.2.10")),
			slices: []*discoveryv1.EndpointSlice{eps},
			want: []ipvs.Service{twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.1", 2), tun("10.52.0.2", 1)},
				[]ipvs.Backend{be("10.1.0.1", 8080, 1), be("10.1.0.2", 8080, 1), be("10.1.0.3", 8080, 0)})},
			problems: []string{"without nodeName", "node n3 get no traffic: that node has no tunnel address"},
		},
		{
			// Tier 1 follows every node's ready endpoints; tier 2 is
			// this node's under the Local rules, so the flows that still
			// reach it (a node whose tier 1 has not drained it yet) get
			// its serving terminating pod rather than a drop.
			name: "a node whose endpoints all terminate drains in tier 1, and its tier 2 falls back to them",
			svc:  dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(discoveryv1.AddressTypeIPv4, httpPorts,
				termEP("10.1.0.3", "n1"), readyEP("10.2.0.1", "n2"),
				dpEP{addr: "10.1.0.4", node: "n1", ready: no, serving: no, term: yes})},
			want: []ipvs.Service{twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.1", 0), tun("10.52.0.2", 1)},
				[]ipvs.Backend{be("10.1.0.3", 8080, 1), be("10.1.0.4", 8080, 0)})},
		},
		{
			name: "no ready endpoint anywhere: tier 1 weighs nodes by their serving terminating endpoints",
			svc:  dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(discoveryv1.AddressTypeIPv4, httpPorts,
				termEP("10.1.0.3", "n1"), termEP("10.2.0.1", "n2"), termEP("10.2.0.2", "n2"),
				dpEP{addr: "10.1.0.4", node: "n1", ready: no, serving: no, term: yes})},
			want: []ipvs.Service{twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.1", 1), tun("10.52.0.2", 2)},
				[]ipvs.Backend{be("10.1.0.3", 8080, 1), be("10.1.0.4", 8080, 0)})},
		},
		{
			// IPVS persistence on each node would pin the client to the
			// node each node's table named when it first saw the client;
			// tables that differ for a moment would then split its
			// connections for the whole timeout.
			name: "sessionAffinity ClientIP: tier 2 hashes the client's address, tier 1 is mh without the port and without persistence",
			svc: func() *v1.Service {
				s := dpSvc("192.0.2.10")
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				return s
			}(),
			slices: []*discoveryv1.EndpointSlice{dpSlice(discoveryv1.AddressTypeIPv4, httpPorts,
				readyEP("10.1.0.1", "n1"), readyEP("10.2.0.1", "n2"))},
			ready: map[string]bool{"n2": true},
			want: []ipvs.Service{with(twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.1", 1), tun("10.52.0.2", 1)},
				[]ipvs.Backend{be("10.1.0.1", 8080, 1)}), func(s *ipvs.Service) {
				s.Scheduler, s.Flags, s.Affinity = ipvs.DefaultScheduler, ipvs.FlagMHFallback, true
			})},
		},
		{
			name: "no endpoint on this node: tier 1 only",
			svc:  dpSvc("192.0.2.10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(discoveryv1.AddressTypeIPv4, httpPorts,
				readyEP("10.2.0.1", "n2"))},
			want: []ipvs.Service{twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.2", 1)}, nil)},
		},
		{
			name: "IPv6 keeps one tier without TunnelIPv6",
			svc:  dpSvc("2001:db8::10"),
			slices: []*discoveryv1.EndpointSlice{dpSlice(discoveryv1.AddressTypeIPv6, httpPorts,
				readyEP("2001:db8:1::1", "n1"), readyEP("2001:db8:2::1", "n2"))},
			want: []ipvs.Service{vs("2001:db8::10", 80, ipvs.TCP, be("2001:db8:1::1", 8080, 1), be("2001:db8:2::1", 8080, 1))},
		},
		{
			name:       "IPv6 with TunnelIPv6: tier 1 over the IPv4 tunnel addresses",
			svc:        dpSvc("2001:db8::10"),
			slices:     []*discoveryv1.EndpointSlice{eps6},
			tunnelIPv6: true,
			want: []ipvs.Service{twoTier("2001:db8::10", []ipvs.Backend{tun("10.52.0.1", 1), tun("10.52.0.2", 2)},
				[]ipvs.Backend{be("2001:db8:1::1", 8080, 1)})},
		},
		{
			name:       "dual stack with TunnelIPv6: each family weighted by its own endpoints",
			svc:        dpSvc("192.0.2.10", "2001:db8::10"),
			slices:     []*discoveryv1.EndpointSlice{eps, eps6},
			tunnelIPv6: true,
			want: []ipvs.Service{
				twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.1", 2), tun("10.52.0.2", 1)},
					[]ipvs.Backend{be("10.1.0.1", 8080, 1), be("10.1.0.2", 8080, 1), be("10.1.0.3", 8080, 0)}),
				twoTier("2001:db8::10", []ipvs.Backend{tun("10.52.0.1", 1), tun("10.52.0.2", 2)},
					[]ipvs.Backend{be("2001:db8:1::1", 8080, 1)}),
			},
			problems: []string{"without nodeName", "node n3 get no traffic: that node has no tunnel address"},
		},
		{
			name:   "dual stack without TunnelIPv6: IPv6 keeps one tier, with SNAT",
			svc:    dpSvc("192.0.2.10", "2001:db8::10"),
			slices: []*discoveryv1.EndpointSlice{eps, eps6},
			want: []ipvs.Service{
				twoTier("192.0.2.10", []ipvs.Backend{tun("10.52.0.1", 2), tun("10.52.0.2", 1)},
					[]ipvs.Backend{be("10.1.0.1", 8080, 1), be("10.1.0.2", 8080, 1), be("10.1.0.3", 8080, 0)}),
				vs("2001:db8::10", 80, ipvs.TCP, be("2001:db8:1::1", 8080, 1), be("2001:db8:2::1", 8080, 1),
					be("2001:db8:2::2", 8080, 1), be("2001:db8:2::3", 8080, 0)),
			},
			problems: []string{"without nodeName", "node n3 get no traffic: that node has no tunnel address"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := testNode()
			node.Name = "n1"
			view := dpView(t, node)
			view.Tunnels, view.TunnelIPv6, view.Tunnels6 = tunnels, tc.tunnelIPv6, tc.tunnels6
			view.SpeakersReady = tc.ready
			got, problems := ServiceDataplane(tc.svc, tc.slices, view)
			checkDataplane(t, got, problems, tc.want, tc.problems)
		})
	}
}

// checkDataplane compares ServiceDataplane's answer with the wanted
// virtual servers and problems (each wanted problem a substring), and
// checks that every virtual server validates.
func checkDataplane(t *testing.T, got []ipvs.Service, problems []string, want []ipvs.Service, wantProblems []string) {
	t.Helper()
	for _, s := range got {
		if err := s.Validate(); err != nil {
			t.Errorf("invalid virtual server: %v", err)
		}
	}
	// The in-cluster endpoints are TestServiceDataplaneInCluster's and
	// FuzzServiceDataplane's matter.
	got = slices.Clone(got)
	for i := range got {
		got[i].Cluster = nil
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("services:\n got %v\nwant %v", got, want)
	}
	if len(problems) != len(wantProblems) {
		t.Fatalf("problems = %q, want %d matching %q", problems, len(wantProblems), wantProblems)
	}
	for i, w := range wantProblems {
		if !strings.Contains(problems[i], w) {
			t.Errorf("problem %d = %q, want it to contain %q", i, problems[i], w)
		}
	}
}

// TestServiceDataplaneTopology: under Cluster policy in one tier, the
// EndpointSlice hints that trafficDistribution writes narrow new flows to
// the endpoints hinted for this node (PreferSameNode), else for its zone
// (PreferSameZone), as kube-proxy's CategorizeEndpoints does: only when
// every ready endpoint has such a hint and one names this node or zone.
// The others get weight 0, keeping their flows. Local policy and two
// tiers (tier 1 picks one node for a flow on every node) take no hints.
func TestServiceDataplaneTopology(t *testing.T) {
	hinted := func(e dpEP, zone, node string) func(*discoveryv1.Endpoint) {
		return func(ep *discoveryv1.Endpoint) {
			*ep = e.endpoint()
			ep.Hints = &discoveryv1.EndpointHints{}
			if zone != "" {
				ep.Hints.ForZones = []discoveryv1.ForZone{{Name: zone}}
			}
			if node != "" {
				ep.Hints.ForNodes = []discoveryv1.ForNode{{Name: node}}
			}
		}
	}
	slice := func(eps ...func(*discoveryv1.Endpoint)) []*discoveryv1.EndpointSlice {
		sl := dpSlice(v4, httpPorts)
		sl.Endpoints = make([]discoveryv1.Endpoint, len(eps))
		for i, f := range eps {
			f(&sl.Endpoints[i])
		}
		return []*discoveryv1.EndpointSlice{sl}
	}
	a1, a2, b1 := readyEP("10.244.0.1", "n1"), readyEP("10.244.0.2", "n2"), readyEP("10.244.0.3", "n3")
	plain := func(e dpEP) func(*discoveryv1.Endpoint) {
		return func(ep *discoveryv1.Endpoint) { *ep = e.endpoint() }
	}
	vip := "192.0.2.10"
	for _, tc := range []struct {
		name   string
		svc    *v1.Service
		slices []*discoveryv1.EndpointSlice
		zone   string // the node's topology.kubernetes.io/zone
		want   []int  // weights of 10.244.0.1, .2, .3
	}{
		{"no hints", dpSvc(vip), slice(plain(a1), plain(a2), plain(b1)), "a", []int{1, 1, 1}},
		{"zone hints", dpSvc(vip), slice(hinted(a1, "a", ""), hinted(a2, "a", ""), hinted(b1, "b", "")), "a", []int{1, 1, 0}},
		{"zone hints, node in the other zone", dpSvc(vip), slice(hinted(a1, "a", ""), hinted(a2, "a", ""), hinted(b1, "b", "")), "b", []int{0, 0, 1}},
		{"zone hints, one endpoint without", dpSvc(vip), slice(hinted(a1, "a", ""), hinted(a2, "a", ""), plain(b1)), "a", []int{1, 1, 1}},
		{"zone hints, none for this zone", dpSvc(vip), slice(hinted(a1, "b", ""), hinted(a2, "b", ""), hinted(b1, "b", "")), "a", []int{1, 1, 1}},
		{"zone hints, node without a zone", dpSvc(vip), slice(hinted(a1, "a", ""), hinted(a2, "a", ""), hinted(b1, "b", "")), "", []int{1, 1, 1}},
		{"node hints", dpSvc(vip), slice(hinted(a1, "a", "n1"), hinted(a2, "a", "n2"), hinted(b1, "b", "n3")), "a", []int{1, 0, 0}},
		{"node hints, none for this node: zone hints", dpSvc(vip), slice(hinted(a1, "a", "n2"), hinted(a2, "a", "n2"), hinted(b1, "b", "n3")), "a", []int{1, 1, 0}},
		{"a terminating endpoint's missing hint does not count", dpSvc(vip), slice(hinted(a1, "a", ""), plain(termEP("10.244.0.2", "n2")), hinted(b1, "b", "")), "a", []int{1, 0, 0}},
		{"Local policy takes no hints", local(dpSvc(vip)), slice(hinted(a1, "b", ""), hinted(a2, "b", ""), hinted(b1, "b", "")), "a", []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := testNode()
			node.Labels = map[string]string{v1.LabelTopologyZone: tc.zone}
			got, problems := ServiceDataplane(tc.svc, tc.slices, dpView(t, node))
			if len(got) != 1 || len(problems) != 0 {
				t.Fatalf("got %v, %q; want one virtual server", got, problems)
			}
			var weights []int
			for _, b := range got[0].Backends {
				weights = append(weights, b.Weight)
			}
			if !slices.Equal(weights, tc.want) {
				t.Errorf("weights %v, want %v (%v)", weights, tc.want, got[0].Backends)
			}
		})
	}
	t.Run("two tiers take no hints", func(t *testing.T) {
		node := testNode()
		node.Labels = map[string]string{v1.LabelTopologyZone: "a"}
		view := dpView(t, node)
		view.Tunnels = map[string]netip.Addr{"n1": netip.MustParseAddr("10.52.0.1"), "n2": netip.MustParseAddr("10.52.0.2")}
		got, problems := ServiceDataplane(dpSvc(vip), slice(hinted(a1, "a", ""), hinted(a2, "b", "")), view)
		if len(got) != 1 || len(problems) != 0 || len(got[0].Backends) != 2 || len(got[0].Local) != 1 ||
			got[0].Backends[0].Weight == 0 || got[0].Backends[1].Weight == 0 || got[0].Local[0].Weight == 0 {
			t.Errorf("got %v, %q; want tier 1 over both nodes and tier 2 to n1's endpoint, every weight above 0", got, problems)
		}
	})
}

// TestServiceDataplaneServiceProxyName: the service.kubernetes.io/
// service-proxy-name label hands a Service's ClusterIP and node ports to
// another proxy (kube-proxy skips it); its VIP stays vipcast's, as a cloud
// load balancer's would, since the VIP's virtual servers send to the pods
// themselves.
func TestServiceDataplaneServiceProxyName(t *testing.T) {
	s := dpSvc("192.0.2.10")
	s.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "other-proxy"}
	got, problems := ServiceDataplane(s, []*discoveryv1.EndpointSlice{dpSlice(v4, httpPorts, readyEP("10.244.0.1", "n2"))}, dpView(t, testNode()))
	checkDataplane(t, got, problems, []ipvs.Service{vs("192.0.2.10", 80, ipvs.TCP, be("10.244.0.1", 8080, 1))}, nil)
}
