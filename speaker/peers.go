package speaker

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bfd"
	"github.com/vipcast/vipcast/bgp"
)

// PeerError is a BGPPeer this node cannot use; the peer is left out of
// PeersForNode's result.
type PeerError struct {
	// Peer is the BGPPeer's name.
	Peer string
	// Reason is the v1alpha1 condition reason: ReasonInvalidConfig,
	// ReasonInvalidSelector, ReasonAddressConflict or ReasonSecretNotFound.
	Reason string
	// Message names the field or Secret at fault and the fix.
	Message string
}

func (e PeerError) Error() string { return fmt.Sprintf("BGPPeer %s: %s", e.Peer, e.Message) }

// peerLabels is a selected peer as pool peerSelectors see it.
type peerLabels struct {
	name   string
	labels labels.Set
}

// selectedPeers returns the usable peers this node peers with, by name.
func selectedPeers(peers []*v1alpha1.BGPPeer, node Node) []peerLabels {
	kept, _ := nodePeers(peers, node)
	out := make([]peerLabels, 0, len(kept))
	for _, k := range kept {
		out = append(out, peerLabels{k.obj.Name, labels.Set(k.obj.Labels)})
	}
	return out
}

// nodePeer is a BGPPeer this node opens a session to, before its password
// is read.
type nodePeer struct {
	obj  *v1alpha1.BGPPeer
	peer bgp.Peer
}

// nodePeers returns, sorted by name, the peers that select node, pass
// BGPPeerSpec.Check and keep their address on it (v1alpha1.ShadowedPeers:
// of the peers with one address the oldest); errs (sorted by name) are the
// peers that fail Check and those left out for their address.
func nodePeers(peers []*v1alpha1.BGPPeer, node Node) (kept []nodePeer, errs []PeerError) {
	shadowed := v1alpha1.ShadowedPeers(peers, node.Labels)
	for _, p := range sortedPeers(peers) {
		bp, selected, perr := translatePeer(p, node)
		switch {
		case perr != nil:
			errs = append(errs, *perr)
			continue
		case !selected:
			continue
		}
		if older, ok := shadowed[p.Name]; ok {
			errs = append(errs, PeerError{p.Name, v1alpha1.ReasonAddressConflict, v1alpha1.AddressConflictMessage(bp.Address, older, []string{node.Name})})
			continue
		}
		kept = append(kept, nodePeer{p, bp})
	}
	return kept, errs
}

