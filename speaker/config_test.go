package speaker

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	fx "github.com/vipcast/vipcast/api/v1alpha1/v1alpha1test"
	"github.com/vipcast/vipcast/bfd"
	"github.com/vipcast/vipcast/bgp"
)

func TestCompilePools(t *testing.T) {
	badSel := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: "Is", Values: []string{"a"}}}}
	tests := []struct {
		name  string
		pools []*v1alpha1.IPPool
		// lookups: IP → owning pool name ("" for none)
		owner map[string]string
		// disabled: pool → substring of Disabled ("" for enabled)
		disabled map[string]string
		// errs: pool → substrings of its error, with the reason first
		errs map[string][]string
	}{
		{
			name:  "containment over CIDRs and ranges of both families",
			pools: []*v1alpha1.IPPool{fx.Pool("a", 0, "192.0.2.0/24", "198.51.100.10-198.51.100.20"), fx.Pool("b", 1, "2001:db8::/64")},
			owner: map[string]string{"192.0.2.0": "a", "192.0.2.255": "a", "198.51.100.10": "a", "198.51.100.20": "a", "198.51.100.21": "", "198.51.100.9": "", "2001:db8::1": "b", "2001:db8:1::1": "", "10.0.0.1": ""},
		},
		{
			name: "overlap: the older pool wins, regardless of list order",
			pools: []*v1alpha1.IPPool{
				fx.Pool("new", 10, "192.0.2.128/25", "203.0.113.0/24"),
				fx.Pool("old", 5, "192.0.2.0/24"),
			},
			owner: map[string]string{"192.0.2.200": "old", "203.0.113.1": ""},
			errs:  map[string][]string{"new": {v1alpha1.ReasonOverlap, `"old"`}},
		},
		{
			name: "overlap with equal timestamps: the smaller name wins",
			pools: []*v1alpha1.IPPool{
				fx.Pool("zz", 0, "192.0.2.0/24"),
				fx.Pool("aa", 0, "192.0.2.0/25"),
			},
			owner: map[string]string{"192.0.2.1": "aa", "192.0.2.200": ""},
			errs:  map[string][]string{"zz": {v1alpha1.ReasonOverlap}},
		},
		{
			name: "a rejected older pool does not shadow a newer one (as in the CCM)",
			pools: []*v1alpha1.IPPool{
				fx.Pool("old", 0, "192.0.2.0/24", "bogus"),
				fx.Pool("new", 1, "192.0.2.0/24"),
			},
			owner: map[string]string{"192.0.2.1": "new"},
			errs:  map[string][]string{"old": {v1alpha1.ReasonInvalidAddresses, "spec.addresses", "bogus"}},
		},
		{
			name: "unparsable addresses are skipped and reported",
			pools: []*v1alpha1.IPPool{
				fx.Pool("bad", 0, "192.0.2.9-192.0.2.1"),
				fx.Pool("good", 1, "198.51.100.0/24"),
			},
			owner: map[string]string{"192.0.2.5": "", "198.51.100.5": "good"},
			errs:  map[string][]string{"bad": {v1alpha1.ReasonInvalidAddresses, "range start is after its end"}},
		},
		{
			name: "allocation selector that does not parse rejects the pool, as in the CCM",
			pools: []*v1alpha1.IPPool{func() *v1alpha1.IPPool {
				p := fx.Pool("p", 0, "192.0.2.0/24")
				p.Spec.Allocation = &v1alpha1.IPPoolAllocation{ServiceSelectors: []metav1.LabelSelector{*badSel}}
				return p
			}()},
			owner: map[string]string{"192.0.2.1": ""},
			errs:  map[string][]string{"p": {v1alpha1.ReasonInvalidSelector, "spec.allocation.serviceSelectors[0]"}},
		},
		{
			name: "nodeSelector not selecting this node disables without error",
			pools: []*v1alpha1.IPPool{
				fx.WithBGP(fx.Pool("other", 0, "192.0.2.0/24"), v1alpha1.IPPoolBGP{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "b"}}}),
				fx.WithBGP(fx.Pool("mine", 1, "198.51.100.0/24"), v1alpha1.IPPoolBGP{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "a"}}}),
				fx.WithBGP(fx.Pool("all", 2, "203.0.113.0/24"), v1alpha1.IPPoolBGP{NodeSelector: &metav1.LabelSelector{}}),
			},
			owner:    map[string]string{"192.0.2.1": "other", "198.51.100.1": "mine", "203.0.113.1": "all"},
			disabled: map[string]string{"other": "pool other's nodeSelector does not select this node", "mine": "", "all": ""},
		},
		// A pool whose spec.bgp cannot be announced is refused, as in the
		// CCM: it owns no address. (The speaker used to keep it as a
		// Disabled owner, and so disagreed with the CCM about a newer pool
		// overlapping it.)
		{
			name:  "malformed nodeSelector: refused, owns nothing, reported",
			pools: []*v1alpha1.IPPool{fx.WithBGP(fx.Pool("p", 0, "192.0.2.0/24"), v1alpha1.IPPoolBGP{NodeSelector: badSel})},
			owner: map[string]string{"192.0.2.1": ""},
			errs:  map[string][]string{"p": {v1alpha1.ReasonInvalidSelector, "spec.bgp.nodeSelector", `"Is"`, "the speakers would not announce this pool"}},
		},
		{
			name: "a pool refused for its spec.bgp does not shadow a newer one (as in the CCM)",
			pools: []*v1alpha1.IPPool{
				fx.WithBGP(fx.Pool("old", 0, "192.0.2.0/24"), v1alpha1.IPPoolBGP{Communities: []string{"64512:100", "65536:1"}}),
				fx.Pool("new", 1, "192.0.2.128/25"),
			},
			owner:    map[string]string{"192.0.2.1": "", "192.0.2.200": "new"},
			disabled: map[string]string{"new": ""},
			errs:     map[string][]string{"old": {v1alpha1.ReasonInvalidConfig, `spec.bgp.communities[1] "65536:1"`}},
		},
		{
			name:  "malformed peerSelector",
			pools: []*v1alpha1.IPPool{fx.WithBGP(fx.Pool("p", 0, "192.0.2.0/24"), v1alpha1.IPPoolBGP{PeerSelector: badSel})},
			owner: map[string]string{"192.0.2.1": ""},
			errs:  map[string][]string{"p": {v1alpha1.ReasonInvalidSelector, "spec.bgp.peerSelector"}},
		},
		{
			name:  "malformed community",
			pools: []*v1alpha1.IPPool{fx.WithBGP(fx.Pool("p", 0, "192.0.2.0/24"), v1alpha1.IPPoolBGP{Communities: []string{"64512:100", "65536:1"}})},
			errs:  map[string][]string{"p": {v1alpha1.ReasonInvalidConfig, `spec.bgp.communities[1] "65536:1"`, "ASN:VALUE"}},
		},
		{
			name:  "malformed large community",
			pools: []*v1alpha1.IPPool{fx.WithBGP(fx.Pool("p", 0, "192.0.2.0/24"), v1alpha1.IPPoolBGP{LargeCommunities: []string{"1:2"}})},
			errs:  map[string][]string{"p": {v1alpha1.ReasonInvalidConfig, `spec.bgp.largeCommunities[0] "1:2"`}},
		},
		{
			name: "aggregation that fits ranges filling whole blocks",
			pools: []*v1alpha1.IPPool{fx.WithBGP(fx.Pool("p", 0, "192.0.2.0-192.0.2.127", "192.0.2.128/25", "2001:db8::-2001:db8::ffff"),
				v1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](24), AggregationLengthV6: ptr.To[int32](112)})},
			disabled: map[string]string{"p": ""},
		},
		{
			name:  "aggregation covering addresses outside a range",
			pools: []*v1alpha1.IPPool{fx.WithBGP(fx.Pool("p", 0, "192.0.2.10-192.0.2.21"), v1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](24)})},
			owner: map[string]string{"192.0.2.10": ""},
			errs:  map[string][]string{"p": {v1alpha1.ReasonInvalidAddresses, "spec.bgp.aggregationLength 24 would announce 192.0.2.0/24", "use 31 or longer"}},
		},
		{
			name:  "IPv6 aggregation shorter than a CIDR",
			pools: []*v1alpha1.IPPool{fx.WithBGP(fx.Pool("p", 0, "2001:db8::/120"), v1alpha1.IPPoolBGP{AggregationLengthV6: ptr.To[int32](64)})},
			errs:  map[string][]string{"p": {v1alpha1.ReasonInvalidAddresses, "aggregationLengthV6 64 would announce 2001:db8::/64", "use 120 or longer"}},
		},
		{
			name:  "aggregation out of range",
			pools: []*v1alpha1.IPPool{fx.WithBGP(fx.Pool("p", 0, "192.0.2.0/24"), v1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](33)})},
			errs:  map[string][]string{"p": {v1alpha1.ReasonInvalidAddresses, "out of range"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			view, errs := Compile(tc.pools, nil, testNode())
			got := map[string]PoolError{}
			for _, e := range errs {
				if _, dup := got[e.Pool]; dup {
					t.Errorf("two errors for pool %s", e.Pool)
				}
				got[e.Pool] = e
				if !strings.Contains(e.Error(), "IPPool "+e.Pool+": ") {
					t.Errorf("error %q does not name the IPPool", e)
				}
			}
			for pool, want := range tc.errs {
				e, ok := got[pool]
				if !ok {
					t.Errorf("no error for pool %s; errors: %v", pool, errs)
					continue
				}
				if e.Reason != want[0] {
					t.Errorf("pool %s: reason %s, want %s", pool, e.Reason, want[0])
				}
				for _, s := range want[1:] {
					if !strings.Contains(e.Message, s) {
						t.Errorf("pool %s: message %q does not contain %q", pool, e.Message, s)
					}
				}
			}
			for pool := range got {
				if _, ok := tc.errs[pool]; !ok {
					t.Errorf("unexpected error %v", got[pool])
				}
				if view.Pool(pool) != nil {
					t.Errorf("refused pool %s is in the view", pool)
				}
			}
			for ip, want := range tc.owner {
				p := view.PoolFor(netip.MustParseAddr(ip))
				name := ""
				if p != nil {
					name = p.Name
				}
				if name != want {
					t.Errorf("PoolFor(%s) = %q, want %q", ip, name, want)
				}
			}
			for pool, want := range tc.disabled {
				p := view.Pool(pool)
				if p == nil {
					t.Errorf("pool %s not accepted", pool)
					continue
				}
				if (want == "") != (p.Disabled == "") || !strings.Contains(p.Disabled, want) {
					t.Errorf("pool %s Disabled = %q, want it to contain %q", pool, p.Disabled, want)
				}
			}
		})
	}
}

