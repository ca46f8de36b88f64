package poolspec

import (
	"math"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	fx "github.com/vipcast/vipcast/api/v1alpha1/v1alpha1test"
	"github.com/vipcast/vipcast/ipam"
)

var badSel = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: "Near", Values: []string{"a"}}}}

func TestAdmit(t *testing.T) {
	tests := []struct {
		name  string
		pools []*v1alpha1.IPPool
		// admitted are the admitted pools, oldest first.
		admitted []string
		// refused: pool → its reason, then substrings of its message.
		refused map[string][]string
		// owner: IP → owning pool ("" for none).
		owner map[string]string
	}{
		{
			name:     "containment over CIDRs and ranges of both families",
			pools:    []*v1alpha1.IPPool{fx.Pool("b", 1, "2001:db8::/64"), fx.Pool("a", 0, "192.0.2.0/24", "198.51.100.10-198.51.100.20")},
			admitted: []string{"a", "b"},
			owner: map[string]string{"192.0.2.0": "a", "192.0.2.255": "a", "198.51.100.10": "a", "198.51.100.20": "a", "198.51.100.21": "",
				"198.51.100.9": "", "2001:db8::1": "b", "2001:db8:0:0:ffff:ffff:ffff:ffff": "b", "2001:db8:1::": "", "10.0.0.1": "", "::": ""},
		},
		{
			name:     "overlap: the older pool wins, regardless of list order",
			pools:    []*v1alpha1.IPPool{fx.Pool("new", 10, "192.0.2.128/25", "203.0.113.0/24"), fx.Pool("old", 5, "192.0.2.0/24")},
			admitted: []string{"old"},
			refused:  map[string][]string{"new": {v1alpha1.ReasonOverlap, "spec.addresses: ", `"old"`, `addresses[0] "192.0.2.128/25"`, "shrink or remove"}},
			owner:    map[string]string{"192.0.2.200": "old", "203.0.113.1": ""},
		},
		{
			name:     "overlap with equal timestamps: the smaller name wins",
			pools:    []*v1alpha1.IPPool{fx.Pool("zz", 0, "192.0.2.0/24"), fx.Pool("aa", 0, "192.0.2.0/25")},
			admitted: []string{"aa"},
			refused:  map[string][]string{"zz": {v1alpha1.ReasonOverlap}},
			owner:    map[string]string{"192.0.2.1": "aa", "192.0.2.200": ""},
		},
		{
			name:     "entries of one pool overlap",
			pools:    []*v1alpha1.IPPool{fx.Pool("p", 0, "192.0.2.0/24", "192.0.2.128/25")},
			refused:  map[string][]string{"p": {v1alpha1.ReasonOverlap, "spec.addresses: ", "an address may appear only once"}},
			owner:    map[string]string{"192.0.2.1": ""},
			admitted: nil,
		},
		{
			name:     "unparsable addresses: refused, owns nothing, shadows nothing",
			pools:    []*v1alpha1.IPPool{fx.Pool("old", 0, "192.0.2.0/24", "bogus"), fx.Pool("new", 1, "192.0.2.0/24")},
			admitted: []string{"new"},
			refused:  map[string][]string{"old": {v1alpha1.ReasonInvalidAddresses, `spec.addresses: addresses[1] "bogus"`, "write a CIDR"}},
			owner:    map[string]string{"192.0.2.1": "new"},
		},
		{
			name: "allocation selector that does not parse",
			pools: []*v1alpha1.IPPool{
				fx.WithAllocation(fx.Pool("old", 0, "192.0.2.0/24"), v1alpha1.IPPoolAllocation{NamespaceSelectors: []metav1.LabelSelector{{}, badSel}}),
				fx.Pool("new", 1, "192.0.2.0/25"),
			},
			admitted: []string{"new"},
			refused:  map[string][]string{"old": {v1alpha1.ReasonInvalidSelector, "spec.allocation.namespaceSelectors[1]: ", `"Near"`, "fix the selector"}},
			owner:    map[string]string{"192.0.2.1": "new", "192.0.2.200": ""},
		},
		{
			name:    "service selector that does not parse",
			pools:   []*v1alpha1.IPPool{fx.WithAllocation(fx.Pool("p", 0, "192.0.2.0/24"), v1alpha1.IPPoolAllocation{ServiceSelectors: []metav1.LabelSelector{badSel}})},
			refused: map[string][]string{"p": {v1alpha1.ReasonInvalidSelector, "spec.allocation.serviceSelectors[0]: "}},
		},
		{
			// The CCM's rule, which the speaker now follows too: a pool
			// refused for its spec.bgp owns nothing, so a newer pool
			// overlapping it is admitted.
			name: "unannounceable spec.bgp: refused before the overlap check",
			pools: []*v1alpha1.IPPool{
				fx.WithBGP(fx.Pool("old", 0, "192.0.2.0/24"), v1alpha1.IPPoolBGP{Communities: []string{"64512:100", "65536:1"}}),
				fx.Pool("new", 1, "192.0.2.0/24"),
			},
			admitted: []string{"new"},
			refused: map[string][]string{"old": {v1alpha1.ReasonInvalidConfig, `spec.bgp.communities[1] "65536:1"`, "ASN:VALUE",
				"the speakers would not announce this pool, so no VIP is allocated from it"}},
			owner: map[string]string{"192.0.2.1": "new"},
		},
		{
			name:     "aggregation covering addresses outside the pool",
			pools:    []*v1alpha1.IPPool{fx.WithBGP(fx.Pool("p", 0, "192.0.2.10-192.0.2.21"), v1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](24)})},
			refused:  map[string][]string{"p": {v1alpha1.ReasonInvalidAddresses, "spec.bgp.aggregationLength 24 would announce 192.0.2.0/24", "use 31 or longer"}},
			owner:    map[string]string{"192.0.2.10": ""},
			admitted: nil,
		},
		{
			name:    "malformed BGP node selector",
			pools:   []*v1alpha1.IPPool{fx.WithBGP(fx.Pool("p", 0, "192.0.2.0/24"), v1alpha1.IPPoolBGP{NodeSelector: &badSel})},
			refused: map[string][]string{"p": {v1alpha1.ReasonInvalidSelector, "spec.bgp.nodeSelector: ", "fix the selector"}},
		},
		{
			name: "first problem wins: addresses, allocation selectors, spec.bgp, overlap",
			pools: []*v1alpha1.IPPool{
				fx.WithBGP(fx.WithAllocation(fx.Pool("addr", 0, "bogus"), v1alpha1.IPPoolAllocation{ServiceSelectors: []metav1.LabelSelector{badSel}}), v1alpha1.IPPoolBGP{PeerSelector: &badSel}),
				fx.WithBGP(fx.WithAllocation(fx.Pool("alloc", 1, "192.0.2.0/24"), v1alpha1.IPPoolAllocation{ServiceSelectors: []metav1.LabelSelector{badSel}}), v1alpha1.IPPoolBGP{PeerSelector: &badSel}),
				fx.WithBGP(fx.Pool("bgp", 2, "192.0.2.0/24"), v1alpha1.IPPoolBGP{PeerSelector: &badSel}),
				fx.Pool("first", 3, "192.0.2.0/24"),
				fx.Pool("overlap", 4, "192.0.2.0/24"),
			},
			admitted: []string{"first"},
			refused: map[string][]string{
				"addr":    {v1alpha1.ReasonInvalidAddresses, "spec.addresses"},
				"alloc":   {v1alpha1.ReasonInvalidSelector, "spec.allocation.serviceSelectors[0]"},
				"bgp":     {v1alpha1.ReasonInvalidSelector, "spec.bgp.peerSelector"},
				"overlap": {v1alpha1.ReasonOverlap, `"first"`},
			},
			owner: map[string]string{"192.0.2.7": "first"},
		},
		{
			name:     "a pool without addresses (the API forbids it) is refused by the allocator's rule",
			pools:    []*v1alpha1.IPPool{fx.Pool("empty", 0)},
			refused:  map[string][]string{"empty": {v1alpha1.ReasonInvalidAddresses, "spec.addresses: ", "add at least one CIDR or range"}},
			admitted: nil,
		},
		{
			name: "nil, nameless and repeated pools are ignored",
			pools: []*v1alpha1.IPPool{
				nil, fx.Pool("", 0, "10.0.0.0/8"), fx.Pool("p", 5, "198.51.100.0/24"), fx.Pool("p", 1, "192.0.2.0/24"),
			},
			admitted: []string{"p"},
			owner:    map[string]string{"192.0.2.1": "p", "198.51.100.1": "", "10.0.0.1": ""},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.pools)
			adm := Admit(tc.pools)
			if !slices.Equal(in, tc.pools) {
				t.Errorf("Admit reordered its input")
			}
			var names []string
			for _, p := range adm.Pools {
				names = append(names, p.Name)
			}
			if !slices.Equal(names, tc.admitted) {
				t.Errorf("admitted %v, want %v", names, tc.admitted)
			}
			if len(adm.Refused) != len(tc.refused) {
				t.Errorf("refused %+v, want %d", adm.Refused, len(tc.refused))
			}
			for i, r := range adm.Refused {
				if got, ok := adm.RefusalOf(r.Pool); !ok || got != r {
					t.Errorf("RefusalOf(%s) = %+v, %v; want %+v", r.Pool, got, ok, r)
				}
				if i > 0 && slices.Index(poolOrder(tc.pools), r.Pool) < slices.Index(poolOrder(tc.pools), adm.Refused[i-1].Pool) {
					t.Errorf("Refused not oldest first: %+v", adm.Refused)
				}
				want, ok := tc.refused[r.Pool]
				if !ok {
					t.Errorf("unexpected refusal %+v", r)
					continue
				}
				if r.Reason != want[0] {
					t.Errorf("%s: reason %s, want %s", r.Pool, r.Reason, want[0])
				}
				for _, s := range want[1:] {
					if !strings.Contains(r.Message, s) {
						t.Errorf("%s: message %q does not contain %q", r.Pool, r.Message, s)
					}
				}
			}
			for _, p := range adm.Pools {
				if _, refused := adm.RefusalOf(p.Name); refused {
					t.Errorf("pool %s both admitted and refused", p.Name)
				}
			}
			for ip, want := range tc.owner {
				if got := adm.Owner(netip.MustParseAddr(ip)); got != want {
					t.Errorf("Owner(%s) = %q, want %q", ip, got, want)
				}
			}
			if errs := ipam.New().SetPools(adm.Specs()); errs != nil {
				t.Errorf("the allocator refuses admitted pools: %v", errs)
			}
		})
	}
}

