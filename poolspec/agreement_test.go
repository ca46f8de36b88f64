package poolspec_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	fx "github.com/vipcast/vipcast/api/v1alpha1/v1alpha1test"
	"github.com/vipcast/vipcast/ccm"
	"github.com/vipcast/vipcast/ipam"
	"github.com/vipcast/vipcast/poolspec"
	"github.com/vipcast/vipcast/speaker"
)

// The agreement tests feed random IPPool sets to the CCM's pool loading
// (ccm.LoadPools into an ipam.Allocator, as the CCM does) and to the
// speaker's (speaker.Compile, as every speaker does) and check that both
// binaries see the same owner for every address, the same refusals, and
// that the admission follows the rule (see checkAgreement).

// source yields the random choices of a pool set: math/rand/v2 for the
// property test, the fuzzer's bytes for FuzzAdmit.
type source interface {
	// intn returns a number in [0, n); n > 0.
	intn(n int) int
}

type randSource struct{ r *rand.Rand }

func (s randSource) intn(n int) int { return s.r.IntN(n) }

// byteSource reads choices from bytes, then zeros once they run out.
type byteSource struct{ b []byte }

func (s *byteSource) intn(n int) int {
	v := 0
	for m := n - 1; m > 0; m >>= 8 {
		v <<= 8
		if len(s.b) > 0 {
			v |= int(s.b[0])
			s.b = s.b[1:]
		}
	}
	return v % n
}

// gen generates pool sets whose addresses crowd two small universes,
// 10.0.0.0-10.0.3.255 and 2001:db8::-2001:db8::3ff, so that overlaps are
// the rule, with every kind of refusable spec.
type gen struct{ source }

// universe is the size of each family's address universe.
const universe = 1024

func v4(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
}

func v6(i int) netip.Addr {
	return netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)})
}

func (g gen) pick(choices ...string) string { return choices[g.intn(len(choices))] }

// entry returns one spec.addresses entry, valid most of the time.
func (g gen) entry() string {
	switch n := g.intn(40); {
	case n < 12:
		return netip.PrefixFrom(v4(g.intn(universe)), g.prefixLen(32)).Masked().String()
	case n < 18:
		return g.rangeOf(v4)
	case n < 30:
		return netip.PrefixFrom(v6(g.intn(universe)), g.prefixLen(128)).Masked().String()
	case n < 36:
		return g.rangeOf(v6)
	case n == 36: // host bits set
		return netip.PrefixFrom(v4(1+2*g.intn(universe/2)), 24+g.intn(8)).String()
	case n == 37: // an IPv6 range spanning the IPv4-mapped addresses
		return "::fffe:ffff:ffff-::1:0:0:1"
	case n == 38: // wide blocks that overlap a whole universe
		return g.pick("10.0.0.0/16", "2001:db8::/64", "0.0.0.0/0", "::/0")
	}
	return g.pick("bogus", "", "10.0.0.1", "::ffff:10.0.0.1/128", "10.0.0.0/33",
		"10.0.0.1-2001:db8::1", "10.0.0.5-10.0.0.1-10.0.0.9", " 10.0.1.0/25 ", "fe80::1%eth0/128")
}

// rangeOf returns a first-last range of the universe, mostly short,
// backwards (invalid) now and then.
func (g gen) rangeOf(addr func(int) netip.Addr) string {
	a, b := g.intn(universe), 0
	if g.intn(8) == 0 {
		b = g.intn(universe)
	} else {
		b = min(a+g.intn(48), universe-1)
	}
	if (a > b) != (g.intn(16) == 0) {
		a, b = b, a
	}
	return addr(a).String() + "-" + addr(b).String()
}

// prefixLen returns a CIDR length for a block of the universe: mostly
// small blocks, now and then one as wide as the universe.
func (g gen) prefixLen(bits int) int {
	if g.intn(8) == 0 {
		return bits - 10 + g.intn(4)
	}
	return bits - g.intn(7)
}

// selector returns a label selector: nil, selecting zone a (the test
// node's) or b, everything, or malformed.
func (g gen) selector() *metav1.LabelSelector {
	switch g.intn(12) {
	case 0, 1, 2, 3:
		return nil
	case 4, 5:
		return &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "a"}}
	case 6, 7:
		return &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "b"}}
	case 8:
		return &metav1.LabelSelector{}
	case 9:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpExists}}}
	case 10:
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: "Near", Values: []string{"a"}}}}
	}
	return &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "not a value!"}}
}

func (g gen) selectors() []metav1.LabelSelector {
	var out []metav1.LabelSelector
	for range g.intn(3) {
		if s := g.selector(); s != nil {
			out = append(out, *s)
		}
	}
	return out
}

