package ccm

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/vipcast/vipcast/ipam"
)

// svcOption modifies a Service built by newService.
type svcOption func(*v1.Service)

// newService returns a LoadBalancer Service "shop/web" with no ports,
// selector, annotations or families, modified by opts in order.
func newService(opts ...svcOption) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer},
	}
	for _, opt := range opts {
		opt(svc)
	}
	return svc
}

// withAnnotation sets the annotation key to value (an empty value is still
// present).
func withAnnotation(key, value string) svcOption {
	return func(svc *v1.Service) {
		if svc.Annotations == nil {
			svc.Annotations = map[string]string{}
		}
		svc.Annotations[key] = value
	}
}

// withName renames the Service (its namespace stays "shop").
func withName(name string) svcOption {
	return func(svc *v1.Service) { svc.Name = name }
}

// withLabels sets the Service's own labels.
func withLabels(l map[string]string) svcOption {
	return func(svc *v1.Service) { svc.Labels = l }
}

// withLBIP sets the deprecated spec.loadBalancerIP.
func withLBIP(ip string) svcOption {
	return func(svc *v1.Service) { svc.Spec.LoadBalancerIP = ip }
}

// withSelector sets spec.selector.
func withSelector(sel map[string]string) svcOption {
	return func(svc *v1.Service) { svc.Spec.Selector = sel }
}

// withPorts appends one ServicePort per protocol/port pair.
func withPorts(ports ...v1.ServicePort) svcOption {
	return func(svc *v1.Service) { svc.Spec.Ports = append(svc.Spec.Ports, ports...) }
}

// withFamilies sets spec.ipFamilyPolicy (nil when policy is "") and
// spec.ipFamilies.
func withFamilies(policy v1.IPFamilyPolicy, fams ...v1.IPFamily) svcOption {
	return func(svc *v1.Service) {
		svc.Spec.IPFamilyPolicy = nil
		if policy != "" {
			svc.Spec.IPFamilyPolicy = &policy
		}
		svc.Spec.IPFamilies = fams
	}
}

// withLocalPolicy sets externalTrafficPolicy: Local.
func withLocalPolicy() svcOption {
	return func(svc *v1.Service) {
		svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}
}

// port returns a ServicePort with the given protocol ("" for unset) and
// number.
func port(proto v1.Protocol, n int32) v1.ServicePort {
	return v1.ServicePort{Protocol: proto, Port: n}
}

// addrs parses IP addresses, failing the test on a malformed one.
func addrs(t testing.TB, ss ...string) []netip.Addr {
	t.Helper()
	var out []netip.Addr
	for _, s := range ss {
		ip, err := netip.ParseAddr(s)
		if err != nil {
			t.Fatalf("bad test address %q: %v", s, err)
		}
		out = append(out, ip)
	}
	return out
}

// v4 is the default family list of a request.
var v4 = []ipam.Family{ipam.IPv4}

// requestForCase is a Service that RequestFor accepts and the request it
// must produce. Owner and Namespace are always "shop/web" and "shop".
type requestForCase struct {
	name     string
	opts     []svcOption
	nsLabels map[string]string
	want     ipam.Request
}

