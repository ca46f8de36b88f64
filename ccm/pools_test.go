package ccm

import (
	"errors"
	"math/big"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ipam"
	"github.com/vipcast/vipcast/poolspec"
)

// newIPPool returns an IPPool named "blue" with the given addresses and
// allocation settings.
func newIPPool(alloc *v1alpha1.IPPoolAllocation, addresses ...string) *v1alpha1.IPPool {
	return &v1alpha1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "blue", Generation: 7},
		Spec:       v1alpha1.IPPoolSpec{Addresses: addresses, Allocation: alloc},
	}
}

// TestLoadPoolsRefusals checks the condition reason and message the CCM
// publishes for each kind of refused pool.
func TestLoadPoolsRefusals(t *testing.T) {
	badOp := metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "env", Operator: "Near", Values: []string{"prod"}},
	}}
	good := metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}
	tests := []struct {
		name       string
		pool       *v1alpha1.IPPool
		wantReason string
		wantIn     []string
	}{
		{
			name:       "bad operator in second namespace selector",
			pool:       newIPPool(&v1alpha1.IPPoolAllocation{NamespaceSelectors: []metav1.LabelSelector{good, badOp}}, "192.0.2.0/24"),
			wantReason: v1alpha1.ReasonInvalidSelector,
			wantIn:     []string{"spec.allocation.namespaceSelectors[1]", "Near"},
		},
		{
			name:       "bad operator in first service selector",
			pool:       newIPPool(&v1alpha1.IPPoolAllocation{ServiceSelectors: []metav1.LabelSelector{badOp}}, "192.0.2.0/24"),
			wantReason: v1alpha1.ReasonInvalidSelector,
			wantIn:     []string{"spec.allocation.serviceSelectors[0]"},
		},
		{
			name:       "malformed address",
			pool:       newIPPool(nil, "192.0.2.0/24", "not-an-address"),
			wantReason: v1alpha1.ReasonInvalidAddresses,
			wantIn:     []string{"spec.addresses", "not-an-address"},
		},
		{
			name:       "prefix too long",
			pool:       newIPPool(nil, "192.0.2.0/33"),
			wantReason: v1alpha1.ReasonInvalidAddresses,
			wantIn:     []string{"spec.addresses", "192.0.2.0/33"},
		},
		{
			name:       "backwards range",
			pool:       newIPPool(nil, "10.0.0.9-10.0.0.1"),
			wantReason: v1alpha1.ReasonInvalidAddresses,
			wantIn:     []string{"spec.addresses", "10.0.0.9-10.0.0.1"},
		},
		{
			name:       "malformed addresses reported before bad selectors",
			pool:       newIPPool(&v1alpha1.IPPoolAllocation{NamespaceSelectors: []metav1.LabelSelector{badOp}}, "bogus"),
			wantReason: v1alpha1.ReasonInvalidAddresses,
			wantIn:     []string{"spec.addresses", "bogus"},
		},
		{
			name:       "aggregation would announce addresses outside the pool",
			pool:       withBGP(newIPPool(nil, "192.0.2.10-192.0.2.20"), &v1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](24)}),
			wantReason: v1alpha1.ReasonInvalidAddresses,
			wantIn:     []string{"spec.bgp.aggregationLength 24", "192.0.2.0/24", "use 32 or longer", "no VIP is allocated"},
		},
		{
			name:       "community the speakers cannot decode",
			pool:       withBGP(newIPPool(nil, "192.0.2.0/24"), &v1alpha1.IPPoolBGP{Communities: []string{"64512:100", "65536:1"}}),
			wantReason: v1alpha1.ReasonInvalidConfig,
			wantIn:     []string{"spec.bgp.communities[1]", "65536:1"},
		},
		{
			name:       "bad BGP node selector",
			pool:       withBGP(newIPPool(nil, "192.0.2.0/24"), &v1alpha1.IPPoolBGP{NodeSelector: &badOp}),
			wantReason: v1alpha1.ReasonInvalidSelector,
			wantIn:     []string{"spec.bgp.nodeSelector", "Near"},
		},
		{
			name:       "entries of one pool overlap",
			pool:       newIPPool(nil, "192.0.2.0/24", "192.0.2.128/25"),
			wantReason: v1alpha1.ReasonOverlap,
			wantIn:     []string{"spec.addresses"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			alloc := ipam.New()
			adm, refused, err := LoadPools(alloc, []*v1alpha1.IPPool{tc.pool})
			if err != nil {
				t.Fatalf("LoadPools: %v", err)
			}
			r, ok := refused["blue"]
			if !ok || len(refused) != 1 || len(adm.Pools) != 0 {
				t.Fatalf("LoadPools: refused %+v, admitted %d; want blue refused", refused, len(adm.Pools))
			}
			if r.Reason != tc.wantReason {
				t.Errorf("reason = %q, want %q (message %q)", r.Reason, tc.wantReason, r.Message)
			}
			for _, s := range tc.wantIn {
				if !strings.Contains(r.Message, s) {
					t.Errorf("message %q does not mention %q", r.Message, s)
				}
			}
			if _, installed := alloc.Stats("blue"); installed {
				t.Errorf("refused pool installed in the allocator")
			}
		})
	}
}