// poolOrder returns the names of pools, oldest first.
func poolOrder(pools []*v1alpha1.IPPool) []string {
	ordered := slices.DeleteFunc(slices.Clone(pools), func(p *v1alpha1.IPPool) bool { return p == nil })
	slices.SortStableFunc(ordered, func(a, b *v1alpha1.IPPool) int {
		if v1alpha1.OlderFirst(a, b) {
			return -1
		}
		if v1alpha1.OlderFirst(b, a) {
			return 1
		}
		return 0
	})
	var out []string
	for _, p := range ordered {
		out = append(out, p.Name)
	}
	return out
}

func TestAdmitSpec(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name   string
		modify func(*v1alpha1.IPPool)
		want   ipam.Pool
	}{
		{
			name: "defaults",
			want: ipam.Pool{Name: "blue", Addresses: []string{"192.0.2.0/24"}, AutoAssign: true, Priority: math.MaxInt32},
		},
		{
			name:   "autoAssign true",
			modify: func(p *v1alpha1.IPPool) { p.Spec.AutoAssign = &yes },
			want:   ipam.Pool{Name: "blue", Addresses: []string{"192.0.2.0/24"}, AutoAssign: true, Priority: math.MaxInt32},
		},
		{
			name:   "autoAssign false and avoidBuggyIPs",
			modify: func(p *v1alpha1.IPPool) { p.Spec.AutoAssign, p.Spec.AvoidBuggyIPs = &no, true },
			want:   ipam.Pool{Name: "blue", Addresses: []string{"192.0.2.0/24"}, AvoidBuggyIPs: true, Priority: math.MaxInt32},
		},
		{
			name:   "allocation without priority keeps the lowest precedence",
			modify: func(p *v1alpha1.IPPool) { p.Spec.Allocation = &v1alpha1.IPPoolAllocation{} },
			want:   ipam.Pool{Name: "blue", Addresses: []string{"192.0.2.0/24"}, AutoAssign: true, Priority: math.MaxInt32},
		},
		{
			name:   "priority set",
			modify: func(p *v1alpha1.IPPool) { p.Spec.Allocation = &v1alpha1.IPPoolAllocation{Priority: ptr.To[int32](5)} },
			want:   ipam.Pool{Name: "blue", Addresses: []string{"192.0.2.0/24"}, AutoAssign: true, Priority: 5},
		},
		{
			name:   "priority zero is not unset",
			modify: func(p *v1alpha1.IPPool) { p.Spec.Allocation = &v1alpha1.IPPoolAllocation{Priority: ptr.To[int32](0)} },
			want:   ipam.Pool{Name: "blue", Addresses: []string{"192.0.2.0/24"}, AutoAssign: true, Priority: 0},
		},
		{
			name: "namespaces copied, dual-stack addresses",
			modify: func(p *v1alpha1.IPPool) {
				p.Spec.Addresses = []string{"192.0.2.0/24", "2001:db8::10-2001:db8::ff"}
				p.Spec.Allocation = &v1alpha1.IPPoolAllocation{Namespaces: []string{"shop", "billing"}}
			},
			want: ipam.Pool{
				Name: "blue", Addresses: []string{"192.0.2.0/24", "2001:db8::10-2001:db8::ff"},
				AutoAssign: true, Priority: math.MaxInt32, Namespaces: []string{"shop", "billing"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := fx.Pool("blue", 0, "192.0.2.0/24")
			if tc.modify != nil {
				tc.modify(p)
			}
			adm := Admit([]*v1alpha1.IPPool{p})
			if len(adm.Pools) != 1 {
				t.Fatalf("refused: %+v", adm.Refused)
			}
			if got := adm.Pools[0].Spec; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Spec:\n got %+v\nwant %+v", got, tc.want)
			}
			if got := adm.Specs(); len(got) != 1 || !reflect.DeepEqual(got[0], tc.want) {
				t.Errorf("Specs() = %+v", got)
			}
		})
	}
}