func (g gen) bgp() *v1alpha1.IPPoolBGP {
	b := &v1alpha1.IPPoolBGP{PeerSelector: g.selector(), NodeSelector: g.selector()}
	switch g.intn(6) {
	case 0:
		b.AggregationLength = ptr.To(int32(g.intn(38) - 2)) // -2 to 35; 33 and beyond are out of range
	case 1:
		b.AggregationLength = ptr.To[int32](32)
	}
	switch g.intn(6) {
	case 0:
		b.AggregationLengthV6 = ptr.To(int32(108 + g.intn(24))) // 108 to 131
	case 1:
		b.AggregationLengthV6 = ptr.To[int32](128)
	}
	for range g.intn(3) {
		b.Communities = append(b.Communities, g.pick("64512:100", "no-export", "0:0", "blackhole", "65535:65535", "graceful-shutdown", "64512:200", "65536:1", "x"))
	}
	for range g.intn(3) {
		b.LargeCommunities = append(b.LargeCommunities, g.pick("1:2:3", "4200000000:1:2", "4294967295:0:4294967295", "1:2:3", "0:0:0", "1:2", "4294967296:1:1"))
	}
	if g.intn(3) == 0 {
		b.LocalPref = ptr.To(uint32(g.intn(500)))
	}
	return b
}

func (g gen) pool(i int) *v1alpha1.IPPool {
	p := &v1alpha1.IPPool{ObjectMeta: metav1.ObjectMeta{
		// Few distinct ages: equal timestamps, where the name decides, are common.
		Name: fmt.Sprintf("p%d", i), CreationTimestamp: metav1.NewTime(fx.Epoch().Add(time.Duration(g.intn(4)) * time.Second)),
	}}
	n := 1 + g.intn(4)
	if g.intn(16) == 0 {
		n = 0
	}
	for range n {
		p.Spec.Addresses = append(p.Spec.Addresses, g.entry())
	}
	if g.intn(3) == 0 {
		p.Spec.AutoAssign = ptr.To(g.intn(2) == 0)
	}
	p.Spec.AvoidBuggyIPs = g.intn(3) == 0
	if g.intn(3) == 0 {
		a := &v1alpha1.IPPoolAllocation{NamespaceSelectors: g.selectors(), ServiceSelectors: g.selectors()}
		if g.intn(2) == 0 {
			a.Priority = ptr.To(int32(g.intn(3)))
		}
		if g.intn(2) == 0 {
			a.Namespaces = []string{"shop"}
		}
		p.Spec.Allocation = a
	}
	if g.intn(2) == 0 {
		p.Spec.BGP = g.bgp()
	}
	return p
}

// poolSet returns 1 to 8 pools, named p0, p1, ... in a shuffled order.
func (g gen) poolSet() []*v1alpha1.IPPool {
	pools := make([]*v1alpha1.IPPool, 1+g.intn(8))
	for i := range pools {
		pools[i] = g.pool(i)
	}
	g.shuffle(pools)
	return pools
}

func (g gen) shuffle(pools []*v1alpha1.IPPool) {
	for i := len(pools) - 1; i > 0; i-- {
		j := g.intn(i + 1)
		pools[i], pools[j] = pools[j], pools[i]
	}
}

// probes returns the addresses to ask both binaries about: the ends of
// every entry that parses, the addresses just outside them, one address
// inside each, and random addresses of both universes.
func (g gen) probes(pools []*v1alpha1.IPPool) []netip.Addr {
	out := []netip.Addr{v4(0), v4(universe - 1), v4(universe), v4(0).Prev(), v6(0), v6(universe),
		netip.MustParseAddr("::ffff:10.0.0.1"), netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("::")}
	for _, p := range pools {
		for _, e := range p.Spec.Addresses {
			rs, err := ipam.ParseAddresses([]string{e})
			if err != nil {
				continue
			}
			r := rs[0]
			out = append(out, r.First, r.Last, r.First.Prev(), r.Last.Next(), inside(r, g.intn(1<<20)))
		}
	}
	for range 8 {
		out = append(out, v4(g.intn(universe)), v6(g.intn(universe)))
	}
	return slices.DeleteFunc(out, func(ip netip.Addr) bool { return !ip.IsValid() })
}

// inside returns the address off after r.First, or r.Last if r is smaller.
func inside(r ipam.Range, off int) netip.Addr {
	b := r.First.As16()
	lo := binary.BigEndian.Uint64(b[8:])
	sum := lo + uint64(off)
	binary.BigEndian.PutUint64(b[8:], sum)
	if sum < lo { // carry
		binary.BigEndian.PutUint64(b[:8], binary.BigEndian.Uint64(b[:8])+1)
	}
	ip := netip.AddrFrom16(b)
	if r.First.Is4() {
		ip = ip.Unmap()
	}
	if !r.Contains(ip) {
		return r.Last
	}
	return ip
}