func withBGP(p *v1alpha1.IPPool, b *v1alpha1.IPPoolBGP) *v1alpha1.IPPool {
	p.Spec.BGP = b
	return p
}

// agedPool returns an IPPool created age seconds after a fixed time.
func agedPool(name string, age int, addresses ...string) *v1alpha1.IPPool {
	p := newIPPool(nil, addresses...)
	p.Name = name
	p.CreationTimestamp = metav1.NewTime(time.Date(2026, 1, 1, 0, 0, age, 0, time.UTC))
	return p
}

// TestLoadPools checks what the allocator gets: the admitted pools, the
// older of two overlapping pools, and not a pool refused for its spec.bgp,
// which owns no address (a newer pool overlapping it is installed).
func TestLoadPools(t *testing.T) {
	alloc := ipam.New()
	pools := []*v1alpha1.IPPool{
		agedPool("newer", 2, "10.0.0.128/25"),
		agedPool("older", 1, "10.0.0.0/24"),
		withBGP(agedPool("dark", 3, "10.1.0.0/24"), &v1alpha1.IPPoolBGP{LargeCommunities: []string{"1:2"}}),
		agedPool("light", 4, "10.1.0.0/25"),
	}
	adm, refused, err := LoadPools(alloc, pools)
	if err != nil {
		t.Fatalf("LoadPools: %v", err)
	}
	if len(adm.Pools) != 2 || adm.Pools[0].Name != "older" || adm.Pools[1].Name != "light" {
		t.Errorf("admitted %+v, want older and light", adm.Pools)
	}
	if r := refused["newer"]; r.Reason != v1alpha1.ReasonOverlap || !strings.Contains(r.Message, `"older"`) || !strings.HasPrefix(r.Message, "spec.addresses: ") {
		t.Errorf("newer: %+v, want an Overlap naming older", r)
	}
	if r := refused["dark"]; r.Reason != v1alpha1.ReasonInvalidConfig || !strings.Contains(r.Message, "spec.bgp.largeCommunities[0]") {
		t.Errorf("dark: %+v, want InvalidConfig naming spec.bgp.largeCommunities[0]", r)
	}
	if len(refused) != 2 {
		t.Errorf("refused %+v, want newer and dark", refused)
	}
	for ip, want := range map[string]string{"10.0.0.200": "older", "10.1.0.1": "light", "10.1.0.200": ""} {
		if got, _ := alloc.PoolOf(netip.MustParseAddr(ip)); got != want {
			t.Errorf("allocator: PoolOf(%s) = %q, want %q", ip, got, want)
		}
	}
	// The same IPPools again: nothing changes.
	adm2, refused2, err := LoadPools(alloc, pools)
	if err != nil || !reflect.DeepEqual(refused2, refused) || len(adm2.Pools) != 2 {
		t.Errorf("second LoadPools: %v, %+v, %d admitted", err, refused2, len(adm2.Pools))
	}
}