// requestForCases are shared by TestRequestFor and FuzzRequestFor's seeds.
func requestForCases(t testing.TB) []requestForCase {
	long := strings.Repeat("k", maxSharingKeyLen)
	return []requestForCase{
		{
			name: "minimal service defaults to IPv4 single stack",
			want: ipam.Request{Families: v4},
		},
		{
			name:     "namespace and service labels are passed through",
			opts:     []svcOption{withLabels(map[string]string{"expose": "public"})},
			nsLabels: map[string]string{"team": "a"},
			want: ipam.Request{
				NamespaceLabels: map[string]string{"team": "a"},
				ServiceLabels:   map[string]string{"expose": "public"},
				Families:        v4,
			},
		},
		{
			name: "empty protocol defaults to TCP, UDP and SCTP are kept",
			opts: []svcOption{withPorts(port("", 80), port(v1.ProtocolUDP, 53), port(v1.ProtocolSCTP, 9000), port(v1.ProtocolTCP, 443))},
			want: ipam.Request{
				Families: v4,
				Ports: []ipam.Port{
					{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 53},
					{Protocol: "SCTP", Port: 9000}, {Protocol: "TCP", Port: 443},
				},
			},
		},
		{
			name: "pod selector is the canonical sorted selector string",
			opts: []svcOption{withSelector(map[string]string{"tier": "web", "app": "shop"})},
			want: ipam.Request{Families: v4, PodSelector: "app=shop,tier=web"},
		},
		{
			name: "empty selector map gives no pod selector",
			opts: []svcOption{withSelector(map[string]string{})},
			want: ipam.Request{Families: v4},
		},
		{
			name: "externalTrafficPolicy Local",
			opts: []svcOption{withLocalPolicy(), withSelector(map[string]string{"app": "shop"})},
			want: ipam.Request{Families: v4, LocalTrafficPolicy: true, PodSelector: "app=shop"},
		},
		{
			name: "externalTrafficPolicy Cluster is not local",
			opts: []svcOption{func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster }},
			want: ipam.Request{Families: v4},
		},
		{
			name: "nil policy means single stack on the first family",
			opts: []svcOption{withFamilies("", v1.IPv6Protocol)},
			want: ipam.Request{Families: []ipam.Family{ipam.IPv6}},
		},
		{
			name: "SingleStack takes the first family",
			opts: []svcOption{withFamilies(v1.IPFamilyPolicySingleStack, v1.IPv6Protocol, v1.IPv4Protocol)},
			want: ipam.Request{Families: []ipam.Family{ipam.IPv6}},
		},
		{
			name: "PreferDualStack takes all families in order, not required",
			opts: []svcOption{withFamilies(v1.IPFamilyPolicyPreferDualStack, v1.IPv6Protocol, v1.IPv4Protocol)},
			want: ipam.Request{Families: []ipam.Family{ipam.IPv6, ipam.IPv4}},
		},
		{
			name: "RequireDualStack takes all families, required",
			opts: []svcOption{withFamilies(v1.IPFamilyPolicyRequireDualStack, v1.IPv4Protocol, v1.IPv6Protocol)},
			want: ipam.Request{Families: []ipam.Family{ipam.IPv4, ipam.IPv6}, RequireAllFamilies: true},
		},
		{
			name: "PreferDualStack without ipFamilies defaults to IPv4",
			opts: []svcOption{withFamilies(v1.IPFamilyPolicyPreferDualStack)},
			want: ipam.Request{Families: v4},
		},
		{
			name: "ips annotation with one address",
			opts: []svcOption{withAnnotation(AnnotationIPs, "192.0.2.10")},
			want: ipam.Request{Families: v4, IPs: addrs(t, "192.0.2.10")},
		},
		{
			name: "ips annotation dual stack with spaces, in annotation order",
			opts: []svcOption{
				withFamilies(v1.IPFamilyPolicyPreferDualStack, v1.IPv4Protocol, v1.IPv6Protocol),
				withAnnotation(AnnotationIPs, " 2001:db8::10 ,  192.0.2.10 "),
			},
			want: ipam.Request{Families: []ipam.Family{ipam.IPv4, ipam.IPv6}, IPs: addrs(t, "2001:db8::10", "192.0.2.10")},
		},
		{
			name: "IPv4-mapped IPv6 address is unmapped",
			opts: []svcOption{withAnnotation(AnnotationIPs, "::ffff:192.0.2.10")},
			want: ipam.Request{Families: v4, IPs: addrs(t, "192.0.2.10")},
		},
		{
			name: "IPv6 address without ipFamilies is not family-checked",
			opts: []svcOption{withAnnotation(AnnotationIPs, "2001:db8::10")},
			want: ipam.Request{Families: v4, IPs: addrs(t, "2001:db8::10")},
		},
		{
			name: "spec.loadBalancerIP alone, trimmed",
			opts: []svcOption{withLBIP(" 192.0.2.20 ")},
			want: ipam.Request{Families: v4, IPs: addrs(t, "192.0.2.20")},
		},
		{
			name: "spec.loadBalancerIP IPv4-mapped is unmapped",
			opts: []svcOption{withLBIP("::ffff:192.0.2.20")},
			want: ipam.Request{Families: v4, IPs: addrs(t, "192.0.2.20")},
		},
		{
			name: "spec.loadBalancerIP equal to one of the annotation's addresses",
			opts: []svcOption{
				withFamilies(v1.IPFamilyPolicyRequireDualStack, v1.IPv4Protocol, v1.IPv6Protocol),
				withAnnotation(AnnotationIPs, "192.0.2.10,2001:db8::10"),
				withLBIP("2001:db8::10"),
			},
			want: ipam.Request{Families: []ipam.Family{ipam.IPv4, ipam.IPv6}, RequireAllFamilies: true, IPs: addrs(t, "192.0.2.10", "2001:db8::10")},
		},
		{
			name: "spec.loadBalancerIP mapped form of the annotation's address",
			opts: []svcOption{withAnnotation(AnnotationIPs, "192.0.2.10"), withLBIP("::ffff:192.0.2.10")},
			want: ipam.Request{Families: v4, IPs: addrs(t, "192.0.2.10")},
		},
		{
			name: "requested IPv6 address matches IPv6 single stack",
			opts: []svcOption{withFamilies(v1.IPFamilyPolicySingleStack, v1.IPv6Protocol), withLBIP("2001:db8::20")},
			want: ipam.Request{Families: []ipam.Family{ipam.IPv6}, IPs: addrs(t, "2001:db8::20")},
		},
		{
			name: "pool annotation is trimmed",
			opts: []svcOption{withAnnotation(AnnotationPool, " gold-pool ")},
			want: ipam.Request{Families: v4, Pool: "gold-pool"},
		},
		{
			name: "pool annotation may be a dotted DNS subdomain",
			opts: []svcOption{withAnnotation(AnnotationPool, "pools.example.com")},
			want: ipam.Request{Families: v4, Pool: "pools.example.com"},
		},
		{
			name: "MetalLB's spellings are aliases: pool, addresses and sharing key",
			opts: []svcOption{withAnnotation("metallb.io/address-pool", "gold"), withAnnotation("metallb.io/loadBalancerIPs", "192.0.2.7, 2001:db8::7"), withAnnotation("metallb.io/allow-shared-ip", "dns"), withFamilies(v1.IPFamilyPolicyPreferDualStack, v1.IPv4Protocol, v1.IPv6Protocol)},
			want: ipam.Request{Families: []ipam.Family{ipam.IPv4, ipam.IPv6}, Pool: "gold", IPs: addrs(t, "192.0.2.7", "2001:db8::7"), SharingKey: "dns"},
		},
		{
			name: "MetalLB's older spellings are aliases too",
			opts: []svcOption{withAnnotation("metallb.universe.tf/address-pool", "gold"), withAnnotation("metallb.universe.tf/loadBalancerIPs", "192.0.2.7"), withAnnotation("metallb.universe.tf/allow-shared-ip", "dns")},
			want: ipam.Request{Families: v4, Pool: "gold", IPs: addrs(t, "192.0.2.7"), SharingKey: "dns"},
		},
		{
			name: "both spellings agreeing (the same addresses in another order)",
			opts: []svcOption{withAnnotation(AnnotationIPs, "2001:db8::7,192.0.2.7"), withAnnotation("metallb.io/loadBalancerIPs", " 192.0.2.7 , 2001:db8::7"), withAnnotation(AnnotationPool, "gold"), withAnnotation("metallb.io/address-pool", " gold "), withFamilies(v1.IPFamilyPolicyPreferDualStack, v1.IPv4Protocol, v1.IPv6Protocol)},
			want: ipam.Request{Families: []ipam.Family{ipam.IPv4, ipam.IPv6}, Pool: "gold", IPs: addrs(t, "2001:db8::7", "192.0.2.7")},
		},
		{
			name: "sharing key is trimmed",
			opts: []svcOption{withAnnotation(AnnotationSharingKey, "  team a  ")},
			want: ipam.Request{Families: v4, SharingKey: "team a"},
		},
		{
			name: "sharing key of the maximum length",
			opts: []svcOption{withAnnotation(AnnotationSharingKey, " "+long+" ")},
			want: ipam.Request{Families: v4, SharingKey: long},
		},
		{
			name: "sharing with named namespaces, trimmed",
			opts: []svcOption{withAnnotation(AnnotationSharingKey, "dns"), withAnnotation(AnnotationAllowSharedIPAcrossNamespaces, " team-b, team-c ,")},
			want: ipam.Request{Families: v4, SharingKey: "dns", ShareWithNamespaces: []string{"team-b", "team-c"}},
		},
		{
			name: "sharing across namespaces off",
			opts: []svcOption{withAnnotation(AnnotationSharingKey, "dns"), withAnnotation(AnnotationAllowSharedIPAcrossNamespaces, "false")},
			want: ipam.Request{Families: v4, SharingKey: "dns"},
		},
		{
			name: "sharing across namespaces off without a key",
			opts: []svcOption{withAnnotation(AnnotationAllowSharedIPAcrossNamespaces, "false")},
			want: ipam.Request{Families: v4},
		},
	}
}

