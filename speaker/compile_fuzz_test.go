package speaker

import (
	"fmt"
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
	"github.com/vipcast/vipcast/poolspec"
)

// FuzzCompile decodes up to five IPPools (addresses crowding one /24 and
// one IPv6 /120 so that they overlap often, bad entries, allocation
// selectors, every kind of spec.bgp), up to five BGPPeers and a node from
// the fuzzer's bytes. Compile never panics, does not modify its inputs and
// is deterministic; its view holds exactly the pools poolspec.Admit admits,
// with their ranges and decoded spec.bgp, and its errors are exactly
// Admit's refusals, each with a known reason and naming a spec field; the
// view's PoolFor agrees with Admit's Owner on the ends of every entry, the
// addresses next to them and a few fixed ones; a pool is Disabled exactly
// when its spec.bgp.nodeSelector does not select the node; and a pool's
// peers are, sorted, the peers this node peers with (PeersForNode, a
// readable password assumed) whose labels its spec.bgp.peerSelector
// selects, or nil without a peerSelector.
func FuzzCompile(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1})
	fuzzRandomSeeds(f, 0xc0de)
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &fuzzGen{b: data}
		pools := g.pools()
		peers := g.peers()
		node := g.node()
		poolsBefore, peersBefore := deepCopyPools(pools), deepCopyPeers(peers)
		v, errs := Compile(pools, peers, node)
		if !reflect.DeepEqual(pools, poolsBefore) || !reflect.DeepEqual(peers, peersBefore) {
			t.Fatal("Compile modified its pools or peers")
		}
		if v2, errs2 := Compile(pools, peers, node); !reflect.DeepEqual(v.pools, v2.pools) || !reflect.DeepEqual(errs, errs2) {
			t.Fatalf("Compile is not deterministic: %v %v, then %v %v", v.pools, errs, v2.pools, errs2)
		}
		if !reflect.DeepEqual(v.Node, node) {
			t.Fatalf("view of node %+v, want %+v", v.Node, node)
		}

		adm := poolspec.Admit(pools)
		var refused []PoolError
		for _, r := range adm.Refused {
			refused = append(refused, PoolError(r))
		}
		if !reflect.DeepEqual(errs, refused) {
			t.Fatalf("Compile refused %v, Admit refused %v", errs, refused)
		}
		for _, e := range errs {
			switch e.Reason {
			case v1alpha1.ReasonInvalidAddresses, v1alpha1.ReasonOverlap, v1alpha1.ReasonInvalidSelector, v1alpha1.ReasonInvalidConfig:
			default:
				t.Fatalf("%v: unknown reason %q", e, e.Reason)
			}
			if !strings.Contains(e.Message, "spec.") {
				t.Fatalf("%v: names no spec field", e)
			}
		}
		if len(v.pools) != len(adm.Pools) {
			t.Fatalf("view has %d pools, Admit admitted %d", len(v.pools), len(adm.Pools))
		}
		specs := map[string]*v1alpha1.IPPool{}
		for _, p := range pools {
			specs[p.Name] = p
		}
		usable := fuzzUsablePeers(peers, node)
		for _, ap := range adm.Pools {
			checkViewPool(t, v.Pool(ap.Name), ap, specs[ap.Name], node, usable)
		}

		for _, ip := range fuzzProbes(pools) {
			got := ""
			if p := v.PoolFor(ip); p != nil {
				got = p.Name
				if p != v.Pool(p.Name) {
					t.Fatalf("PoolFor(%v) is not the view's pool %s", ip, p.Name)
				}
			}
			if want := adm.Owner(ip); got != want {
				t.Fatalf("PoolFor(%v) = %q, Admit's owner is %q", ip, got, want)
			}
		}
	})
}

// fuzzUsablePeers returns the peers node peers with, their password read.
func fuzzUsablePeers(peers []*v1alpha1.BGPPeer, node Node) []*v1alpha1.BGPPeer {
	sessions, _ := PeersForNode(peers, node, func(*v1alpha1.SecretKeyReference) (string, error) { return "", nil })
	var out []*v1alpha1.BGPPeer
	for _, s := range sessions {
		i := slices.IndexFunc(peers, func(p *v1alpha1.BGPPeer) bool { return p.Name == s.Name })
		out = append(out, peers[i])
	}
	return out
}

// checkViewPool checks the view's pool p against the admitted pool ap,
// decoded from spec.
func checkViewPool(t *testing.T, p *Pool, ap *poolspec.Pool, spec *v1alpha1.IPPool, node Node, usable []*v1alpha1.BGPPeer) {
	t.Helper()
	if p == nil {
		t.Fatalf("admitted pool %s is not in the view", ap.Name)
	}
	var large []poolspec.LargeCommunity
	for _, c := range p.LargeCommunities {
		large = append(large, poolspec.LargeCommunity(c))
	}
	if p.Name != ap.Name || !reflect.DeepEqual(p.Ranges, ap.Ranges) || !reflect.DeepEqual(p.Communities, ap.BGP.Communities) ||
		!reflect.DeepEqual(large, ap.BGP.LargeCommunities) || !reflect.DeepEqual(p.LocalPref, ap.BGP.LocalPref) ||
		p.AggregationLength != ap.BGP.AggregationLength || p.AggregationLengthV6 != ap.BGP.AggregationLengthV6 {
		t.Fatalf("view pool %+v differs from the admitted pool %+v", p, ap)
	}
	b := spec.Spec.BGP
	if b == nil {
		b = &v1alpha1.IPPoolBGP{}
	}
	if disabled := !fuzzSelectsLabels(b.NodeSelector, node.Labels); (p.Disabled != "") != disabled {
		t.Fatalf("pool %s: Disabled %q, nodeSelector %v, node labels %v", p.Name, p.Disabled, b.NodeSelector, node.Labels)
	}
	if p.HasPeerSelector != (b.PeerSelector != nil) {
		t.Fatalf("pool %s: HasPeerSelector %v, peerSelector %v", p.Name, p.HasPeerSelector, b.PeerSelector)
	}
	var want []string
	if b.PeerSelector != nil {
		want = []string{}
		for _, peer := range usable {
			if fuzzSelectsLabels(b.PeerSelector, peer.Labels) {
				want = append(want, peer.Name)
			}
		}
	}
	if !reflect.DeepEqual(p.Peers, want) {
		t.Fatalf("pool %s: peers %v, want %v (peerSelector %v)", p.Name, p.Peers, want, b.PeerSelector)
	}
}

