package v1alpha1_test

import (
	"strings"
	"testing"
	"time"

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
		{"BFD with defaults", func(s *v1alpha1.BGPPeerSpec) { s.BFD = &v1alpha1.BFDConfig{} }, "", ""},
		{"BFD at the bounds", func(s *v1alpha1.BGPPeerSpec) {
			s.BFD = &v1alpha1.BFDConfig{MinTx: dur(10 * time.Millisecond), MinRx: dur(time.Minute), Multiplier: ptr.To[int32](255)}
		}, "", ""},
		{"multihop BFD for a multihop session", func(s *v1alpha1.BGPPeerSpec) {
			s.EBGPMultiHop, s.BFD = ptr.To[int32](2), &v1alpha1.BFDConfig{Multihop: true}
		}, "", ""},
		{"BFD minTx too short", func(s *v1alpha1.BGPPeerSpec) { s.BFD = &v1alpha1.BFDConfig{MinTx: dur(5 * time.Millisecond)} }, v1alpha1.ReasonInvalidConfig, "spec.bfd.minTx"},
		{"BFD minRx too long", func(s *v1alpha1.BGPPeerSpec) { s.BFD = &v1alpha1.BFDConfig{MinRx: dur(61 * time.Second)} }, v1alpha1.ReasonInvalidConfig, "spec.bfd.minRx"},
		{"BFD multiplier 1", func(s *v1alpha1.BGPPeerSpec) { s.BFD = &v1alpha1.BFDConfig{Multiplier: ptr.To[int32](1)} }, v1alpha1.ReasonInvalidConfig, "spec.bfd.multiplier"},
		{"BFD multiplier 256", func(s *v1alpha1.BGPPeerSpec) { s.BFD = &v1alpha1.BFDConfig{Multiplier: ptr.To[int32](256)} }, v1alpha1.ReasonInvalidConfig, "spec.bfd.multiplier"},
		{"multihop BFD with BIRD's minimum TTL and authentication", func(s *v1alpha1.BGPPeerSpec) {
			s.EBGPMultiHop, s.BFD = ptr.To[int32](2), &v1alpha1.BFDConfig{Multihop: true, MinimumTTL: ptr.To[int32](64),
				Authentication: &v1alpha1.BFDAuthentication{Type: v1alpha1.BFDAuthKeyedSHA1, KeyID: 255, SecretRef: v1alpha1.SecretKeyReference{Name: "k", Namespace: "ns"}}}
		}, "", ""},
		{"BFD minimum TTL on single hop", func(s *v1alpha1.BGPPeerSpec) {
			s.BFD = &v1alpha1.BFDConfig{MinimumTTL: ptr.To[int32](64)}
		}, v1alpha1.ReasonInvalidConfig, "spec.bfd.minimumTTL applies to multihop BFD only"},
		{"BFD minimum TTL 0", func(s *v1alpha1.BGPPeerSpec) {
			s.BFD = &v1alpha1.BFDConfig{Multihop: true, MinimumTTL: ptr.To[int32](0)}
		}, v1alpha1.ReasonInvalidConfig, "spec.bfd.minimumTTL 0 is out of range"},
		{"BFD minimum TTL 256", func(s *v1alpha1.BGPPeerSpec) {
			s.BFD = &v1alpha1.BFDConfig{Multihop: true, MinimumTTL: ptr.To[int32](256)}
		}, v1alpha1.ReasonInvalidConfig, "spec.bfd.minimumTTL 256 is out of range"},
		{"BFD authentication MD5", func(s *v1alpha1.BGPPeerSpec) {
			s.BFD = &v1alpha1.BFDConfig{Authentication: &v1alpha1.BFDAuthentication{Type: "KeyedMD5", SecretRef: v1alpha1.SecretKeyReference{Name: "k", Namespace: "ns"}}}
		}, v1alpha1.ReasonInvalidConfig, "spec.bfd.authentication.type"},
		{"BFD authentication key ID 256", func(s *v1alpha1.BGPPeerSpec) {
			s.BFD = &v1alpha1.BFDConfig{Authentication: &v1alpha1.BFDAuthentication{Type: v1alpha1.BFDAuthKeyedSHA1, KeyID: 256, SecretRef: v1alpha1.SecretKeyReference{Name: "k", Namespace: "ns"}}}
		}, v1alpha1.ReasonInvalidConfig, "spec.bfd.authentication.keyID"},
		{"BFD authentication without a Secret", func(s *v1alpha1.BGPPeerSpec) {
			s.BFD = &v1alpha1.BFDConfig{Authentication: &v1alpha1.BFDAuthentication{Type: v1alpha1.BFDAuthKeyedSHA1}}
		}, v1alpha1.ReasonInvalidConfig, "spec.bfd.authentication.secretRef"},
		{"single-hop BFD for a multihop session", func(s *v1alpha1.BGPPeerSpec) {
			s.EBGPMultiHop, s.BFD = ptr.To[int32](2), &v1alpha1.BFDConfig{}
		}, v1alpha1.ReasonInvalidConfig, "spec.bfd.multihop"},
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

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