// agreementNode and agreementPeers are the speaker's node and BGPPeers.
func agreementNode() speaker.Node {
	return speaker.Node{Name: "n1", Labels: labels.Set{"zone": "a"}, IPv4: netip.MustParseAddr("10.255.0.1")}
}

func agreementPeers() []*v1alpha1.BGPPeer {
	mk := func(name, addr, zone string) *v1alpha1.BGPPeer {
		return &v1alpha1.BGPPeer{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"zone": zone}},
			Spec:       v1alpha1.BGPPeerSpec{PeerAddress: addr, PeerASN: 65000, LocalASN: 64512},
		}
	}
	return []*v1alpha1.BGPPeer{mk("tor-a", "10.255.0.254", "a"), mk("tor-b", "10.255.0.253", "b")}
}

// outcome summarises what checkAgreement saw, for coverage.
type outcome struct {
	probes, admitted int
	// reasons counts refusals by condition reason.
	reasons map[string]int
	// shadowFree counts pools refused before the overlap check (addresses
	// parse, but a selector or spec.bgp does not) whose addresses a newer
	// admitted pool owns: the case the two binaries used to disagree on.
	shadowFree int
}

var overlapsPool = regexp.MustCompile(`overlaps pool "([^"]*)"`)

// checkAgreement admits pools through the CCM and the speaker and checks:
// the CCM's allocator and the speaker's view see the same owner for every
// probe, and the same refusals with the same reasons and messages; every
// pool is admitted or refused; a refusal names a spec field; admitted
// pools do not overlap; a pool refused for an overlap overlaps an older
// admitted pool, which its message names; the admission does not depend
// on the order of the list and is deterministic.
func checkAgreement(t testing.TB, g gen, pools []*v1alpha1.IPPool, probes []netip.Addr) outcome {
	t.Helper()
	adm := poolspec.Admit(pools)
	out := outcome{probes: len(probes), admitted: len(adm.Pools), reasons: map[string]int{}}

	// The CCM, as it loads pools.
	alloc := ipam.New()
	_, ccmRefused, err := ccm.LoadPools(alloc, pools)
	if err != nil {
		t.Fatalf("the CCM's allocator refused admitted pools: %v", err)
	}
	// The speaker, as it compiles its view.
	view, spkErrs := speaker.Compile(pools, agreementPeers(), agreementNode())

	// Same refusals.
	spkRefused := map[string]poolspec.Refusal{}
	for _, e := range spkErrs {
		spkRefused[e.Pool] = poolspec.Refusal(e)
	}
	if len(spkRefused) != len(ccmRefused) {
		t.Fatalf("refusals differ:\n  CCM     %v\n  speaker %v", ccmRefused, spkRefused)
	}
	for name, r := range ccmRefused {
		if spkRefused[name] != r {
			t.Fatalf("pool %s: the CCM refuses it with %+v, the speaker with %+v", name, r, spkRefused[name])
		}
	}

	// Every pool admitted or refused, once; refusals name a field.
	byName := map[string]*v1alpha1.IPPool{}
	for _, p := range pools {
		byName[p.Name] = p
		_, refused := ccmRefused[p.Name]
		_, installed := alloc.Stats(p.Name)
		admitted := view.Pool(p.Name) != nil
		if refused == installed || installed != admitted {
			t.Fatalf("pool %s: refused %v, in the CCM's allocator %v, in the speaker's view %v", p.Name, refused, installed, admitted)
		}
	}
	for _, r := range adm.Refused {
		out.reasons[r.Reason]++
		if !strings.Contains(r.Message, "spec.") {
			t.Fatalf("pool %s: refusal message names no spec field: %q", r.Pool, r.Message)
		}
		if !slices.Contains([]string{v1alpha1.ReasonInvalidAddresses, v1alpha1.ReasonInvalidSelector, v1alpha1.ReasonInvalidConfig, v1alpha1.ReasonOverlap}, r.Reason) {
			t.Fatalf("pool %s: unknown reason %q", r.Pool, r.Reason)
		}
		if m := overlapsPool.FindStringSubmatch(r.Message); m != nil {
			older, ok := byName[m[1]]
			if !ok || view.Pool(older.Name) == nil || !v1alpha1.OlderFirst(older, byName[r.Pool]) {
				t.Fatalf("pool %s refused for overlapping pool %q, which is not an older admitted pool", r.Pool, m[1])
			}
		}
	}

	// Admitted pools do not overlap.
	var admitted []ipam.Range
	for _, p := range adm.Pools {
		admitted = append(admitted, p.Ranges...)
	}
	slices.SortFunc(admitted, func(a, b ipam.Range) int { return a.First.Compare(b.First) })
	for i := 1; i < len(admitted); i++ {
		if admitted[i-1].Overlaps(admitted[i]) {
			t.Fatalf("admitted ranges %s and %s overlap", admitted[i-1], admitted[i])
		}
	}

	// Same owner for every probe, and the one whose ranges contain it.
	for _, ip := range probes {
		ccmOwner, _ := alloc.PoolOf(ip)
		spkOwner := ""
		if p := view.PoolFor(ip); p != nil {
			spkOwner = p.Name
		}
		if ccmOwner != spkOwner || adm.Owner(ip) != ccmOwner {
			t.Fatalf("owner of %s: CCM %q, speaker %q, admission %q", ip, ccmOwner, spkOwner, adm.Owner(ip))
		}
		want := ""
		for _, p := range adm.Pools {
			if slices.ContainsFunc(p.Ranges, func(r ipam.Range) bool { return r.Contains(ip) }) {
				want = p.Name
			}
		}
		if ccmOwner != want {
			t.Fatalf("owner of %s: %q, but it lies in admitted pool %q", ip, ccmOwner, want)
		}
		if r, ok := adm.RefusedContaining(ip); ok && r.Reason != v1alpha1.ReasonOverlap && ccmOwner != "" &&
			!strings.HasPrefix(r.Message, "spec.addresses") && v1alpha1.OlderFirst(byName[r.Pool], byName[ccmOwner]) {
			out.shadowFree++
		}
	}

	// Order independent and deterministic.
	shuffled := slices.Clone(pools)
	g.shuffle(shuffled)
	again := poolspec.Admit(shuffled)
	if !slices.Equal(names(again), names(adm)) || !slices.Equal(again.Refused, adm.Refused) {
		t.Fatalf("Admit depends on the order of its input:\n  %v %v\n  %v %v", names(adm), adm.Refused, names(again), again.Refused)
	}
	for _, ip := range probes {
		if again.Owner(ip) != adm.Owner(ip) {
			t.Fatalf("owner of %s: %q, then %q for the same pools", ip, adm.Owner(ip), again.Owner(ip))
		}
	}
	return out
}