func sortedPeers(peers []*v1alpha1.BGPPeer) []*v1alpha1.BGPPeer {
	out := slices.Clone(peers)
	slices.SortFunc(out, func(a, b *v1alpha1.BGPPeer) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// PeersForNode returns the BGP sessions this node opens, sorted by name:
// one per BGPPeer whose spec.nodeSelector selects the node (every node when
// unset). Every field is translated with its default (port 179, hold time
// 90s, keepalive a third of it, TTL 1, restart time 120s, both families);
// the local ASN is the node's AnnotationLocalASN override when set, else
// spec.localASN. eBGP multihop is dropped when the session is iBGP (which
// the override can make it).
//
// A node has one session per peer address: of the selected peers with the
// same address (IPv4-mapped IPv6 addresses count as IPv4, the port does
// not count) only the oldest (v1alpha1.OlderFirst) is kept, and the others
// are reported with ReasonAddressConflict naming it, so the remaining
// sessions can be configured (v1alpha1.ShadowedPeers). This is decided
// among the peers that pass BGPPeerSpec.Check, before passwords are read:
// a peer whose Secret is missing still holds its address.
//
// password resolves spec.passwordSecretRef. A peer whose password lookup
// fails (or whose settings or nodeSelector cannot be used) is left out and
// reported in a PeerError; the caller decides what to do and reports it on
// the BGPPeer.
func PeersForNode(peers []*v1alpha1.BGPPeer, node Node, password func(ref *v1alpha1.SecretKeyReference) (string, error)) ([]bgp.Peer, []PeerError) {
	kept, errs := nodePeers(peers, node)
	var out []bgp.Peer
	for _, k := range kept {
		p, bp := k.obj, k.peer
		if ref := p.Spec.PasswordSecretRef; ref != nil {
			where := fmt.Sprintf("Secret %s/%s key %q", ref.Namespace, ref.Name, ref.KeyOrDefault())
			if password == nil {
				errs = append(errs, PeerError{p.Name, v1alpha1.ReasonSecretNotFound, "spec.passwordSecretRef: no way to read " + where})
				continue
			}
			pw, err := password(ref)
			if err != nil {
				errs = append(errs, PeerError{p.Name, v1alpha1.ReasonSecretNotFound,
					fmt.Sprintf("spec.passwordSecretRef: cannot read the password from %s: %v; the session is not opened until the Secret exists and the speaker may read it", where, err)})
				continue
			}
			bp.Password = pw
		}
		if a := p.Spec.BFD; a != nil && a.Authentication != nil && bp.BFD != nil {
			auth, perr := bfdAuth(p.Name, a.Authentication, password)
			if perr != nil {
				errs = append(errs, *perr)
				continue
			}
			b := *bp.BFD
			b.Auth = auth
			bp.BFD = &b
		}
		out = append(out, bp)
	}
	slices.SortFunc(errs, func(a, b PeerError) int { return strings.Compare(a.Peer, b.Peer) })
	return out, errs
}

// bfdAuth resolves spec.bfd.authentication of peer name: its key from the
// Secret, 1 to 20 bytes. Messages name the Secret, never the key.
func bfdAuth(name string, a *v1alpha1.BFDAuthentication, secret func(ref *v1alpha1.SecretKeyReference) (string, error)) (*bfd.Auth, *PeerError) {
	ref := &a.SecretRef
	where := fmt.Sprintf("Secret %s/%s key %q", ref.Namespace, ref.Name, ref.KeyOrDefault())
	if secret == nil {
		return nil, &PeerError{name, v1alpha1.ReasonSecretNotFound, "spec.bfd.authentication.secretRef: no way to read " + where}
	}
	key, err := secret(ref)
	if err != nil {
		return nil, &PeerError{name, v1alpha1.ReasonSecretNotFound,
			fmt.Sprintf("spec.bfd.authentication.secretRef: cannot read the BFD key from %s: %v; the session is not opened until the Secret exists and the speaker may read it", where, err)}
	}
	typ := bfd.AuthKeyedSHA1
	if a.Type == v1alpha1.BFDAuthMeticulousKeyedSHA1 {
		typ = bfd.AuthMeticulousKeyedSHA1
	}
	auth := &bfd.Auth{Type: typ, KeyID: uint8(a.KeyID), Key: bfd.Key(key)} //nolint:gosec // Check refused key IDs outside 0-255
	if err := auth.Validate(); err != nil {
		return nil, &PeerError{name, v1alpha1.ReasonInvalidConfig,
			fmt.Sprintf("spec.bfd.authentication.secretRef: the BFD key in %s is %d bytes; Keyed SHA1 keys are 1 to 20 bytes: store a shorter key, the same as the router's", where, len(key))}
	}
	return auth, nil
}

// translatePeer converts a BGPPeer without its password. selected is false
// when the peer's nodeSelector does not select node.
func translatePeer(p *v1alpha1.BGPPeer, node Node) (bgp.Peer, bool, *PeerError) {
	bad := func(reason, format string, args ...any) (bgp.Peer, bool, *PeerError) {
		return bgp.Peer{}, false, &PeerError{p.Name, reason, fmt.Sprintf(format, args...)}
	}
	s := &p.Spec
	if prob := s.Check(); prob != nil {
		return bad(prob.Reason, "%s", prob.Message)
	}
	if !s.SelectsNode(node.Labels) {
		return bgp.Peer{}, false, nil
	}
	// Check validated the addresses, the port, the TTL and the families.
	addr, _ := s.Address()
	out := bgp.Peer{
		Name:          p.Name,
		Address:       addr,
		ASN:           s.PeerASN,
		LocalASN:      s.LocalASN,
		HoldTime:      s.HoldTimeOrDefault(),
		KeepaliveTime: s.KeepaliveTimeOrDefault(),
		Port:          uint16(s.PortOrDefault()), //nolint:gosec // Check refused ports outside 1-65535
	}
	if node.LocalASN != 0 {
		out.LocalASN = node.LocalASN
	}
	if s.SourceAddress != "" {
		out.SourceAddress = netip.MustParseAddr(strings.TrimSpace(s.SourceAddress)).Unmap()
	}
	if !out.IBGP() {
		out.EBGPMultiHop = uint8(s.EBGPMultiHopOrDefault()) //nolint:gosec // Check refused TTLs outside 1-255
	}
	if gr := s.GracefulRestart; gr != nil && gr.Enabled {
		out.GracefulRestart = true
		out.RestartTime = gr.RestartTimeOrDefault()
	}
	for _, f := range s.FamiliesOrDefault() {
		if f == v1alpha1.AddressFamilyIPv4Unicast {
			out.Families = append(out.Families, bgp.IPv4Unicast)
		} else {
			out.Families = append(out.Families, bgp.IPv6Unicast)
		}
	}
	slices.Sort(out.Families)
	out.Families = slices.Compact(out.Families)
	if b := s.BFD; b != nil {
		out.BFD = &bgp.BFD{MinTx: b.MinTxOrDefault(), MinRx: b.MinRxOrDefault(),
			Multiplier: uint8(b.MultiplierOrDefault()), //nolint:gosec // Check refused multipliers outside 2-255
			Multihop:   b.Multihop}
		if b.Multihop {
			out.BFD.MinTTL = uint8(b.MinimumTTLOrDefault()) //nolint:gosec // Check refused TTLs outside 1-255
		}
	}
	return out, true, nil
}