func TestRequestFor(t *testing.T) {
	for _, tc := range requestForCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			svc := newService(tc.opts...)
			got, err := RequestFor(svc, tc.nsLabels)
			if err != nil {
				t.Fatalf("RequestFor: unexpected error: %v", err)
			}
			want := tc.want
			want.Owner, want.Namespace = "shop/web", "shop"
			if !reflect.DeepEqual(got, want) {
				t.Errorf("RequestFor:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// requestForErrorCase is a Service RequestFor must reject with an error
// message containing every string of wantIn.
type requestForErrorCase struct {
	name   string
	opts   []svcOption
	wantIn []string
}

// requestForErrorCases are shared by TestRequestForErrors and
// FuzzRequestFor's seeds.
func requestForErrorCases() []requestForErrorCase {
	tooLong := strings.Repeat("k", maxSharingKeyLen+1)
	return []requestForErrorCase{
		{
			name:   "ips annotation with garbage entry",
			opts:   []svcOption{withAnnotation(AnnotationIPs, "192.0.2.10, not-an-ip")},
			wantIn: []string{AnnotationIPs, `"not-an-ip"`},
		},
		{
			name:   "ips annotation with a CIDR",
			opts:   []svcOption{withAnnotation(AnnotationIPs, "192.0.2.0/24")},
			wantIn: []string{AnnotationIPs, `"192.0.2.0/24"`},
		},
		{
			name:   "ips annotation with out-of-range octet",
			opts:   []svcOption{withAnnotation(AnnotationIPs, "192.0.2.256")},
			wantIn: []string{AnnotationIPs, `"192.0.2.256"`},
		},
		{
			name:   "ips annotation with a zone",
			opts:   []svcOption{withAnnotation(AnnotationIPs, "fe80::1%eth0")},
			wantIn: []string{AnnotationIPs, `"fe80::1%eth0"`},
		},
		{
			name:   "ips annotation with two IPv4 addresses",
			opts:   []svcOption{withAnnotation(AnnotationIPs, "192.0.2.10,192.0.2.11")},
			wantIn: []string{AnnotationIPs, "two IPv4", "192.0.2.10", "192.0.2.11"},
		},
		{
			name:   "ips annotation with two IPv6 addresses",
			opts:   []svcOption{withAnnotation(AnnotationIPs, "2001:db8::1, 192.0.2.1, 2001:db8::2")},
			wantIn: []string{AnnotationIPs, "two IPv6", "2001:db8::1", "2001:db8::2"},
		},
		{
			name:   "ips annotation with an IPv4 and a mapped IPv4 address",
			opts:   []svcOption{withAnnotation(AnnotationIPs, "192.0.2.10,::ffff:192.0.2.11")},
			wantIn: []string{AnnotationIPs, "two IPv4", "192.0.2.10", "192.0.2.11"},
		},
		{
			name:   "spec.loadBalancerIP differs from the annotation",
			opts:   []svcOption{withAnnotation(AnnotationIPs, "192.0.2.10"), withLBIP("192.0.2.99")},
			wantIn: []string{"spec.loadBalancerIP", AnnotationIPs, "192.0.2.99", "192.0.2.10"},
		},
		{
			name:   "spec.loadBalancerIP malformed",
			opts:   []svcOption{withLBIP("192.0.2.300")},
			wantIn: []string{"spec.loadBalancerIP", `"192.0.2.300"`},
		},
		{
			name:   "spec.loadBalancerIP with a zone",
			opts:   []svcOption{withLBIP("fe80::1%eth0")},
			wantIn: []string{"spec.loadBalancerIP", `"fe80::1%eth0"`},
		},
		{
			name: "requested IPv6 address on an IPv4 Service",
			opts: []svcOption{
				withFamilies(v1.IPFamilyPolicySingleStack, v1.IPv4Protocol),
				withAnnotation(AnnotationIPs, "2001:db8::10"),
			},
			wantIn: []string{"2001:db8::10", "IPv6", "spec.ipFamilies"},
		},
		{
			name:   "spec.loadBalancerIP IPv4 on an IPv6 Service",
			opts:   []svcOption{withFamilies(v1.IPFamilyPolicySingleStack, v1.IPv6Protocol), withLBIP("192.0.2.10")},
			wantIn: []string{"192.0.2.10", "IPv4", "spec.ipFamilies"},
		},
		{
			name:   "pool annotation not a DNS-1123 name",
			opts:   []svcOption{withAnnotation(AnnotationPool, "Gold_Pool")},
			wantIn: []string{AnnotationPool, `"Gold_Pool"`},
		},
		{
			name:   "pool annotation blank",
			opts:   []svcOption{withAnnotation(AnnotationPool, "  ")},
			wantIn: []string{AnnotationPool},
		},
		{
			name:   "pool annotation too long",
			opts:   []svcOption{withAnnotation(AnnotationPool, strings.Repeat("a", validation.DNS1123SubdomainMaxLength+1))},
			wantIn: []string{AnnotationPool},
		},
		{
			name:   "vipcast's and MetalLB's pool disagree",
			opts:   []svcOption{withAnnotation(AnnotationPool, "gold"), withAnnotation("metallb.io/address-pool", "silver")},
			wantIn: []string{`annotations vipcast.io/pool "gold" and metallb.io/address-pool "silver" ask for different things`, "keep one of them"},
		},
		{
			name:   "MetalLB's two spellings of the addresses disagree",
			opts:   []svcOption{withAnnotation("metallb.io/loadBalancerIPs", "192.0.2.7"), withAnnotation("metallb.universe.tf/loadBalancerIPs", "192.0.2.8")},
			wantIn: []string{`metallb.io/loadBalancerIPs "192.0.2.7" and metallb.universe.tf/loadBalancerIPs "192.0.2.8"`},
		},
		{
			name:   "vipcast's and MetalLB's sharing keys disagree",
			opts:   []svcOption{withAnnotation(AnnotationSharingKey, "a"), withAnnotation("metallb.universe.tf/allow-shared-ip", "b")},
			wantIn: []string{AnnotationSharingKey, "metallb.universe.tf/allow-shared-ip"},
		},
		{
			name:   "a bad address in MetalLB's spelling",
			opts:   []svcOption{withAnnotation("metallb.io/loadBalancerIPs", "192.0.2.300")},
			wantIn: []string{`annotation metallb.io/loadBalancerIPs: "192.0.2.300" is not an IP address`},
		},
		{
			name:   "sharing key empty",
			opts:   []svcOption{withAnnotation(AnnotationSharingKey, "")},
			wantIn: []string{AnnotationSharingKey},
		},
		{
			name:   "sharing key blank",
			opts:   []svcOption{withAnnotation(AnnotationSharingKey, " \t ")},
			wantIn: []string{AnnotationSharingKey},
		},
		{
			name:   "sharing key too long",
			opts:   []svcOption{withAnnotation(AnnotationSharingKey, tooLong)},
			wantIn: []string{AnnotationSharingKey, "253"},
		},
		{
			name:   "sharing across namespaces with any namespace (the old \"true\")",
			opts:   []svcOption{withAnnotation(AnnotationSharingKey, "dns"), withAnnotation(AnnotationAllowSharedIPAcrossNamespaces, " True ")},
			wantIn: []string{AnnotationAllowSharedIPAcrossNamespaces, `"true"`, "any namespace that knows the sharing key", "name the namespaces", "shop"},
		},
		{
			name:   "sharing across namespaces with a name that is no namespace's",
			opts:   []svcOption{withAnnotation(AnnotationSharingKey, "dns"), withAnnotation(AnnotationAllowSharedIPAcrossNamespaces, "team-b,Team_C")},
			wantIn: []string{AnnotationAllowSharedIPAcrossNamespaces, `"Team_C" is not a namespace name`},
		},
		{
			name:   "sharing across namespaces without a sharing key",
			opts:   []svcOption{withAnnotation(AnnotationAllowSharedIPAcrossNamespaces, "team-b")},
			wantIn: []string{AnnotationAllowSharedIPAcrossNamespaces, AnnotationSharingKey},
		},
	}
}

func TestRequestForErrors(t *testing.T) {
	for _, tc := range requestForErrorCases() {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RequestFor(newService(tc.opts...), nil)
			if err == nil {
				t.Fatal("RequestFor: got no error")
			}
			if r := ipam.ReasonOf(err); r != ipam.ReasonInvalid {
				t.Errorf("ReasonOf(%v) = %q, want %q", err, r, ipam.ReasonInvalid)
			}
			for _, s := range tc.wantIn {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func TestOwner(t *testing.T) {
	if got := Owner(newService()); got != "shop/web" {
		t.Errorf("Owner = %q, want %q", got, "shop/web")
	}
}

func TestRestoreRequest(t *testing.T) {
	ports := []v1.ServicePort{port(v1.ProtocolTCP, 80), port(v1.ProtocolUDP, 53)}
	wantPorts := []ipam.Port{{Protocol: "TCP", Port: 80}, {Protocol: "UDP", Port: 53}}
	tests := []struct {
		name    string
		opts    []svcOption
		wantKey string
	}{
		{
			name:    "malformed pool annotation",
			opts:    []svcOption{withAnnotation(AnnotationPool, "Not_A_Pool"), withAnnotation(AnnotationSharingKey, "team-a")},
			wantKey: "team-a",
		},
		{
			name:    "malformed ips annotation",
			opts:    []svcOption{withAnnotation(AnnotationIPs, "garbage"), withAnnotation(AnnotationSharingKey, "team-a")},
			wantKey: "team-a",
		},
		{
			name:    "conflicting spec.loadBalancerIP",
			opts:    []svcOption{withAnnotation(AnnotationIPs, "192.0.2.1"), withLBIP("192.0.2.2"), withAnnotation(AnnotationSharingKey, "team-a")},
			wantKey: "team-a",
		},
		{
			name:    "blank sharing key restores as no key",
			opts:    []svcOption{withAnnotation(AnnotationSharingKey, "   ")},
			wantKey: "",
		},
		{
			name:    "too long sharing key is kept raw",
			opts:    []svcOption{withAnnotation(AnnotationSharingKey, strings.Repeat("x", 300))},
			wantKey: strings.Repeat("x", 300),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			svc := newService(append([]svcOption{withPorts(ports...), withLocalPolicy()}, tc.opts...)...)
			if _, err := RequestFor(svc, nil); err == nil {
				t.Fatal("test Service is meant to be rejected by RequestFor")
			}
			got := restoreRequest(svc)
			if got.Owner != "shop/web" || got.Namespace != "shop" {
				t.Errorf("Owner, Namespace = %q, %q; want %q, %q", got.Owner, got.Namespace, "shop/web", "shop")
			}
			if !reflect.DeepEqual(got.Ports, wantPorts) {
				t.Errorf("Ports = %v, want %v", got.Ports, wantPorts)
			}
			if got.SharingKey != tc.wantKey {
				t.Errorf("SharingKey = %q, want %q", got.SharingKey, tc.wantKey)
			}
			if !got.LocalTrafficPolicy {
				t.Error("LocalTrafficPolicy = false, want true")
			}
		})
	}

	t.Run("valid service restores as RequestFor without namespace labels", func(t *testing.T) {
		svc := newService(withPorts(ports...), withAnnotation(AnnotationSharingKey, " team-a "),
			withAnnotation(AnnotationPool, "gold"), withSelector(map[string]string{"app": "shop"}),
			withFamilies(v1.IPFamilyPolicyPreferDualStack, v1.IPv4Protocol, v1.IPv6Protocol))
		want, err := RequestFor(svc, nil)
		if err != nil {
			t.Fatalf("RequestFor: %v", err)
		}
		if got := restoreRequest(svc); !reflect.DeepEqual(got, want) {
			t.Errorf("restoreRequest:\n got %+v\nwant %+v", got, want)
		}
	})
}

// fuzzFamilyConfigs are the ipFamilyPolicy/ipFamilies combinations
// FuzzRequestFor picks from.
var fuzzFamilyConfigs = []struct {
	policy v1.IPFamilyPolicy
	fams   []v1.IPFamily
}{
	{"", nil},
	{v1.IPFamilyPolicySingleStack, []v1.IPFamily{v1.IPv4Protocol}},
	{v1.IPFamilyPolicySingleStack, []v1.IPFamily{v1.IPv6Protocol}},
	{v1.IPFamilyPolicyPreferDualStack, []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}},
	{v1.IPFamilyPolicyRequireDualStack, []v1.IPFamily{v1.IPv6Protocol, v1.IPv4Protocol}},
}

// Bits of FuzzRequestFor's present argument: which annotations are set.
const (
	fuzzHasPool = 1 << iota
	fuzzHasIPs
	fuzzHasKey
)

// fuzzInput holds FuzzRequestFor's arguments.
type fuzzInput struct {
	pool, ips, key, lbIP string
	present, famSel      uint8
}

// fuzzSeed extracts FuzzRequestFor's arguments from a table Service.
func fuzzSeed(svc *v1.Service) fuzzInput {
	in := fuzzInput{lbIP: svc.Spec.LoadBalancerIP}
	var ok bool
	if in.pool, ok = svc.Annotations[AnnotationPool]; ok {
		in.present |= fuzzHasPool
	}
	if in.ips, ok = svc.Annotations[AnnotationIPs]; ok {
		in.present |= fuzzHasIPs
	}
	if in.key, ok = svc.Annotations[AnnotationSharingKey]; ok {
		in.present |= fuzzHasKey
	}
	var policy v1.IPFamilyPolicy
	if svc.Spec.IPFamilyPolicy != nil {
		policy = *svc.Spec.IPFamilyPolicy
	}
	for i, c := range fuzzFamilyConfigs {
		if c.policy == policy && reflect.DeepEqual(c.fams, svc.Spec.IPFamilies) {
			in.famSel = uint8(i)
		}
	}
	return in
}

// FuzzRequestFor feeds arbitrary annotation and spec.loadBalancerIP values
// to RequestFor: it must not panic, must reject only with ReasonInvalid,
// and what it accepts must be a well-formed request.
func FuzzRequestFor(f *testing.F) {
	var seeds []fuzzInput
	for _, tc := range requestForCases(f) {
		seeds = append(seeds, fuzzSeed(newService(tc.opts...)))
	}
	for _, tc := range requestForErrorCases() {
		seeds = append(seeds, fuzzSeed(newService(tc.opts...)))
	}
	for _, in := range seeds {
		f.Add(in.pool, in.ips, in.key, in.lbIP, in.present, in.famSel)
	}
	f.Fuzz(func(t *testing.T, pool, ips, key, lbIP string, present, famSel uint8) {
		cfg := fuzzFamilyConfigs[int(famSel)%len(fuzzFamilyConfigs)]
		opts := []svcOption{withLBIP(lbIP), withFamilies(cfg.policy, cfg.fams...), withPorts(port("", 80))}
		if present&fuzzHasPool != 0 {
			opts = append(opts, withAnnotation(AnnotationPool, pool))
		}
		if present&fuzzHasIPs != 0 {
			opts = append(opts, withAnnotation(AnnotationIPs, ips))
		}
		if present&fuzzHasKey != 0 {
			opts = append(opts, withAnnotation(AnnotationSharingKey, key))
		}
		svc := newService(opts...)

		if r := restoreRequest(svc); r.Owner != "shop/web" || len(r.Ports) != 1 {
			t.Errorf("restoreRequest lost the owner or ports: %+v", r)
		}

		req, err := RequestFor(svc, nil)
		if err != nil {
			if r := ipam.ReasonOf(err); r != ipam.ReasonInvalid {
				t.Fatalf("ReasonOf(%q) = %q, want %q", err, r, ipam.ReasonInvalid)
			}
			return
		}
		seen := map[ipam.Family]bool{}
		for _, ip := range req.IPs {
			if !ip.IsValid() || ip.Zone() != "" || ip.Is4In6() {
				t.Errorf("requested IP %v is invalid, zoned or mapped", ip)
			}
			f := ipam.FamilyOf(ip)
			if seen[f] {
				t.Errorf("two %s addresses in %v", f, req.IPs)
			}
			seen[f] = true
			if len(cfg.fams) > 0 && !containsFamily(req.Families, f) {
				t.Errorf("requested %s address %v but families are %v", f, ip, req.Families)
			}
		}
		if present&fuzzHasPool != 0 {
			if req.Pool != strings.TrimSpace(pool) || len(validation.IsDNS1123Subdomain(req.Pool)) > 0 {
				t.Errorf("accepted pool %q from annotation %q", req.Pool, pool)
			}
		} else if req.Pool != "" {
			t.Errorf("Pool = %q without annotation", req.Pool)
		}
		if present&fuzzHasKey != 0 {
			if req.SharingKey != strings.TrimSpace(key) || req.SharingKey == "" || len(req.SharingKey) > maxSharingKeyLen {
				t.Errorf("accepted sharing key %q from annotation %q", req.SharingKey, key)
			}
		} else if req.SharingKey != "" {
			t.Errorf("SharingKey = %q without annotation", req.SharingKey)
		}
	})
}

// TestRestoreSharesDespiteMalformedAnnotations: a Service whose annotations
// no longer validate is restored with the same selector, trimmed sharing key
// and defaulted protocols as a valid one, so it keeps a VIP it shares and
// still clashes where it should.
func TestRestoreSharesDespiteMalformedAnnotations(t *testing.T) {
	vip := []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	sel := map[string]string{"app": "web"}
	valid := newService(withName("a"), withPorts(port(v1.ProtocolTCP, 80)), withLocalPolicy(), withSelector(sel),
		withAnnotation(AnnotationSharingKey, "k"))
	tests := []struct {
		name    string
		b       *v1.Service
		wantErr ipam.Reason
	}{
		{"same selector and key, other port", newService(withName("b"), withPorts(port(v1.ProtocolTCP, 443)), withLocalPolicy(), withSelector(sel),
			withAnnotation(AnnotationSharingKey, " k "), withAnnotation(AnnotationPool, "Bad_Pool")), ""},
		{"empty protocol is TCP and clashes", newService(withName("b"), withPorts(port("", 80)), withLocalPolicy(), withSelector(sel),
			withAnnotation(AnnotationSharingKey, "k"), withAnnotation(AnnotationPool, "Bad_Pool")), ipam.ReasonPortClash},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := ipam.New()
			if err := a.Restore(restoreRequest(valid), vip); err != nil {
				t.Fatalf("restoring the valid Service: %v", err)
			}
			err := a.Restore(restoreRequest(tc.b), vip)
			if got := ipam.ReasonOf(err); got != tc.wantErr {
				t.Fatalf("restore of the malformed Service: reason %q (%v), want %q", got, err, tc.wantErr)
			}
		})
	}
}

// TestEmptyIPsAnnotationRequestsNothing: "" and a trailing comma are not
// addresses to request.
func TestEmptyIPsAnnotationRequestsNothing(t *testing.T) {
	for _, raw := range []string{"", " ", "192.0.2.1,", ",192.0.2.1"} {
		req, err := RequestFor(newService(withAnnotation(AnnotationIPs, raw)), nil)
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		want := 0
		if strings.Contains(raw, "192.0.2.1") {
			want = 1
		}
		if len(req.IPs) != want {
			t.Errorf("%q: requested %v, want %d address(es)", raw, req.IPs, want)
		}
	}
}
