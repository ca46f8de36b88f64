package v1alpha1

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxASN is the largest usable 4-byte ASN (4294967295 is reserved, RFC 7300).
const MaxASN = 4294967294

// PeerProblem is why a BGPPeer cannot be used: the Ready=False reason
// (ReasonInvalidConfig or ReasonInvalidSelector) and a message that names
// the field and the fix.
//
// +kubebuilder:object:generate=false
type PeerProblem struct {
	Reason  string
	Message string
}

func (p *PeerProblem) Error() string { return p.Message }

// Check returns the first problem of the spec that holds on every node,
// or nil when the spec is usable. The CRD's schema rejects most of these
// at admission; Check is what vipcast-ccm publishes in the Ready condition
// and what each speaker applies before it opens a session. Problems that
// depend on the node (a per-node local ASN, a password Secret the node
// cannot read) are the speaker's to report.
func (s *BGPPeerSpec) Check() *PeerProblem {
	bad := func(reason, format string, args ...any) *PeerProblem {
		return &PeerProblem{Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	if s.NodeSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(s.NodeSelector); err != nil {
			return bad(ReasonInvalidSelector, "spec.nodeSelector: %v; fix the selector (operators are In, NotIn, Exists, DoesNotExist)", err)
		}
	}
	// Address unmaps: ::ffff:0.0.0.0 is the unspecified IPv4 address too.
	addr, ok := s.Address()
	if !ok || addr.IsUnspecified() {
		return bad(ReasonInvalidConfig, "spec.peerAddress %q is not a usable IP address; write an IPv4 or IPv6 address such as 192.0.2.1, without prefix length, port or zone", s.PeerAddress)
	}
	if s.PeerASN == 0 || s.LocalASN == 0 || s.PeerASN > MaxASN || s.LocalASN > MaxASN {
		return bad(ReasonInvalidConfig, "spec.peerASN and spec.localASN must be 1 to %d", uint64(MaxASN))
	}
	if port := s.PortOrDefault(); port < 1 || port > 65535 {
		return bad(ReasonInvalidConfig, "spec.port %d is out of range: use 1 to 65535, or omit it for 179", port)
	}
	if s.SourceAddress != "" {
		src, err := netip.ParseAddr(strings.TrimSpace(s.SourceAddress))
		if err != nil || src.Zone() != "" {
			return bad(ReasonInvalidConfig, "spec.sourceAddress %q is not an IP address; write an address of this node such as 192.0.2.10, or omit it", s.SourceAddress)
		}
		if src.Unmap().Is4() != addr.Is4() {
			return bad(ReasonInvalidConfig, "spec.sourceAddress %s and spec.peerAddress %s are of different IP families; use a source address of the peer's family", src.Unmap(), addr)
		}
	}
	if ttl := s.EBGPMultiHopOrDefault(); ttl < 1 || ttl > 255 {
		return bad(ReasonInvalidConfig, "spec.ebgpMultiHop %d is out of range: use 1 to 255", ttl)
	}
	for _, f := range s.FamiliesOrDefault() {
		if f != AddressFamilyIPv4Unicast && f != AddressFamilyIPv6Unicast {
			return bad(ReasonInvalidConfig, "spec.families: unknown family %q; use ipv4-unicast and/or ipv6-unicast", f)
		}
	}
	if b := s.BFD; b != nil {
		if prob := b.check(s.EBGPMultiHopOrDefault()); prob != nil {
			return prob
		}
	}
	return nil
}

// check returns the first problem of the BFD settings of a peer whose
// eBGP TTL is ebgpMultiHop, or nil.
func (b *BFDConfig) check(ebgpMultiHop int32) *PeerProblem {
	bad := func(reason, format string, args ...any) *PeerProblem {
		return &PeerProblem{Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	for _, iv := range []struct {
		field string
		d     time.Duration
	}{{"minTx", b.MinTxOrDefault()}, {"minRx", b.MinRxOrDefault()}} {
		if iv.d < 10*time.Millisecond || iv.d > time.Minute {
			return bad(ReasonInvalidConfig, "spec.bfd.%s %v is out of range: use 10ms to 60s, such as 300ms", iv.field, iv.d)
		}
	}
	if m := b.MultiplierOrDefault(); m < 2 || m > 255 {
		return bad(ReasonInvalidConfig, "spec.bfd.multiplier %d is out of range: use 2 to 255, such as 3", m)
	}
	if ebgpMultiHop > 1 && !b.Multihop {
		return bad(ReasonInvalidConfig, "spec.bfd.multihop must be true when spec.ebgpMultiHop is above 1: single-hop BFD (RFC 5881) uses TTL 255 and does not cross a router; set bfd.multihop: true, or remove bfd")
	}
	if b.MinimumTTL != nil {
		if !b.Multihop {
			return bad(ReasonInvalidConfig, "spec.bfd.minimumTTL applies to multihop BFD only: single-hop BFD (RFC 5881) accepts TTL 255 alone; set bfd.multihop: true, or remove bfd.minimumTTL")
		}
		if ttl := *b.MinimumTTL; ttl < 1 || ttl > 255 {
			return bad(ReasonInvalidConfig, "spec.bfd.minimumTTL %d is out of range: use 1 to 255 (254 for a router one hop away that sends TTL 255, 64 for BIRD)", ttl)
		}
	}
	if a := b.Authentication; a != nil {
		if a.Type != BFDAuthKeyedSHA1 && a.Type != BFDAuthMeticulousKeyedSHA1 {
			return bad(ReasonInvalidConfig, "spec.bfd.authentication.type %q is not supported: use KeyedSHA1 or MeticulousKeyedSHA1", a.Type)
		}
		if a.KeyID < 0 || a.KeyID > 255 {
			return bad(ReasonInvalidConfig, "spec.bfd.authentication.keyID %d is out of range: use 0 to 255, the router's key ID", a.KeyID)
		}
		if a.SecretRef.Name == "" || a.SecretRef.Namespace == "" {
			return bad(ReasonInvalidConfig, "spec.bfd.authentication.secretRef needs a name and a namespace: name the Secret holding the shared key")
		}
	}
	return nil
}