func names(a *poolspec.Admission) []string {
	var out []string
	for _, p := range a.Pools {
		out = append(out, p.Name)
	}
	return out
}

// describe renders a pool set for a failure message.
func describe(pools []*v1alpha1.IPPool) string {
	var b strings.Builder
	for _, p := range pools {
		fmt.Fprintf(&b, "\n  %s created %s addresses %q", p.Name, p.CreationTimestamp.Format(time.TimeOnly), p.Spec.Addresses)
		if a := p.Spec.Allocation; a != nil {
			fmt.Fprintf(&b, " allocation %+v", *a)
		}
		if bg := p.Spec.BGP; bg != nil {
			fmt.Fprintf(&b, " bgp %+v", *bg)
		}
	}
	return b.String()
}

// agreementSets is how many random pool sets TestCCMAndSpeakerAgree tries.
const agreementSets = 2000

// TestCCMAndSpeakerAgree is the property test: for random pool sets
// (fixed seeds, so every run tries the same sets), the CCM and the speaker
// agree on the owner of every address; see checkAgreement.
func TestCCMAndSpeakerAgree(t *testing.T) {
	total := outcome{reasons: map[string]int{}}
	for seed := range uint64(agreementSets) {
		g := gen{randSource{rand.New(rand.NewPCG(seed, 0x5eed))}}
		pools := g.poolSet()
		probes := g.probes(pools)
		var o outcome
		ok := t.Run("", func(t *testing.T) { o = checkAgreement(t, g, pools, probes) })
		if !ok {
			t.Fatalf("seed %d, pools:%s", seed, describe(pools))
		}
		total.probes += o.probes
		total.admitted += o.admitted
		total.shadowFree += o.shadowFree
		for r, n := range o.reasons {
			total.reasons[r] += n
		}
	}
	t.Logf("%d pool sets, %d addresses probed, %d pools admitted, refusals %v, %d addresses of a newer pool overlapping a pool refused before the overlap check",
		agreementSets, total.probes, total.admitted, total.reasons, total.shadowFree)
	// The generator must reach every kind of refusal, and the case the two
	// binaries used to disagree on.
	for _, r := range []string{v1alpha1.ReasonInvalidAddresses, v1alpha1.ReasonInvalidSelector, v1alpha1.ReasonInvalidConfig, v1alpha1.ReasonOverlap} {
		if total.reasons[r] < agreementSets/20 {
			t.Errorf("only %d refusals for %s: the generator does not cover it", total.reasons[r], r)
		}
	}
	if total.shadowFree < agreementSets/10 {
		t.Errorf("only %d addresses of a newer pool overlapping a pool refused before the overlap check", total.shadowFree)
	}
}
