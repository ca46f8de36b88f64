package speaker

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
)

// fuzzGen turns a fuzzer's bytes into BGPPeers, IPPools and a Node for
// FuzzPeersForNode and FuzzCompile: every choice reads the next byte (zero
// once they run out, which makes optional fields unset), so short inputs
// give small, valid objects and the fuzzer reaches every kind of bad field
// by changing one byte.
type fuzzGen struct{ b []byte }

// fuzzRandomSeeds adds 16 seeds of pseudo-random bytes, fixed by seed,
// long enough to reach every choice of the generator.
func fuzzRandomSeeds(f *testing.F, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0xf022))
	for range 16 {
		b := make([]byte, 32+r.IntN(256))
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		f.Add(b)
	}
}

// intn returns a number in [0, n); n is at most 256.
func (g *fuzzGen) intn(n int) int {
	if len(g.b) == 0 {
		return 0
	}
	v := int(g.b[0])
	g.b = g.b[1:]
	return v % n
}

func (g *fuzzGen) bool() bool { return g.intn(2) == 1 }

// maybe is true one time in n, never once the bytes run out.
func (g *fuzzGen) maybe(n int) bool { return g.intn(n) == n-1 }

func pick[T any](g *fuzzGen, choices ...T) T { return choices[g.intn(len(choices))] }

// labels returns a small label set over the keys zone and rack.
func (g *fuzzGen) labels() map[string]string {
	out := map[string]string{}
	if v := pick(g, "", "a", "b"); v != "" {
		out["zone"] = v
	}
	if v := pick(g, "", "1", "2"); v != "" {
		out["rack"] = v
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// selector returns nil or a label selector over zone and rack, with
// every operator (valid or not) and malformed values now and then.
func (g *fuzzGen) selector() *metav1.LabelSelector {
	switch g.intn(6) {
	case 0, 1:
		return nil
	case 2:
		return &metav1.LabelSelector{}
	case 3:
		return &metav1.LabelSelector{MatchLabels: map[string]string{pick(g, "zone", "rack", "bad key!"): pick(g, "a", "b", "1", "", "not a value!")}}
	}
	var s metav1.LabelSelector
	for range 1 + g.intn(2) {
		r := metav1.LabelSelectorRequirement{
			Key:      pick(g, "zone", "rack", ""),
			Operator: pick[metav1.LabelSelectorOperator](g, metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist, "Gt", "Near", ""),
		}
		for range g.intn(3) {
			r.Values = append(r.Values, pick(g, "a", "b", "1", "2", "not a value!"))
		}
		s.MatchExpressions = append(s.MatchExpressions, r)
	}
	return &s
}

// peerAddress returns a spelling of peer i's own address (no two peers
// share one, whatever the spelling), or an unusable one.
func (g *fuzzGen) peerAddress(i int) string {
	v4 := netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})
	v6 := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i + 1)})
	switch g.intn(12) {
	case 0, 1, 2:
		return v4.String()
	case 3, 4:
		return v6.String()
	case 5:
		return " " + v4.String() + " "
	case 6:
		return netip.AddrFrom16(v4.As16()).String() // ::ffff:192.0.2.i
	case 7:
		return v6.String() + "%eth0"
	case 8:
		return v4.String() + "/32"
	case 9:
		return v4.String() + ":179"
	}
	return pick(g, "", "bogus", "0.0.0.0", "::", "::ffff:0.0.0.0")
}

func (g *fuzzGen) asn() uint32 {
	return pick[uint32](g, 64512, 65000, 1, v1alpha1.MaxASN, 0, v1alpha1.MaxASN+1)
}

// peer returns BGPPeer i, called peer-i.
func (g *fuzzGen) peer(i int) *v1alpha1.BGPPeer {
	p := &v1alpha1.BGPPeer{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("peer-%d", i), Labels: g.labels()},
		Spec: v1alpha1.BGPPeerSpec{
			PeerAddress:  g.peerAddress(i),
			PeerASN:      g.asn(),
			LocalASN:     g.asn(),
			NodeSelector: g.selector(),
		},
	}
	s := &p.Spec
	if g.maybe(3) {
		s.Port = ptr.To(pick[int32](g, 179, 1, 65535, 0, -1, 65536))
	}
	if g.maybe(3) {
		s.EBGPMultiHop = ptr.To(pick[int32](g, 1, 2, 255, 0, 256))
	}
	if g.maybe(4) {
		s.SourceAddress = pick(g, "192.0.2.100", "2001:db8::100", " ::ffff:192.0.2.100 ", "fe80::1%eth0", "bogus")
	}
	if g.maybe(3) {
		for range 1 + g.intn(2) {
			s.Families = append(s.Families, pick[v1alpha1.AddressFamily](g, v1alpha1.AddressFamilyIPv4Unicast, v1alpha1.AddressFamilyIPv6Unicast, "ipv9-unicast"))
		}
	}
	if g.maybe(3) {
		s.PasswordSecretRef = &v1alpha1.SecretKeyReference{Namespace: "kube-system", Name: pick(g, "bgp", "missing"), Key: pick(g, "", "password")}
	}
	if g.maybe(3) {
		s.GracefulRestart = &v1alpha1.GracefulRestart{Enabled: g.bool()}
	}
	if g.maybe(4) {
		s.HoldTime = &metav1.Duration{Duration: time.Duration(g.intn(200)) * time.Second}
	}
	return p
}

// peers returns 0 to 5 BGPPeers with distinct names and addresses, in a
// shuffled order.
func (g *fuzzGen) peers() []*v1alpha1.BGPPeer {
	out := make([]*v1alpha1.BGPPeer, g.intn(6))
	for i := range out {
		out[i] = g.peer(i)
	}
	for i := len(out) - 1; i > 0; i-- {
		j := g.intn(i + 1)
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// node returns the node the decisions run for.
func (g *fuzzGen) node() Node {
	n := Node{Name: "n1", Labels: g.labels(), IPv4: netip.MustParseAddr("10.1.0.1")}
	if g.bool() {
		n.IPv6 = netip.MustParseAddr("fd00::1")
	}
	if g.maybe(3) {
		n.LocalASN = pick[uint32](g, 64512, 65000, 4200000000)
	}
	return n
}

// deepCopyPeers copies the peers, to check that the decisions do not
// modify them.
func deepCopyPeers(in []*v1alpha1.BGPPeer) []*v1alpha1.BGPPeer {
	out := make([]*v1alpha1.BGPPeer, len(in))
	for i, p := range in {
		out[i] = p.DeepCopy()
	}
	return out
}