// fuzzSelectsLabels reports whether an admitted pool's selector s selects
// l: everything when s is nil.
func fuzzSelectsLabels(s *metav1.LabelSelector, l map[string]string) bool {
	if s == nil {
		return true
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	return err == nil && sel.Matches(labels.Set(l))
}

// fuzzProbes returns the addresses to ask the view and Admit about: the
// ends of every entry that parses, the addresses next to them, and a few
// fixed ones.
func fuzzProbes(pools []*v1alpha1.IPPool) []netip.Addr {
	out := []netip.Addr{fuzzV4(0), fuzzV4(255), fuzzV4(255).Next(), fuzzV6(0), fuzzV6(255), fuzzV6(256 - 1).Next(),
		netip.MustParseAddr("::ffff:10.0.0.1"), netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("::")}
	for _, p := range pools {
		for _, e := range p.Spec.Addresses {
			rs, err := ipam.ParseAddresses([]string{e})
			if err != nil {
				continue
			}
			out = append(out, rs[0].First, rs[0].Last, rs[0].First.Prev(), rs[0].Last.Next())
		}
	}
	return slices.DeleteFunc(out, func(ip netip.Addr) bool { return !ip.IsValid() })
}

// The pools' addresses crowd 10.0.0.0-10.0.0.255 and 2001:db8::-2001:db8::ff
// so that they overlap often.
func fuzzV4(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}) }

func fuzzV6(i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i)})
}

// entry returns one spec.addresses entry, valid most of the time.
func (g *fuzzGen) entry() string {
	switch n := g.intn(16); {
	case n < 5:
		return netip.PrefixFrom(fuzzV4(g.intn(256)), 24+g.intn(9)).Masked().String()
	case n < 8:
		a := g.intn(256)
		return fuzzV4(a).String() + "-" + fuzzV4(min(255, a+g.intn(32))).String()
	case n < 11:
		return netip.PrefixFrom(fuzzV6(g.intn(256)), 120+g.intn(9)).Masked().String()
	case n < 13:
		a := g.intn(256)
		return fuzzV6(a).String() + "-" + fuzzV6(min(255, a+g.intn(32))).String()
	}
	return pick(g, "10.0.0.9-10.0.0.1", "bogus", "", "10.0.0.1", "10.0.0.1/24", "::ffff:10.0.0.1/128", "10.0.0.0/16", "fe80::1%eth0/128")
}

func (g *fuzzGen) bgp() *v1alpha1.IPPoolBGP {
	b := &v1alpha1.IPPoolBGP{PeerSelector: g.selector(), NodeSelector: g.selector()}
	if g.maybe(4) {
		b.AggregationLength = ptr.To(pick[int32](g, 32, 24, 28, 33, -1))
	}
	if g.maybe(4) {
		b.AggregationLengthV6 = ptr.To(pick[int32](g, 128, 120, 129, 64))
	}
	for range g.intn(3) {
		b.Communities = append(b.Communities, pick(g, "64512:100", "no-export", "65536:1", "x", "64512:100"))
	}
	for range g.intn(3) {
		b.LargeCommunities = append(b.LargeCommunities, pick(g, "1:2:3", "4200000000:1:2", "1:2", "4294967296:1:1"))
	}
	if g.bool() {
		b.LocalPref = ptr.To(uint32(g.intn(256)))
	}
	return b
}

// pool returns IPPool i, called pool-i, created at one of a few ages so
// that equal timestamps (the name decides) are common.
func (g *fuzzGen) pool(i int) *v1alpha1.IPPool {
	p := fx.Pool(fmt.Sprintf("pool-%d", i), g.intn(3))
	for range 1 + g.intn(3) {
		p.Spec.Addresses = append(p.Spec.Addresses, g.entry())
	}
	if g.maybe(4) {
		fx.WithAllocation(p, v1alpha1.IPPoolAllocation{NamespaceSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{pick(g, "team", "bad key!"): "a"}}}})
	}
	if g.bool() {
		p.Spec.BGP = g.bgp()
	}
	return p
}

// pools returns 0 to 5 IPPools in a shuffled order.
func (g *fuzzGen) pools() []*v1alpha1.IPPool {
	out := make([]*v1alpha1.IPPool, g.intn(6))
	for i := range out {
		out[i] = g.pool(i)
	}
	for i := len(out) - 1; i > 0; i-- {
		j := g.intn(i + 1)
		out[i], out[j] = out[j], out[i]
	}
	return out
}

func deepCopyPools(in []*v1alpha1.IPPool) []*v1alpha1.IPPool {
	out := make([]*v1alpha1.IPPool, len(in))
	for i, p := range in {
		out[i] = p.DeepCopy()
	}
	return out
}