// TestExplain checks that an allocation error names the refused pool a
// request is about.
func TestExplain(t *testing.T) {
	pc := &poolController{}
	base := errors.New("allocation failed")
	if got := pc.explain(ipam.Request{Pool: "dark"}, base); got != base { //nolint:errorlint // the very same error, not a wrapped one
		t.Errorf("before any sync: %v, want the error unchanged", got)
	}
	var err error
	pc.admission, pc.refused, err = LoadPools(ipam.New(), []*v1alpha1.IPPool{
		agedPool("good", 0, "10.0.0.0/24"),
		withBGP(agedPool("dark", 1, "10.1.0.10-10.1.0.20"), &v1alpha1.IPPoolBGP{AggregationLength: ptr.To[int32](24)}),
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		req  ipam.Request
		want string // "" = unchanged
	}{
		{"names the refused pool", ipam.Request{Pool: "dark"}, "allocation failed (IPPool dark is not ready: InvalidAddresses: spec.bgp.aggregationLength 24"},
		{"asks for one of its addresses", ipam.Request{IPs: []netip.Addr{netip.MustParseAddr("10.1.0.15")}}, "(IPPool dark is not ready: InvalidAddresses: "},
		{"asks for an address of an admitted pool", ipam.Request{IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}}, ""},
		{"names an admitted pool", ipam.Request{Pool: "good"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := pc.explain(tc.req, base)
			if !errors.Is(got, base) {
				t.Errorf("explain lost the error: %v", got)
			}
			if tc.want == "" && got != base || !strings.Contains(got.Error(), tc.want) { //nolint:errorlint // the very same error, not a wrapped one
				t.Errorf("explain = %q, want it to contain %q", got, tc.want)
			}
		})
	}
}

// familyStats returns ipam.FamilyStats with a capacity of n (nil when n
// is nil) and inUse addresses held.
func familyStats(n *big.Int, inUse int) ipam.FamilyStats {
	return ipam.FamilyStats{Capacity: n, InUse: inUse}
}

func TestDesiredStatusReady(t *testing.T) {
	tests := []struct {
		name        string
		installed   bool
		rej         poolspec.Refusal
		wantStatus  metav1.ConditionStatus
		wantReason  string
		wantMessage string
	}{
		{
			name:        "installed",
			installed:   true,
			wantStatus:  metav1.ConditionTrue,
			wantReason:  v1alpha1.ReasonValid,
			wantMessage: "the pool's addresses are available for allocation",
		},
		{
			name:        "rejected",
			rej:         poolspec.Refusal{Reason: v1alpha1.ReasonOverlap, Message: "overlaps pool red"},
			wantStatus:  metav1.ConditionFalse,
			wantReason:  v1alpha1.ReasonOverlap,
			wantMessage: "overlaps pool red",
		},
		{
			name:        "rejection wins over installed",
			installed:   true,
			rej:         poolspec.Refusal{Reason: v1alpha1.ReasonInvalidSelector, Message: "bad selector"},
			wantStatus:  metav1.ConditionFalse,
			wantReason:  v1alpha1.ReasonInvalidSelector,
			wantMessage: "bad selector",
		},
		{
			name:        "not installed yet",
			wantStatus:  metav1.ConditionUnknown,
			wantReason:  "Pending",
			wantMessage: "pool not loaded yet",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pool := newIPPool(nil, "192.0.2.0/24")
			st := desiredStatus(pool, ipam.PoolStats{}, tc.installed, tc.rej)
			if st.ObservedGeneration != 7 {
				t.Errorf("status ObservedGeneration = %d, want 7", st.ObservedGeneration)
			}
			if len(st.Conditions) != 1 {
				t.Fatalf("got %d conditions, want 1: %+v", len(st.Conditions), st.Conditions)
			}
			c := st.Conditions[0]
			if c.Type != v1alpha1.ConditionReady || c.Status != tc.wantStatus || c.Reason != tc.wantReason || c.Message != tc.wantMessage {
				t.Errorf("condition = %s/%s/%s/%q, want %s/%s/%s/%q",
					c.Type, c.Status, c.Reason, c.Message, v1alpha1.ConditionReady, tc.wantStatus, tc.wantReason, tc.wantMessage)
			}
			if c.ObservedGeneration != 7 {
				t.Errorf("condition ObservedGeneration = %d, want 7", c.ObservedGeneration)
			}
			if c.LastTransitionTime.IsZero() {
				t.Error("condition LastTransitionTime is zero")
			}
		})
	}
}