func TestCompileAttributes(t *testing.T) {
	peers := []*v1alpha1.BGPPeer{
		mkPeer("tor-b", "10.0.0.253", map[string]string{"role": "tor"}),
		mkPeer("tor-a", "10.0.0.254", map[string]string{"role": "tor"}),
		mkPeer("rr", "10.0.0.100", map[string]string{"role": "rr"}),
		// A ToR of another zone: not a peer of this node, so never selected.
		func() *v1alpha1.BGPPeer {
			p := mkPeer("tor-zone-b", "10.1.0.254", map[string]string{"role": "tor"})
			p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "b"}}
			return p
		}(),
		// Unusable on this node: not selectable either.
		func() *v1alpha1.BGPPeer {
			p := mkPeer("tor-broken", "not-an-ip", map[string]string{"role": "tor"})
			return p
		}(),
		// Password not readable: still selected (PeersForNode reports it).
		func() *v1alpha1.BGPPeer {
			p := mkPeer("tor-secret", "10.0.0.252", map[string]string{"role": "tor"})
			p.Spec.PasswordSecretRef = &v1alpha1.SecretKeyReference{Namespace: "ns", Name: "missing"}
			return p
		}(),
	}
	pools := []*v1alpha1.IPPool{
		fx.WithBGP(fx.Pool("attrs", 0, "192.0.2.0/24", "2001:db8::/64"), v1alpha1.IPPoolBGP{
			Communities:         []string{"no-export", "64512:100", "64512:100", "0:0", "65535:65535", "blackhole"},
			LargeCommunities:    []string{"4200000000:1:2", "1:2:3", "4294967295:0:4294967295"},
			LocalPref:           ptr.To[uint32](200),
			AggregationLength:   ptr.To[int32](28),
			AggregationLengthV6: ptr.To[int32](120),
			PeerSelector:        &metav1.LabelSelector{MatchLabels: map[string]string{"role": "tor"}},
		}),
		fx.WithBGP(fx.Pool("none", 1, "198.51.100.0/24"), v1alpha1.IPPoolBGP{PeerSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "nope"}}}),
		fx.Pool("plain", 2, "203.0.113.0/24"),
	}
	view, errs := Compile(pools, peers, testNode())
	if len(errs) != 0 {
		t.Fatalf("errors: %v", errs)
	}
	p := view.Pool("attrs")
	wantComm := []uint32{0, 64512<<16 | 100, 0xFFFF029A, 0xFFFFFF01, 0xFFFFFFFF}
	if !reflect.DeepEqual(p.Communities, wantComm) {
		t.Errorf("Communities = %#x, want %#x", p.Communities, wantComm)
	}
	wantLarge := []bgp.LargeCommunity{{Global: 1, Local1: 2, Local2: 3}, {Global: 4200000000, Local1: 1, Local2: 2}, {Global: 4294967295, Local1: 0, Local2: 4294967295}}
	if !reflect.DeepEqual(p.LargeCommunities, wantLarge) {
		t.Errorf("LargeCommunities = %v, want %v", p.LargeCommunities, wantLarge)
	}
	if p.LocalPref == nil || *p.LocalPref != 200 {
		t.Errorf("LocalPref = %v", p.LocalPref)
	}
	if p.AggregationLength != 28 || p.AggregationLengthV6 != 120 {
		t.Errorf("aggregation = %d, %d", p.AggregationLength, p.AggregationLengthV6)
	}
	if want := []string{"tor-a", "tor-b", "tor-secret"}; !reflect.DeepEqual(p.Peers, want) || !p.HasPeerSelector {
		t.Errorf("Peers = %v (HasPeerSelector %v), want %v", p.Peers, p.HasPeerSelector, want)
	}
	if n := view.Pool("none"); n.Peers == nil || len(n.Peers) != 0 || !n.HasPeerSelector {
		t.Errorf("pool none: Peers = %#v, HasPeerSelector = %v; want empty non-nil, true", n.Peers, n.HasPeerSelector)
	}
	pl := view.Pool("plain")
	if pl.Peers != nil || pl.HasPeerSelector || pl.Communities != nil || pl.LocalPref != nil || pl.AggregationLength != 32 || pl.AggregationLengthV6 != 128 {
		t.Errorf("pool plain = %+v, want defaults", pl)
	}
}

