package v1alpha1_test

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
)

func TestBGPPeerSpecCheck(t *testing.T) {
	valid := func() v1alpha1.BGPPeerSpec {
		return v1alpha1.BGPPeerSpec{PeerAddress: "192.0.2.1", PeerASN: 64500, LocalASN: 64501}
	}
	cases := []struct {
		name   string
		mutate func(*v1alpha1.BGPPeerSpec)
		reason string // "" = usable
		field  string // the message names it
	}{
		{"minimal", func(*v1alpha1.BGPPeerSpec) {}, "", ""},
		{"full", func(s *v1alpha1.BGPPeerSpec) {
			s.PeerAddress, s.SourceAddress = "2001:db8::1", "2001:db8::10"
			s.Port, s.EBGPMultiHop = ptr.To[int32](1179), ptr.To[int32](255)
			s.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "rack", Operator: metav1.LabelSelectorOpIn, Values: []string{"a"}}}}
			s.Families = []v1alpha1.AddressFamily{v1alpha1.AddressFamilyIPv4Unicast, v1alpha1.AddressFamilyIPv6Unicast}
		}, "", ""},
		{"IPv4-mapped peer with IPv4 source", func(s *v1alpha1.BGPPeerSpec) { s.PeerAddress, s.SourceAddress = "::ffff:192.0.2.1", "192.0.2.10" }, "", ""},
		{"bad selector operator", func(s *v1alpha1.BGPPeerSpec) {
			s.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "rack", Operator: "Near"}}}
		}, v1alpha1.ReasonInvalidSelector, "spec.nodeSelector"},
		{"peer address with prefix", func(s *v1alpha1.BGPPeerSpec) { s.PeerAddress = "192.0.2.1/32" }, v1alpha1.ReasonInvalidConfig, "spec.peerAddress"},
		{"unspecified peer address", func(s *v1alpha1.BGPPeerSpec) { s.PeerAddress = "0.0.0.0" }, v1alpha1.ReasonInvalidConfig, "spec.peerAddress"},
		{"zoned peer address", func(s *v1alpha1.BGPPeerSpec) { s.PeerAddress = "fe80::1%eth0" }, v1alpha1.ReasonInvalidConfig, "spec.peerAddress"},
		{"zero peer ASN", func(s *v1alpha1.BGPPeerSpec) { s.PeerASN = 0 }, v1alpha1.ReasonInvalidConfig, "spec.peerASN"},
		{"zero local ASN", func(s *v1alpha1.BGPPeerSpec) { s.LocalASN = 0 }, v1alpha1.ReasonInvalidConfig, "spec.localASN"},
		{"port 0", func(s *v1alpha1.BGPPeerSpec) { s.Port = ptr.To[int32](0) }, v1alpha1.ReasonInvalidConfig, "spec.port"},
		{"port too big", func(s *v1alpha1.BGPPeerSpec) { s.Port = ptr.To[int32](70000) }, v1alpha1.ReasonInvalidConfig, "spec.port"},
		{"source not an address", func(s *v1alpha1.BGPPeerSpec) { s.SourceAddress = "eth0" }, v1alpha1.ReasonInvalidConfig, "spec.sourceAddress"},
		{"source of the other family", func(s *v1alpha1.BGPPeerSpec) { s.SourceAddress = "2001:db8::10" }, v1alpha1.ReasonInvalidConfig, "spec.sourceAddress"},
		{"TTL 0", func(s *v1alpha1.BGPPeerSpec) { s.EBGPMultiHop = ptr.To[int32](0) }, v1alpha1.ReasonInvalidConfig, "spec.ebgpMultiHop"},
		{"TTL 256", func(s *v1alpha1.BGPPeerSpec) { s.EBGPMultiHop = ptr.To[int32](256) }, v1alpha1.ReasonInvalidConfig, "spec.ebgpMultiHop"},
		{"unknown family", func(s *v1alpha1.BGPPeerSpec) { s.Families = []v1alpha1.AddressFamily{"l2vpn-evpn"} }, v1alpha1.ReasonInvalidConfig, "spec.families"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := valid()
			tc.mutate(&s)
			got := s.Check()
			switch {
			case tc.reason == "" && got != nil:
				t.Fatalf("Check() = %s: %s, want usable", got.Reason, got.Message)
			case tc.reason == "":
				return
			case got == nil:
				t.Fatalf("Check() = nil, want %s", tc.reason)
			case got.Reason != tc.reason || !strings.Contains(got.Message, tc.field):
				t.Fatalf("Check() = %s: %q, want %s naming %s", got.Reason, got.Message, tc.reason, tc.field)
			}
		})
	}
}