func TestDesiredStatusFamilies(t *testing.T) {
	two64 := new(big.Int).Lsh(big.NewInt(1), 64)
	tests := []struct {
		name     string
		stats    ipam.PoolStats
		wantIPv4 *v1alpha1.IPPoolFamilyStatus
		wantIPv6 *v1alpha1.IPPoolFamilyStatus
	}{
		{name: "no capacity anywhere"},
		{
			name:  "zero capacity and nothing in use",
			stats: ipam.PoolStats{IPv4: familyStats(big.NewInt(0), 0), IPv6: familyStats(big.NewInt(0), 0)},
		},
		{
			name:     "IPv4 only",
			stats:    ipam.PoolStats{IPv4: familyStats(big.NewInt(256), 3)},
			wantIPv4: &v1alpha1.IPPoolFamilyStatus{Capacity: "256", InUse: 3},
		},
		{
			name:     "IPv6 beyond int64",
			stats:    ipam.PoolStats{IPv6: familyStats(two64, 2)},
			wantIPv6: &v1alpha1.IPPoolFamilyStatus{Capacity: "18446744073709551616", InUse: 2},
		},
		{
			name:     "dual stack, nothing in use",
			stats:    ipam.PoolStats{IPv4: familyStats(big.NewInt(1), 0), IPv6: familyStats(new(big.Int).Lsh(big.NewInt(1), 80), 0)},
			wantIPv4: &v1alpha1.IPPoolFamilyStatus{Capacity: "1", InUse: 0},
			wantIPv6: &v1alpha1.IPPoolFamilyStatus{Capacity: "1208925819614629174706176", InUse: 0},
		},
		{
			name:     "addresses in use but no capacity left in the pool",
			stats:    ipam.PoolStats{IPv4: familyStats(nil, 2), IPv6: familyStats(big.NewInt(0), 1)},
			wantIPv4: &v1alpha1.IPPoolFamilyStatus{Capacity: "0", InUse: 2},
			wantIPv6: &v1alpha1.IPPoolFamilyStatus{Capacity: "0", InUse: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := desiredStatus(newIPPool(nil, "192.0.2.0/24"), tc.stats, true, poolspec.Refusal{})
			if !reflect.DeepEqual(st.IPv4, tc.wantIPv4) {
				t.Errorf("IPv4 = %+v, want %+v", st.IPv4, tc.wantIPv4)
			}
			if !reflect.DeepEqual(st.IPv6, tc.wantIPv6) {
				t.Errorf("IPv6 = %+v, want %+v", st.IPv6, tc.wantIPv6)
			}
		})
	}

	t.Run("stale family status is cleared", func(t *testing.T) {
		pool := newIPPool(nil, "192.0.2.0/24")
		pool.Status.IPv6 = &v1alpha1.IPPoolFamilyStatus{Capacity: "16", InUse: 1}
		st := desiredStatus(pool, ipam.PoolStats{IPv4: familyStats(big.NewInt(256), 0)}, true, poolspec.Refusal{})
		if st.IPv6 != nil {
			t.Errorf("IPv6 = %+v, want nil", st.IPv6)
		}
		if pool.Status.IPv6 == nil {
			t.Error("desiredStatus modified the pool's status")
		}
	})
}