func TestPeersForNode(t *testing.T) {
	full := mkPeer("full", "2001:db8::fe", map[string]string{"role": "tor"})
	full.Spec.Port = ptr.To[int32](1179)
	full.Spec.SourceAddress = "2001:db8::10"
	full.Spec.HoldTime = &metav1.Duration{Duration: 9 * time.Second}
	full.Spec.KeepaliveTime = &metav1.Duration{Duration: 2 * time.Second}
	full.Spec.EBGPMultiHop = ptr.To[int32](3)
	full.Spec.PasswordSecretRef = &v1alpha1.SecretKeyReference{Namespace: "vipcast", Name: "bgp", Key: "tor"}
	full.Spec.GracefulRestart = &v1alpha1.GracefulRestart{Enabled: true, RestartTime: &metav1.Duration{Duration: 30 * time.Second}}
	full.Spec.Families = []v1alpha1.AddressFamily{v1alpha1.AddressFamilyIPv6Unicast}

	defaults := mkPeer("defaults", "10.0.0.254", nil)
	defaults.Spec.GracefulRestart = &v1alpha1.GracefulRestart{Enabled: true}

	ibgp := mkPeer("ibgp", "::ffff:10.0.0.250", nil)
	ibgp.Spec.PeerASN = 64512
	ibgp.Spec.GracefulRestart = &v1alpha1.GracefulRestart{Enabled: false, RestartTime: &metav1.Duration{Duration: time.Second}}

	otherZone := mkPeer("other-zone", "10.1.0.254", nil)
	otherZone.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "b"}}
	myZone := mkPeer("my-zone", "10.0.0.253", nil)
	myZone.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "c"}}}}
	myZone.Spec.BFD = &v1alpha1.BFDConfig{MinTx: &metav1.Duration{Duration: 100 * time.Millisecond}, Multiplier: ptr.To[int32](5)}
	badSel := mkPeer("bad-selector", "10.0.0.252", nil)
	badSel.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: "Equals"}}}
	noSecret := mkPeer("no-secret", "10.0.0.251", nil)
	noSecret.Spec.PasswordSecretRef = &v1alpha1.SecretKeyReference{Namespace: "vipcast", Name: "gone"}
	badAddr := mkPeer("bad-addr", "10.0.0.256", nil)
	badSrc := mkPeer("bad-source", "10.0.0.249", nil)
	badSrc.Spec.SourceAddress = "2001:db8::1"

	passwords := func(ref *v1alpha1.SecretKeyReference) (string, error) {
		if ref.Name == "bgp" && ref.KeyOrDefault() == "tor" {
			return "s3cret", nil
		}
		return "", errors.New(`secret vipcast/gone not found`)
	}
	all := []*v1alpha1.BGPPeer{full, defaults, ibgp, otherZone, myZone, badSel, noSecret, badAddr, badSrc}

	t.Run("translation", func(t *testing.T) {
		got, errs := PeersForNode(all, testNode(), passwords)
		want := []bgp.Peer{
			{Name: "defaults", Address: netip.MustParseAddr("10.0.0.254"), Port: 179, ASN: 65000, LocalASN: 64512,
				HoldTime: 90 * time.Second, KeepaliveTime: 30 * time.Second, EBGPMultiHop: 1,
				GracefulRestart: true, RestartTime: 120 * time.Second, Families: []bgp.Family{bgp.IPv4Unicast, bgp.IPv6Unicast}},
			{Name: "full", Address: netip.MustParseAddr("2001:db8::fe"), Port: 1179, ASN: 65000, LocalASN: 64512,
				SourceAddress: netip.MustParseAddr("2001:db8::10"), HoldTime: 9 * time.Second, KeepaliveTime: 2 * time.Second,
				EBGPMultiHop: 3, Password: "s3cret", GracefulRestart: true, RestartTime: 30 * time.Second, Families: []bgp.Family{bgp.IPv6Unicast}},
			{Name: "ibgp", Address: netip.MustParseAddr("10.0.0.250"), Port: 179, ASN: 64512, LocalASN: 64512,
				HoldTime: 90 * time.Second, KeepaliveTime: 30 * time.Second, Families: []bgp.Family{bgp.IPv4Unicast, bgp.IPv6Unicast}},
			{Name: "my-zone", Address: netip.MustParseAddr("10.0.0.253"), Port: 179, ASN: 65000, LocalASN: 64512,
				HoldTime: 90 * time.Second, KeepaliveTime: 30 * time.Second, EBGPMultiHop: 1, Families: []bgp.Family{bgp.IPv4Unicast, bgp.IPv6Unicast},
				BFD: &bgp.BFD{MinTx: 100 * time.Millisecond, MinRx: 300 * time.Millisecond, Multiplier: 5}},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("peers:\n got %+v\nwant %+v", got, want)
		}
		wantErrs := map[string][]string{
			"bad-selector": {v1alpha1.ReasonInvalidSelector, "spec.nodeSelector", `"Equals"`},
			"no-secret":    {v1alpha1.ReasonSecretNotFound, `Secret vipcast/gone key "password"`, "not found"},
			"bad-addr":     {v1alpha1.ReasonInvalidConfig, `spec.peerAddress "10.0.0.256"`},
			"bad-source":   {v1alpha1.ReasonInvalidConfig, "spec.sourceAddress", "different IP families"},
		}
		if len(errs) != len(wantErrs) {
			t.Errorf("errors = %v, want %d", errs, len(wantErrs))
		}
		for i, e := range errs {
			if i > 0 && errs[i-1].Peer >= e.Peer {
				t.Errorf("errors not sorted by peer: %v", errs)
			}
			want, ok := wantErrs[e.Peer]
			if !ok {
				t.Errorf("unexpected error %v", e)
				continue
			}
			if e.Reason != want[0] {
				t.Errorf("%s: reason %s, want %s", e.Peer, e.Reason, want[0])
			}
			for _, s := range want[1:] {
				if !strings.Contains(e.Error(), s) {
					t.Errorf("%s: error %q does not contain %q", e.Peer, e, s)
				}
			}
			if !strings.HasPrefix(e.Error(), "BGPPeer "+e.Peer+": ") {
				t.Errorf("error %q does not name the BGPPeer", e)
			}
		}
	})

	t.Run("node ASN override", func(t *testing.T) {
		n := testNode()
		n.LocalASN = 4200000001
		got, _ := PeersForNode([]*v1alpha1.BGPPeer{defaults, ibgp, full}, n, passwords)
		for _, p := range got {
			if p.LocalASN != 4200000001 {
				t.Errorf("%s: LocalASN %d, want the node override", p.Name, p.LocalASN)
			}
		}
		// The override turned the iBGP peer into eBGP: TTL now applies.
		if got[2].Name != "ibgp" || got[2].EBGPMultiHop != 1 {
			t.Errorf("ibgp peer under override: %+v", got[2])
		}
		// And the other way round: eBGP peer made iBGP drops multihop.
		n.LocalASN = 65000
		got, _ = PeersForNode([]*v1alpha1.BGPPeer{full}, n, passwords)
		if len(got) != 1 || !got[0].IBGP() || got[0].EBGPMultiHop != 0 {
			t.Errorf("full peer under override to its own ASN: %+v", got)
		}
	})

	t.Run("nil password callback", func(t *testing.T) {
		got, errs := PeersForNode([]*v1alpha1.BGPPeer{full, defaults}, testNode(), nil)
		if len(got) != 1 || got[0].Name != "defaults" || len(errs) != 1 || errs[0].Reason != v1alpha1.ReasonSecretNotFound {
			t.Errorf("got %v, %v", got, errs)
		}
	})

	t.Run("input not modified and order independent", func(t *testing.T) {
		rev := []*v1alpha1.BGPPeer{badSrc, myZone, defaults, full}
		got, _ := PeersForNode(rev, testNode(), passwords)
		if rev[0] != badSrc || len(got) != 3 || got[0].Name != "defaults" || got[2].Name != "my-zone" {
			t.Errorf("got %v", got)
		}
	})
}