func TestAdmitSelectors(t *testing.T) {
	p := fx.WithAllocation(fx.Pool("blue", 0, "192.0.2.0/24"), v1alpha1.IPPoolAllocation{
		NamespaceSelectors: []metav1.LabelSelector{
			{MatchLabels: map[string]string{"team": "a"}},
			{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpIn, Values: []string{"prod", "staging"}}}},
		},
		ServiceSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"expose": "public", "tier": "web"}}},
	})
	fx.WithBGP(p, v1alpha1.IPPoolBGP{
		PeerSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "tor"}},
		NodeSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "bgp", Operator: metav1.LabelSelectorOpExists}}},
	})
	adm := Admit([]*v1alpha1.IPPool{p})
	if len(adm.Pools) != 1 {
		t.Fatalf("refused: %+v", adm.Refused)
	}
	got := adm.Pools[0]
	if len(got.Spec.NamespaceSelectors) != 2 || len(got.Spec.ServiceSelectors) != 1 {
		t.Fatalf("got %d namespace and %d service selectors, want 2 and 1", len(got.Spec.NamespaceSelectors), len(got.Spec.ServiceSelectors))
	}
	tests := []struct {
		name     string
		selector labels.Selector
		labels   labels.Set
		want     bool
	}{
		{"namespace matchLabels matches", got.Spec.NamespaceSelectors[0], labels.Set{"team": "a", "other": "x"}, true},
		{"namespace matchLabels wrong value", got.Spec.NamespaceSelectors[0], labels.Set{"team": "b"}, false},
		{"namespace matchLabels missing key", got.Spec.NamespaceSelectors[0], labels.Set{}, false},
		{"namespace expression matches", got.Spec.NamespaceSelectors[1], labels.Set{"env": "staging"}, true},
		{"namespace expression does not match", got.Spec.NamespaceSelectors[1], labels.Set{"env": "dev"}, false},
		{"service matchLabels all keys", got.Spec.ServiceSelectors[0], labels.Set{"expose": "public", "tier": "web"}, true},
		{"service matchLabels partial", got.Spec.ServiceSelectors[0], labels.Set{"expose": "public"}, false},
		{"peer selector", got.BGP.PeerSelector, labels.Set{"role": "tor"}, true},
		{"peer selector other role", got.BGP.PeerSelector, labels.Set{"role": "rr"}, false},
		{"node selector", got.BGP.NodeSelector, labels.Set{"bgp": ""}, true},
		{"node selector without the label", got.BGP.NodeSelector, labels.Set{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if m := tc.selector.Matches(tc.labels); m != tc.want {
				t.Errorf("%q.Matches(%v) = %v, want %v", tc.selector, tc.labels, m, tc.want)
			}
		})
	}
}

