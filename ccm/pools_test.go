package ccm

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ipam"
)

// newIPPool returns an IPPool named "blue" with the given addresses and
// allocation settings.
func newIPPool(alloc *v1alpha1.IPPoolAllocation, addresses ...string) *v1alpha1.IPPool {
	return &v1alpha1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "blue", Generation: 7},
		Spec:       v1alpha1.IPPoolSpec{Addresses: addresses, Allocation: alloc},
	}
}

func TestPoolFromCRD(t *testing.T) {
	yes, no := true, false
	prio := func(p int32) *int32 { return &p }
	tests := []struct {
		name   string
		modify func(*v1alpha1.IPPool)
		want   ipam.Pool
	}{
		{
			name: "defaults",
			want: ipam.Pool{Name: "blue", Addresses: []string{"192.0.2.0/24"}, AutoAssign: true, Priority: math.MaxInt32},
		},
		{
			name:   "autoAssign true",
			modify: func(p *v1alpha1.IPPool) { p.Spec.AutoAssign = &yes },
			want:   ipam.Pool{Name: "blue", Addresses: []string{"192.0.2.0/24"}, AutoAssign: true, Priority: math.MaxInt32},
		},
		{
			name:   "autoAssign false and avoidBuggyIPs",
			modify: func(p *v1alpha1.IPPool) { p.Spec.AutoAssign, p.Spec.AvoidBuggyIPs = &no, true },
			want:   ipam.Pool{Name: "blue", Addresses: []string{"192.0.2.0/24"}, AvoidBuggyIPs: true, Priority: math.MaxInt32},
		},
		{
			name:   "allocation without priority keeps the lowest precedence",
			modify: func(p *v1alpha1.IPPool) { p.Spec.Allocation = &v1alpha1.IPPoolAllocation{} },
			want:   ipam.Pool{Name: "blue", Addresses: []string{"192.0.2.0/24"}, AutoAssign: true, Priority: math.MaxInt32},
		},
		{
			name:   "priority set",
			modify: func(p *v1alpha1.IPPool) { p.Spec.Allocation = &v1alpha1.IPPoolAllocation{Priority: prio(5)} },
			want:   ipam.Pool{Name: "blue", Addresses: []string{"192.0.2.0/24"}, AutoAssign: true, Priority: 5},
		},
		{
			name:   "priority zero is not unset",
			modify: func(p *v1alpha1.IPPool) { p.Spec.Allocation = &v1alpha1.IPPoolAllocation{Priority: prio(0)} },
			want:   ipam.Pool{Name: "blue", Addresses: []string{"192.0.2.0/24"}, AutoAssign: true, Priority: 0},
		},
		{
			name: "namespaces copied, dual-stack addresses",
			modify: func(p *v1alpha1.IPPool) {
				p.Spec.Addresses = []string{"192.0.2.0/24", "2001:db8::10-2001:db8::ff"}
				p.Spec.Allocation = &v1alpha1.IPPoolAllocation{Namespaces: []string{"shop", "billing"}}
			},
			want: ipam.Pool{
				Name: "blue", Addresses: []string{"192.0.2.0/24", "2001:db8::10-2001:db8::ff"},
				AutoAssign: true, Priority: math.MaxInt32, Namespaces: []string{"shop", "billing"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newIPPool(nil, "192.0.2.0/24")
			if tc.modify != nil {
				tc.modify(p)
			}
			got, err := PoolFromCRD(p)
			if err != nil {
				t.Fatalf("PoolFromCRD: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("PoolFromCRD:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestPoolFromCRDSelectors(t *testing.T) {
	p := newIPPool(&v1alpha1.IPPoolAllocation{
		NamespaceSelectors: []metav1.LabelSelector{
			{MatchLabels: map[string]string{"team": "a"}},
			{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "env", Operator: metav1.LabelSelectorOpIn, Values: []string{"prod", "staging"}},
			}},
		},
		ServiceSelectors: []metav1.LabelSelector{
			{MatchLabels: map[string]string{"expose": "public", "tier": "web"}},
		},
	}, "192.0.2.0/24")
	got, err := PoolFromCRD(p)
	if err != nil {
		t.Fatalf("PoolFromCRD: %v", err)
	}
	if len(got.NamespaceSelectors) != 2 || len(got.ServiceSelectors) != 1 {
		t.Fatalf("got %d namespace and %d service selectors, want 2 and 1", len(got.NamespaceSelectors), len(got.ServiceSelectors))
	}
	tests := []struct {
		name     string
		selector labels.Selector
		labels   labels.Set
		want     bool
	}{
		{"namespace matchLabels matches", got.NamespaceSelectors[0], labels.Set{"team": "a", "other": "x"}, true},
		{"namespace matchLabels wrong value", got.NamespaceSelectors[0], labels.Set{"team": "b"}, false},
		{"namespace matchLabels missing key", got.NamespaceSelectors[0], labels.Set{}, false},
		{"namespace expression matches", got.NamespaceSelectors[1], labels.Set{"env": "staging"}, true},
		{"namespace expression does not match", got.NamespaceSelectors[1], labels.Set{"env": "dev"}, false},
		{"service matchLabels all keys", got.ServiceSelectors[0], labels.Set{"expose": "public", "tier": "web"}, true},
		{"service matchLabels partial", got.ServiceSelectors[0], labels.Set{"expose": "public"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if m := tc.selector.Matches(tc.labels); m != tc.want {
				t.Errorf("%q.Matches(%v) = %v, want %v", tc.selector, tc.labels, m, tc.want)
			}
		})
	}
}

func TestPoolFromCRDErrors(t *testing.T) {
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
			_, err := PoolFromCRD(tc.pool)
			if err == nil {
				t.Fatal("PoolFromCRD: got no error")
			}
			r := rejectionFor(err)
			if r.reason != tc.wantReason {
				t.Errorf("rejectionFor(%q).reason = %q, want %q", err, r.reason, tc.wantReason)
			}
			if r.message != err.Error() {
				t.Errorf("rejectionFor message = %q, want the error's %q", r.message, err)
			}
			for _, s := range tc.wantIn {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}

func withBGP(p *v1alpha1.IPPool, b *v1alpha1.IPPoolBGP) *v1alpha1.IPPool {
	p.Spec.BGP = b
	return p
}

func TestRejectionFor(t *testing.T) {
	selErr := &selectorError{errors.New("spec.allocation.serviceSelectors[0]: bad")}
	tests := []struct {
		name string
		err  error
		want rejection
	}{
		{
			name: "ipam overlap",
			err:  &ipam.Error{Reason: ipam.ReasonOverlap, Msg: "pool blue overlaps pool red"},
			want: rejection{reason: v1alpha1.ReasonOverlap, message: "pool blue overlaps pool red"},
		},
		{
			name: "wrapped ipam overlap",
			err:  fmt.Errorf("spec.addresses: %w", &ipam.Error{Reason: ipam.ReasonOverlap, Msg: "x overlaps y"}),
			want: rejection{reason: v1alpha1.ReasonOverlap, message: "spec.addresses: x overlaps y"},
		},
		{
			name: "ipam invalid",
			err:  &ipam.Error{Reason: ipam.ReasonInvalid, Msg: "bad range"},
			want: rejection{reason: v1alpha1.ReasonInvalidAddresses, message: "bad range"},
		},
		{
			name: "plain error",
			err:  errors.New("something"),
			want: rejection{reason: v1alpha1.ReasonInvalidAddresses, message: "something"},
		},
		{
			name: "selector error",
			err:  selErr,
			want: rejection{reason: v1alpha1.ReasonInvalidSelector, message: selErr.Error()},
		},
		{
			name: "wrapped selector error",
			err:  fmt.Errorf("pool blue: %w", selErr),
			want: rejection{reason: v1alpha1.ReasonInvalidSelector, message: "pool blue: " + selErr.Error()},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := rejectionFor(tc.err); got != tc.want {
				t.Errorf("rejectionFor = %+v, want %+v", got, tc.want)
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
		rej         rejection
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
			rej:         rejection{reason: v1alpha1.ReasonOverlap, message: "overlaps pool red"},
			wantStatus:  metav1.ConditionFalse,
			wantReason:  v1alpha1.ReasonOverlap,
			wantMessage: "overlaps pool red",
		},
		{
			name:        "rejection wins over installed",
			installed:   true,
			rej:         rejection{reason: v1alpha1.ReasonInvalidSelector, message: "bad selector"},
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
			st := desiredStatus(newIPPool(nil, "192.0.2.0/24"), tc.stats, true, rejection{})
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
		st := desiredStatus(pool, ipam.PoolStats{IPv4: familyStats(big.NewInt(256), 0)}, true, rejection{})
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
		st := desiredStatus(pool, stats, true, rejection{})
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
		second := desiredStatus(pool, stats, true, rejection{})
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
		st := desiredStatus(pool, ipam.PoolStats{}, false, rejection{reason: v1alpha1.ReasonOverlap, message: "overlaps red"})
		st.Conditions[0].LastTransitionTime = old
		pool.Status = st
		second := desiredStatus(pool, ipam.PoolStats{}, false, rejection{reason: v1alpha1.ReasonInvalidSelector, message: "bad selector"})
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
		second := desiredStatus(pool, ipam.PoolStats{}, false, rejection{reason: v1alpha1.ReasonOverlap, message: "overlaps red"})
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
		st := desiredStatus(pool, stats, true, rejection{})
		if c := meta.FindStatusCondition(st.Conditions, "Custom"); c == nil || !reflect.DeepEqual(*c, other) {
			t.Errorf("Custom condition = %+v, want %+v", c, other)
		}
		if ready(t, st).Status != metav1.ConditionTrue {
			t.Error("Ready is not True")
		}
	})
}