// TestPeersForNodeAddressConflict: a node has one session per address, so
// of the BGPPeers selecting the node with the same address only the oldest
// is opened; the others are reported, and every other peer is kept.
func TestPeersForNodeAddressConflict(t *testing.T) {
	at := func(p *v1alpha1.BGPPeer, sec int) *v1alpha1.BGPPeer {
		p.CreationTimestamp = metav1.NewTime(time.Unix(1700000000+int64(sec), 0))
		return p
	}
	zone := func(p *v1alpha1.BGPPeer, z string) *v1alpha1.BGPPeer {
		p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": z}}
		return p
	}
	secret := func(p *v1alpha1.BGPPeer, name string) *v1alpha1.BGPPeer {
		p.Spec.PasswordSecretRef = &v1alpha1.SecretKeyReference{Namespace: "vipcast", Name: name}
		return p
	}
	passwords := func(ref *v1alpha1.SecretKeyReference) (string, error) {
		if ref.Name == "bgp" {
			return "s3cret", nil
		}
		return "", errors.New("secret vipcast/" + ref.Name + " not found")
	}
	tests := []struct {
		name  string
		peers []*v1alpha1.BGPPeer
		want  []string // sessions, by name
		// errs: peer → substrings of its error, reason first
		errs map[string][]string
	}{{
		name: "the older peer wins whatever the names and list order; the other session stays",
		peers: []*v1alpha1.BGPPeer{
			at(mkPeer("a-new", "10.0.0.9", nil), 2),
			at(mkPeer("other", "10.0.0.8", nil), 3),
			at(mkPeer("z-old", "10.0.0.9", nil), 1),
		},
		want: []string{"other", "z-old"},
		errs: map[string][]string{"a-new": {v1alpha1.ReasonAddressConflict, "spec.peerAddress 10.0.0.9", "BGPPeer z-old", "delete one of them", "nodeSelectors"}},
	}, {
		name: "same creation time: the smaller name wins",
		peers: []*v1alpha1.BGPPeer{
			at(mkPeer("b", "10.0.0.9", nil), 1),
			at(mkPeer("a", "10.0.0.9", nil), 1),
		},
		want: []string{"a"},
		errs: map[string][]string{"b": {v1alpha1.ReasonAddressConflict, "BGPPeer a"}},
	}, {
		name: "an IPv4-mapped IPv6 address is the IPv4 address",
		peers: []*v1alpha1.BGPPeer{
			at(mkPeer("old", "10.0.0.9", nil), 1),
			at(mkPeer("new", "::ffff:10.0.0.9", nil), 2),
		},
		want: []string{"old"},
		errs: map[string][]string{"new": {v1alpha1.ReasonAddressConflict, "BGPPeer old"}},
	}, {
		name: "three peers: both newer ones name the oldest",
		peers: []*v1alpha1.BGPPeer{
			at(mkPeer("p3", "2001:db8::9", nil), 3),
			at(mkPeer("p2", "2001:db8::9", nil), 2),
			at(mkPeer("p1", "2001:db8::9", nil), 1),
		},
		want: []string{"p1"},
		errs: map[string][]string{
			"p2": {v1alpha1.ReasonAddressConflict, "BGPPeer p1"},
			"p3": {v1alpha1.ReasonAddressConflict, "BGPPeer p1"},
		},
	}, {
		name: "an older peer that does not select this node does not count",
		peers: []*v1alpha1.BGPPeer{
			zone(at(mkPeer("old", "10.0.0.9", nil), 1), "b"),
			at(mkPeer("new", "10.0.0.9", nil), 2),
		},
		want: []string{"new"},
	}, {
		name: "an older peer whose settings are unusable does not count",
		peers: []*v1alpha1.BGPPeer{
			func() *v1alpha1.BGPPeer {
				p := at(mkPeer("old", "10.0.0.9", nil), 1)
				p.Spec.SourceAddress = "2001:db8::1"
				return p
			}(),
			at(mkPeer("new", "10.0.0.9", nil), 2),
		},
		want: []string{"new"},
		errs: map[string][]string{"old": {v1alpha1.ReasonInvalidConfig, "spec.sourceAddress"}},
	}, {
		name: "an older peer whose Secret is missing still wins (the conflict is decided before passwords)",
		peers: []*v1alpha1.BGPPeer{
			secret(at(mkPeer("old", "10.0.0.9", nil), 1), "gone"),
			secret(at(mkPeer("new", "10.0.0.9", nil), 2), "bgp"),
			at(mkPeer("other", "10.0.0.8", nil), 3),
		},
		want: []string{"other"},
		errs: map[string][]string{
			"old": {v1alpha1.ReasonSecretNotFound, "vipcast/gone"},
			"new": {v1alpha1.ReasonAddressConflict, "BGPPeer old"},
		},
	}, {
		name: "different ports are still one address",
		peers: []*v1alpha1.BGPPeer{
			at(mkPeer("old", "10.0.0.9", nil), 1),
			func() *v1alpha1.BGPPeer {
				p := at(mkPeer("new", "10.0.0.9", nil), 2)
				p.Spec.Port = ptr.To[int32](1179)
				return p
			}(),
		},
		want: []string{"old"},
		errs: map[string][]string{"new": {v1alpha1.ReasonAddressConflict, "BGPPeer old"}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := PeersForNode(tc.peers, testNode(), passwords)
			var names []string
			for _, p := range got {
				names = append(names, p.Name)
			}
			if !reflect.DeepEqual(names, tc.want) {
				t.Errorf("sessions = %v, want %v", names, tc.want)
			}
			if len(errs) != len(tc.errs) {
				t.Errorf("errors = %v, want %d", errs, len(tc.errs))
			}
			for i, e := range errs {
				if i > 0 && errs[i-1].Peer >= e.Peer {
					t.Errorf("errors not sorted by peer: %v", errs)
				}
				want, ok := tc.errs[e.Peer]
				if !ok {
					t.Errorf("unexpected error %v", e)
					continue
				}
				if e.Reason != want[0] {
					t.Errorf("%s: reason %s, want %s", e.Peer, e.Reason, want[0])
				}
				for _, s := range want[1:] {
					if !strings.Contains(e.Error(), s) {
						t.Errorf("%s: error %q does not contain %q", e.Peer, e, s)
					}
				}
			}
			// A pool's peerSelector sees the same peers as the sessions,
			// plus those left out only for their password.
			pool := fx.WithBGP(fx.Pool("p", 0, "192.0.2.0/24"), v1alpha1.IPPoolBGP{PeerSelector: &metav1.LabelSelector{}})
			view, _ := Compile([]*v1alpha1.IPPool{pool}, tc.peers, testNode())
			wantSel := slices.Clone(tc.want)
			for name, e := range tc.errs {
				if e[0] == v1alpha1.ReasonSecretNotFound {
					wantSel = append(wantSel, name)
				}
			}
			slices.Sort(wantSel)
			if got := view.Pool("p").Peers; !reflect.DeepEqual(got, wantSel) {
				t.Errorf("pool peerSelector selects %v, want %v", got, wantSel)
			}
		})
	}
}

