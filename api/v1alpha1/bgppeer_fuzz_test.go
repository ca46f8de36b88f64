package v1alpha1

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FuzzBGPPeerSpecCheck feeds Check arbitrary specs: it never panics, a
// problem has a known reason and names the spec field at fault, and a spec
// it accepts has what every speaker relies on — a parsable peer address,
// ASNs of 1 to MaxASN, a port of 1 to 65535, a TTL of 1 to 255, known
// families, a source address of the peer's family, and BFD timers a BFD
// session runs with.
func FuzzBGPPeerSpecCheck(f *testing.F) {
	f.Add("192.0.2.1", uint32(65000), uint32(64512), int32(0), "", int32(0), "ipv4-unicast", "zone", "In", "a", int64(0), int64(0), int32(0), false)
	f.Add("fd00::1", uint32(4294967295), uint32(1), int32(70000), "192.0.2.9", int32(300), "ipv9", "", "Bogus", "", int64(5), int64(-1), int32(1), true)
	f.Add("192.0.2.1", uint32(4294967295), uint32(64512), int32(0), "", int32(0), "", "", "", "", int64(300), int64(300), int32(3), false)
	f.Add(" ::ffff:10.0.0.1 ", uint32(1), uint32(4294967294), int32(-1), "10.0.0.2", int32(255), "ipv6-unicast", "k", "Exists", "x", int64(10), int64(60000), int32(255), true)
	f.Add("::ffff:0.0.0.0", uint32(65000), uint32(64512), int32(0), "", int32(0), "", "", "", "", int64(0), int64(0), int32(0), false)
	f.Fuzz(func(t *testing.T, addr string, peerASN, localASN uint32, port int32, src string, ttl int32, family, selKey, selOp, selValue string,
		bfdTxMs, bfdRxMs int64, bfdMult int32, multihop bool) {
		s := BGPPeerSpec{PeerAddress: addr, PeerASN: peerASN, LocalASN: localASN, SourceAddress: src}
		if bfdTxMs != 0 || bfdRxMs != 0 || bfdMult != 0 || multihop {
			s.BFD = &BFDConfig{Multihop: multihop}
			if bfdTxMs != 0 {
				s.BFD.MinTx = &metav1.Duration{Duration: time.Duration(bfdTxMs) * time.Millisecond}
			}
			if bfdRxMs != 0 {
				s.BFD.MinRx = &metav1.Duration{Duration: time.Duration(bfdRxMs) * time.Millisecond}
			}
			if bfdMult != 0 {
				s.BFD.Multiplier = &bfdMult
			}
		}
		if port != 0 {
			s.Port = &port
		}
		if ttl != 0 {
			s.EBGPMultiHop = &ttl
		}
		if family != "" {
			s.Families = []AddressFamily{AddressFamily(family)}
		}
		if selKey != "" {
			s.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: selKey, Operator: metav1.LabelSelectorOperator(selOp), Values: []string{selValue}},
			}}
		}
		p := s.Check()
		if p != nil {
			if p.Reason != ReasonInvalidConfig && p.Reason != ReasonInvalidSelector {
				t.Fatalf("Check(%+v): unknown reason %q", s, p.Reason)
			}
			if !strings.Contains(p.Message, "spec.") {
				t.Fatalf("Check(%+v): message %q names no spec field", s, p.Message)
			}
			return
		}
		a, err := netip.ParseAddr(strings.TrimSpace(addr))
		if err != nil || a.Zone() != "" || a.Unmap().IsUnspecified() {
			t.Fatalf("Check accepted peerAddress %q", addr)
		}
		for _, asn := range []uint32{peerASN, localASN} {
			if asn < 1 || asn > MaxASN {
				t.Fatalf("Check accepted ASN %d (peer %d, local %d)", asn, peerASN, localASN)
			}
		}
		if p := s.PortOrDefault(); p < 1 || p > 65535 {
			t.Fatalf("Check accepted port %d", p)
		}
		if ttl := s.EBGPMultiHopOrDefault(); ttl < 1 || ttl > 255 {
			t.Fatalf("Check accepted ebgpMultiHop %d", ttl)
		}
		for _, fam := range s.FamiliesOrDefault() {
			if fam != AddressFamilyIPv4Unicast && fam != AddressFamilyIPv6Unicast {
				t.Fatalf("Check accepted family %q", fam)
			}
		}
		if src != "" {
			sa, err := netip.ParseAddr(strings.TrimSpace(src))
			if err != nil || sa.Unmap().Is4() != a.Unmap().Is4() {
				t.Fatalf("Check accepted sourceAddress %q for peer %q", src, addr)
			}
		}
		if s.NodeSelector != nil {
			if _, err := metav1.LabelSelectorAsSelector(s.NodeSelector); err != nil {
				t.Fatalf("Check accepted nodeSelector %+v: %v", s.NodeSelector, err)
			}
		}
		if b := s.BFD; b != nil {
			for _, d := range []time.Duration{b.MinTxOrDefault(), b.MinRxOrDefault()} {
				if d < 10*time.Millisecond || d > time.Minute {
					t.Fatalf("Check accepted a BFD interval of %v", d)
				}
			}
			if m := b.MultiplierOrDefault(); m < 2 || m > 255 {
				t.Fatalf("Check accepted a BFD multiplier of %d", m)
			}
			if s.EBGPMultiHopOrDefault() > 1 && !b.Multihop {
				t.Fatalf("Check accepted single-hop BFD with ebgpMultiHop %d", s.EBGPMultiHopOrDefault())
			}
		}
	})
}