func TestDesiredStatusTransitionTime(t *testing.T) {
	old := metav1.NewTime(time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC))
	stats := ipam.PoolStats{IPv4: familyStats(big.NewInt(256), 1)}

	// ready returns the Ready condition of st, failing the test if absent.
	ready := func(t *testing.T, st v1alpha1.IPPoolStatus) metav1.Condition {
		t.Helper()
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
		if c == nil {
			t.Fatalf("no Ready condition in %+v", st.Conditions)
		}
		return *c
	}
	// firstStatus returns pool's status after one desiredStatus call
	// (Ready=True), with the transition time moved back to old.
	firstStatus := func(t *testing.T, pool *v1alpha1.IPPool) v1alpha1.IPPoolStatus {
		t.Helper()
		st := desiredStatus(pool, stats, true, poolspec.Refusal{})
		if len(st.Conditions) != 1 {
			t.Fatalf("got %d conditions, want 1", len(st.Conditions))
		}
		st.Conditions[0].LastTransitionTime = old
		return st
	}

	t.Run("unchanged condition keeps its transition time", func(t *testing.T) {
		pool := newIPPool(nil, "192.0.2.0/24")
		pool.Status = firstStatus(t, pool)
		pool.Generation = 8
		second := desiredStatus(pool, stats, true, poolspec.Refusal{})
		c := ready(t, second)
		if !c.LastTransitionTime.Equal(&old) {
			t.Errorf("LastTransitionTime = %v, want %v", c.LastTransitionTime, old)
		}
		if c.ObservedGeneration != 8 || second.ObservedGeneration != 8 {
			t.Errorf("ObservedGeneration = %d (condition), %d (status), want 8", c.ObservedGeneration, second.ObservedGeneration)
		}
		if !reflect.DeepEqual(second.IPv4, &v1alpha1.IPPoolFamilyStatus{Capacity: "256", InUse: 1}) {
			t.Errorf("IPv4 = %+v", second.IPv4)
		}
	})

	t.Run("same status with a new message keeps its transition time", func(t *testing.T) {
		pool := newIPPool(nil, "192.0.2.0/24")
		st := desiredStatus(pool, ipam.PoolStats{}, false, poolspec.Refusal{Reason: v1alpha1.ReasonOverlap, Message: "overlaps red"})
		st.Conditions[0].LastTransitionTime = old
		pool.Status = st
		second := desiredStatus(pool, ipam.PoolStats{}, false, poolspec.Refusal{Reason: v1alpha1.ReasonInvalidSelector, Message: "bad selector"})
		c := ready(t, second)
		if c.Reason != v1alpha1.ReasonInvalidSelector || c.Message != "bad selector" {
			t.Errorf("condition reason/message = %s/%q, want %s/%q", c.Reason, c.Message, v1alpha1.ReasonInvalidSelector, "bad selector")
		}
		if !c.LastTransitionTime.Equal(&old) {
			t.Errorf("LastTransitionTime = %v, want %v", c.LastTransitionTime, old)
		}
	})

	t.Run("changed condition gets a new transition time", func(t *testing.T) {
		pool := newIPPool(nil, "192.0.2.0/24")
		pool.Status = firstStatus(t, pool)
		second := desiredStatus(pool, ipam.PoolStats{}, false, poolspec.Refusal{Reason: v1alpha1.ReasonOverlap, Message: "overlaps red"})
		c := ready(t, second)
		if c.Status != metav1.ConditionFalse {
			t.Fatalf("Status = %s, want False", c.Status)
		}
		if !old.Before(&c.LastTransitionTime) {
			t.Errorf("LastTransitionTime = %v, want after %v", c.LastTransitionTime, old)
		}
	})

	t.Run("other conditions are kept", func(t *testing.T) {
		pool := newIPPool(nil, "192.0.2.0/24")
		other := metav1.Condition{Type: "Custom", Status: metav1.ConditionTrue, Reason: "X", LastTransitionTime: old}
		pool.Status.Conditions = []metav1.Condition{other}
		st := desiredStatus(pool, stats, true, poolspec.Refusal{})
		if c := meta.FindStatusCondition(st.Conditions, "Custom"); c == nil || !reflect.DeepEqual(*c, other) {
			t.Errorf("Custom condition = %+v, want %+v", c, other)
		}
		if ready(t, st).Status != metav1.ConditionTrue {
			t.Error("Ready is not True")
		}
	})
}