func TestAdmitBGP(t *testing.T) {
	p := fx.WithBGP(fx.Pool("attrs", 0, "192.0.2.0/24", "2001:db8::/64"), v1alpha1.IPPoolBGP{
		Communities:         []string{"no-export", "64512:100", "64512:100", "0:0", "65535:65535", "blackhole"},
		LargeCommunities:    []string{"4200000000:1:2", "1:2:3", "4294967295:0:4294967295", "1:2:3"},
		LocalPref:           ptr.To[uint32](200),
		AggregationLength:   ptr.To[int32](28),
		AggregationLengthV6: ptr.To[int32](120),
	})
	adm := Admit([]*v1alpha1.IPPool{p, fx.Pool("plain", 1, "203.0.113.0/24")})
	if len(adm.Pools) != 2 {
		t.Fatalf("refused: %+v", adm.Refused)
	}
	want := BGP{
		Communities:         []uint32{0, 64512<<16 | 100, 0xFFFF029A, 0xFFFFFF01, 0xFFFFFFFF},
		LargeCommunities:    []LargeCommunity{{1, 2, 3}, {4200000000, 1, 2}, {4294967295, 0, 4294967295}},
		LocalPref:           ptr.To[uint32](200),
		AggregationLength:   28,
		AggregationLengthV6: 120,
	}
	if got := adm.Pools[0].BGP; !reflect.DeepEqual(got, want) {
		t.Errorf("BGP:\n got %+v\nwant %+v", got, want)
	}
	if adm.Pools[0].BGP.LocalPref == p.Spec.BGP.LocalPref {
		t.Errorf("LocalPref aliases the IPPool's")
	}
	if got, want := adm.Pools[1].BGP, (BGP{AggregationLength: 32, AggregationLengthV6: 128}); !reflect.DeepEqual(got, want) {
		t.Errorf("defaults: got %+v, want %+v", got, want)
	}
	wantRanges := []ipam.Range{
		{First: netip.MustParseAddr("192.0.2.0"), Last: netip.MustParseAddr("192.0.2.255")},
		{First: netip.MustParseAddr("2001:db8::"), Last: netip.MustParseAddr("2001:db8::ffff:ffff:ffff:ffff")},
	}
	if got := adm.Pools[0].Ranges; !reflect.DeepEqual(got, wantRanges) {
		t.Errorf("Ranges = %v, want %v", got, wantRanges)
	}
}

func TestRefusedContaining(t *testing.T) {
	adm := Admit([]*v1alpha1.IPPool{
		fx.Pool("good", 0, "192.0.2.0/25"),
		fx.WithBGP(fx.Pool("dark", 1, "198.51.100.10-198.51.100.20"), v1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](24)}),
		fx.Pool("late", 2, "192.0.2.0/24"),
		fx.Pool("bogus", 3, "nope"),
	})
	for ip, want := range map[string]string{
		"198.51.100.15": "dark",
		"192.0.2.200":   "late",
		"192.0.2.1":     "late", // owned by good, but late's addresses contain it too
		"203.0.113.1":   "",
	} {
		r, ok := adm.RefusedContaining(netip.MustParseAddr(ip))
		if r.Pool != want || ok != (want != "") {
			t.Errorf("RefusedContaining(%s) = %+v, %v; want pool %q", ip, r, ok, want)
		}
	}
	if _, ok := adm.RefusalOf("good"); ok {
		t.Errorf("RefusalOf(good) reports a refusal")
	}
	if r, ok := adm.RefusalOf("bogus"); !ok || r.Reason != v1alpha1.ReasonInvalidAddresses {
		t.Errorf("RefusalOf(bogus) = %+v, %v", r, ok)
	}
}
