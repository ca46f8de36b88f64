package v1alpha1

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// NodeSelectorOrAll is spec.nodeSelector as a labels.Selector: every node
// when unset, no node when it does not parse (Check reports it). Parse it
// once to match many nodes.
func (s *BGPPeerSpec) NodeSelectorOrAll() labels.Selector {
	if s.NodeSelector == nil {
		return labels.Everything()
	}
	sel, err := metav1.LabelSelectorAsSelector(s.NodeSelector)
	if err != nil {
		return labels.Nothing()
	}
	return sel
}

// SelectsNode reports whether the spec's nodeSelector selects a node with
// these labels (NodeSelectorOrAll).
func (s *BGPPeerSpec) SelectsNode(node labels.Set) bool {
	return s.NodeSelectorOrAll().Matches(node)
}

// Address is spec.peerAddress as a session uses it: an IPv4-mapped IPv6
// address is its IPv4 address. false when it does not parse (Check
// reports it).
func (s *BGPPeerSpec) Address() (netip.Addr, bool) {
	a, err := netip.ParseAddr(strings.TrimSpace(s.PeerAddress))
	return a.Unmap(), err == nil && a.Zone() == ""
}

// ShadowedPeers applies the one-session-per-address rule on one node, the
// one with these labels: a node opens one BGP session per router address,
// so of the peers that select the node, pass Check and have the same
// Address (the port does not count), only the oldest (OlderFirst) is
// used there. It returns, for each peer left out, the name of the peer
// that keeps the address. Password Secrets are not looked at: a peer whose
// Secret is missing still keeps its address, so the CCM, which does not
// read Secrets, and the speakers decide alike. Each speaker applies it to
// its node and vipcast-ccm to every node for the Ready condition.
func ShadowedPeers(peers []*BGPPeer, node labels.Set) map[string]string {
	byAge := slices.Clone(peers)
	slices.SortFunc(byAge, func(a, b *BGPPeer) int { return CompareAge(a, b) })
	owner := map[netip.Addr]string{}
	out := map[string]string{}
	for _, p := range byAge {
		if p.Spec.Check() != nil || !p.Spec.SelectsNode(node) {
			continue
		}
		addr, _ := p.Spec.Address() // Check parsed it
		if older, taken := owner[addr]; taken {
			out[p.Name] = older
			continue
		}
		owner[addr] = p.Name
	}
	return out
}

// AddressConflictMessage is the message of a BGPPeer with address addr
// left out (ReasonAddressConflict) on the named nodes (at least one; the
// first three are written) because the older BGPPeer older has that
// address there. The CCM writes it in the Ready condition and each
// speaker in its Warning Event, so both say the same.
func AddressConflictMessage(addr netip.Addr, older string, nodes []string) string {
	where := "node " + strings.Join(nodes, ", ")
	switch {
	case len(nodes) > 3:
		where = fmt.Sprintf("nodes %s and %d more", strings.Join(nodes[:3], ", "), len(nodes)-3)
	case len(nodes) > 1:
		where = "nodes " + strings.Join(nodes, ", ")
	}
	return fmt.Sprintf("spec.peerAddress %s is also the address of the older BGPPeer %s and both select %s; a node opens one session per address, so there only BGPPeer %s's session is opened and this one is not; delete one of them, or give them nodeSelectors that select different nodes", addr, older, where, older)
}
