package speaker

import (
	"fmt"
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vipcast/vipcast/api/v1alpha1"
)

// TestRelayPeers: the connection sync relay exchanges connections only
// among the nodes that announce (a usable BGPPeer selects them and they
// are not excluded: what each node publishes in its NodeTunnel), and a
// node that does not announce has no peers.
func TestRelayPeers(t *testing.T) {
	node := func(name, addr string, lbls map[string]string) Node {
		n := Node{Name: name, Labels: lbls}
		if addr != "" {
			n.IPv4 = netip.MustParseAddr(addr)
		}
		_, n.Excluded = lbls[LabelExcludeFromExternalLB]
		return n
	}
	edge := map[string]string{"role": "edge"}
	excluded := map[string]string{"role": "edge", LabelExcludeFromExternalLB: ""}
	nodes := []Node{
		node("n1", "10.0.0.1", edge),
		node("n2", "10.0.0.2", edge),
		node("n3", "10.0.0.3", nil),
		node("n4", "10.0.0.4", excluded),
		node("n5", "", edge),         // no IPv4 address
		node("n6", "10.0.0.2", edge), // n2's address again
		node("n7", "10.0.0.7", map[string]string{"role": "spine"}),
	}
	all := mkPeer("all", "10.0.0.254", nil)
	edges := mkPeer("edges", "10.0.0.253", nil)
	edges.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"role": "edge"}}
	spines := mkPeer("spines", "10.0.0.252", nil)
	spines.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"role": "spine"}}
	badSel := mkPeer("bad-selector", "10.0.0.251", nil)
	badSel.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "role", Operator: "Near"}}}
	badSpec := mkPeer("bad-spec", "not-an-address", nil) // fails Check on every node
	for _, tc := range []struct {
		name  string
		self  string
		peers []*v1alpha1.BGPPeer
		want  string
	}{
		{"a peer of every node", "n1", []*v1alpha1.BGPPeer{all}, "[10.0.0.2 10.0.0.3 10.0.0.7]"},
		{"edge nodes only", "n1", []*v1alpha1.BGPPeer{edges}, "[10.0.0.2]"},
		{"edges and spines", "n2", []*v1alpha1.BGPPeer{edges, spines}, "[10.0.0.1 10.0.0.7]"},
		{"this node does not announce", "n3", []*v1alpha1.BGPPeer{edges}, "[]"},
		{"this node is excluded", "n4", []*v1alpha1.BGPPeer{all}, "[]"},
		{"no peers at all", "n1", nil, "[]"},
		{"unusable peers select no node", "n1", []*v1alpha1.BGPPeer{badSel, badSpec}, "[]"},
		{"unusable peers beside a usable one", "n7", []*v1alpha1.BGPPeer{badSel, badSpec, spines, edges}, "[10.0.0.1 10.0.0.2]"},
	} {
		published := make([]tunnelNode, 0, len(nodes))
		for _, n := range nodes {
			spec := nodeTunnelSpec(n, tc.peers)
			published = append(published, tunnelNode{Name: n.Name, IPv4: n.IPv4, Announces: spec.Announces})
		}
		if got := fmt.Sprint(relayPeers(tc.self, published)); got != tc.want {
			t.Errorf("%s: relayPeers(%s) = %s, want %s", tc.name, tc.self, got, tc.want)
		}
	}
}

// TestAnnouncesAgreesWithPeersForNode: a node announces exactly when
// PeersForNode gives it a session, for selectors of every kind.
func TestAnnouncesAgreesWithPeersForNode(t *testing.T) {
	sel := func(name, addr string, s *metav1.LabelSelector) *v1alpha1.BGPPeer {
		p := mkPeer(name, addr, nil)
		p.Spec.NodeSelector = s
		return p
	}
	peers := []*v1alpha1.BGPPeer{
		sel("zone-a", "10.0.0.254", &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "a"}}),
		sel("not-b", "10.0.0.253", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "zone", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"b"}}, {Key: "rack", Operator: metav1.LabelSelectorOpExists}}}),
		sel("bad", "10.0.0.252", &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "-"}}),
	}
	var nodes []Node
	for i, lbls := range []map[string]string{
		nil, {"zone": "a"}, {"zone": "b"}, {"zone": "b", "rack": "1"}, {"zone": "c", "rack": "2"},
		{"zone": "a", LabelExcludeFromExternalLB: "true"}, {"zone": "-"},
	} {
		n := Node{Name: fmt.Sprintf("n%d", i), Labels: lbls, IPv4: netip.AddrFrom4([4]byte{10, 0, 1, byte(i)})}
		_, n.Excluded = lbls[LabelExcludeFromExternalLB]
		nodes = append(nodes, n)
	}
	var ann []string
	for _, n := range nodes {
		got := announces(n, peers)
		sessions, _ := PeersForNode(peers, n, nil)
		if want := len(sessions) > 0 && !n.Excluded; got != want {
			t.Errorf("node %s (labels %v): announces %v, but PeersForNode gives %d sessions (excluded %v)", n.Name, n.Labels, got, len(sessions), n.Excluded)
		}
		if got {
			ann = append(ann, n.Name)
		}
	}
	if fmt.Sprint(ann) != "[n1 n4]" {
		t.Errorf("announcing nodes = %v, want n1 (zone a) and n4 (zone c, a rack)", ann)
	}
}