// TestPeersForNodeBFDHardening: spec.bfd.minimumTTL reaches the session
// (254 by default for multihop, nothing for single hop), and
// spec.bfd.authentication's key is read from its Secret; a missing Secret
// or a key that is not 1 to 20 bytes leaves the peer out with a message
// that names the Secret and never the key.
func TestPeersForNodeBFDHardening(t *testing.T) {
	bird := mkPeer("bird", "10.0.0.240", nil)
	bird.Spec.EBGPMultiHop = ptr.To[int32](2)
	bird.Spec.BFD = &v1alpha1.BFDConfig{Multihop: true, MinimumTTL: ptr.To[int32](64),
		Authentication: &v1alpha1.BFDAuthentication{Type: v1alpha1.BFDAuthMeticulousKeyedSHA1, KeyID: 9,
			SecretRef: v1alpha1.SecretKeyReference{Namespace: "vipcast", Name: "bfd", Key: "bird"}}}
	mh := mkPeer("multihop", "10.0.0.241", nil)
	mh.Spec.EBGPMultiHop = ptr.To[int32](2)
	mh.Spec.BFD = &v1alpha1.BFDConfig{Multihop: true}
	single := mkPeer("single", "10.0.0.242", nil)
	single.Spec.BFD = &v1alpha1.BFDConfig{}
	gone := mkPeer("gone", "10.0.0.243", nil)
	gone.Spec.BFD = &v1alpha1.BFDConfig{Authentication: &v1alpha1.BFDAuthentication{Type: v1alpha1.BFDAuthKeyedSHA1,
		SecretRef: v1alpha1.SecretKeyReference{Namespace: "vipcast", Name: "gone"}}}
	long := mkPeer("long", "10.0.0.244", nil)
	long.Spec.BFD = &v1alpha1.BFDConfig{Authentication: &v1alpha1.BFDAuthentication{Type: v1alpha1.BFDAuthKeyedSHA1,
		SecretRef: v1alpha1.SecretKeyReference{Namespace: "vipcast", Name: "bfd", Key: "long"}}}
	const longKey = "a key of twenty-one b"
	secrets := func(ref *v1alpha1.SecretKeyReference) (string, error) {
		switch {
		case ref.Name == "bfd" && ref.KeyOrDefault() == "bird":
			return "bird-key", nil
		case ref.Name == "bfd" && ref.KeyOrDefault() == "long":
			return longKey, nil
		}
		return "", errors.New("secret vipcast/gone not found")
	}
	got, errs := PeersForNode([]*v1alpha1.BGPPeer{bird, mh, single, gone, long}, testNode(), secrets)
	byName := map[string]bgp.Peer{}
	for _, p := range got {
		byName[p.Name] = p
	}
	if b := byName["bird"].BFD; b == nil || b.MinTTL != 64 || !b.Multihop ||
		!b.Auth.Equal(&bfd.Auth{Type: bfd.AuthMeticulousKeyedSHA1, KeyID: 9, Key: bfd.Key("bird-key")}) {
		t.Errorf("bird: BFD %+v, want multihop, minimum TTL 64, meticulous keyed SHA1 key ID 9 with the Secret's key", b)
	}
	if b := byName["multihop"].BFD; b == nil || b.MinTTL != 254 || b.Auth != nil {
		t.Errorf("multihop: BFD %+v, want minimum TTL 254 and no authentication", b)
	}
	if b := byName["single"].BFD; b == nil || b.MinTTL != 0 || b.Auth != nil {
		t.Errorf("single: BFD %+v, want no minimum TTL (single hop: 255) and no authentication", b)
	}
	want := map[string][]string{
		"gone": {v1alpha1.ReasonSecretNotFound, "spec.bfd.authentication.secretRef", `Secret vipcast/gone key "password"`},
		"long": {v1alpha1.ReasonInvalidConfig, "spec.bfd.authentication.secretRef", "21 bytes", "1 to 20"},
	}
	if len(errs) != len(want) || len(got) != 3 {
		t.Fatalf("peers %v, errors %v; want 3 peers and errors for %v", got, errs, want)
	}
	for _, e := range errs {
		w := want[e.Peer]
		if w == nil || e.Reason != w[0] {
			t.Errorf("unexpected error %v", e)
			continue
		}
		for _, s := range w[1:] {
			if !strings.Contains(e.Error(), s) {
				t.Errorf("%s: %q does not contain %q", e.Peer, e, s)
			}
		}
		if strings.Contains(e.Error(), longKey) {
			t.Errorf("%s: the message shows the key: %q", e.Peer, e)
		}
	}
}
