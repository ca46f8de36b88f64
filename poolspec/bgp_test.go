package poolspec

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ipam"
)

// TestDecodeBGP checks the spec.bgp problems that refuse a pool.
func TestDecodeBGP(t *testing.T) {
	badSel := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "rack", Operator: "Near"}}}
	cases := []struct {
		name      string
		addresses []string
		bgp       *v1alpha1.IPPoolBGP
		reason    string // "" = usable
		want      string // in the message
	}{
		{"defaults", []string{"192.0.2.10-192.0.2.20", "2001:db8::/120"}, nil, "", ""},
		{"aggregation fills whole blocks", []string{"192.0.2.0/24", "198.51.100.0-198.51.100.255"}, &v1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](24)}, "", ""},
		{"aggregation over two adjacent ranges", []string{"192.0.2.0-192.0.2.127", "192.0.2.128-192.0.2.255"}, &v1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](24)}, "", ""},
		{"aggregation beyond a range", []string{"192.0.2.0-192.0.2.103"}, &v1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](24)}, v1alpha1.ReasonInvalidAddresses, "use 29 or longer"},
		{"IPv6 aggregation beyond the pool", []string{"2001:db8::/120"}, &v1alpha1.IPPoolBGP{AggregationLengthV6: ptr.To[int32](64)}, v1alpha1.ReasonInvalidAddresses, "spec.bgp.aggregationLengthV6 64"},
		{"aggregation out of range", []string{"192.0.2.0/24"}, &v1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](33)}, v1alpha1.ReasonInvalidAddresses, "out of range"},
		{"communities", []string{"192.0.2.0/24"}, &v1alpha1.IPPoolBGP{Communities: []string{"64512:100", "no-export"}, LargeCommunities: []string{"4200000000:1:2"}}, "", ""},
		{"community part too big", []string{"192.0.2.0/24"}, &v1alpha1.IPPoolBGP{Communities: []string{"64512:65536"}}, v1alpha1.ReasonInvalidConfig, "spec.bgp.communities[0]"},
		{"large community with two parts", []string{"192.0.2.0/24"}, &v1alpha1.IPPoolBGP{LargeCommunities: []string{"1:2"}}, v1alpha1.ReasonInvalidConfig, "spec.bgp.largeCommunities[0]"},
		{"bad peer selector", []string{"192.0.2.0/24"}, &v1alpha1.IPPoolBGP{PeerSelector: badSel}, v1alpha1.ReasonInvalidSelector, "spec.bgp.peerSelector"},
		{"bad node selector", []string{"192.0.2.0/24"}, &v1alpha1.IPPoolBGP{NodeSelector: badSel}, v1alpha1.ReasonInvalidSelector, "spec.bgp.nodeSelector"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ranges, err := ipam.ParseAddresses(tc.addresses)
			if err != nil {
				t.Fatal(err)
			}
			_, got := decodeBGP(tc.bgp, ranges)
			switch {
			case tc.reason == "" && got != nil:
				t.Fatalf("decodeBGP = %+v, want usable", got)
			case tc.reason == "":
			case got == nil:
				t.Fatalf("decodeBGP = nil, want %s", tc.reason)
			case got.reason != tc.reason || !strings.Contains(got.message, tc.want):
				t.Fatalf("decodeBGP = %s %q, want %s mentioning %q", got.reason, got.message, tc.reason, tc.want)
			}
		})
	}
}

func TestParseCommunities(t *testing.T) {
	if v, ok := parseCommunity("64512:100"); !ok || v != 64512<<16|100 {
		t.Errorf("parseCommunity(64512:100) = %d, %v", v, ok)
	}
	if v, ok := parseCommunity("no-export"); !ok || v != 0xFFFFFF01 {
		t.Errorf("parseCommunity(no-export) = %#x, %v", v, ok)
	}
	for _, bad := range []string{"", "1", "1:2:3", "x:1", "70000:1"} {
		if _, ok := parseCommunity(bad); ok {
			t.Errorf("parseCommunity(%q) accepted", bad)
		}
	}
	if v, ok := parseLargeCommunity("4200000000:1:2"); !ok || v != (LargeCommunity{4200000000, 1, 2}) {
		t.Errorf("parseLargeCommunity = %+v, %v", v, ok)
	}
	for _, bad := range []string{"1:2", "1:2:3:4", "4294967296:1:1", "a:b:c"} {
		if _, ok := parseLargeCommunity(bad); ok {
			t.Errorf("parseLargeCommunity(%q) accepted", bad)
		}
	}
}
