package ccm

import (
	"fmt"
	"math/big"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ipam"
	"github.com/vipcast/vipcast/poolspec"
)

func holding(svc, ip string, inSpec bool) poolspec.Holding {
	return poolspec.Holding{Service: svc, IP: netip.MustParseAddr(ip), InSpec: inSpec}
}

func TestHoldStatus(t *testing.T) {
	var many []poolspec.Holding
	for i := range 12 {
		many = append(many, holding(fmt.Sprintf("ns/s%02d", i), fmt.Sprintf("192.0.2.%d", i), true))
	}
	tests := []struct {
		name        string
		deleting    bool
		holdings    []poolspec.Holding
		outside     int64
		heldStatus  metav1.ConditionStatus
		heldMsg     []string
		readyReason string // "" when the Ready condition is left alone
		readyMsg    []string
	}{
		{name: "nothing held", heldStatus: metav1.ConditionFalse},
		{name: "all in spec", holdings: []poolspec.Holding{holding("ns/a", "192.0.2.1", true)}, heldStatus: metav1.ConditionFalse},
		{name: "narrowed", holdings: []poolspec.Holding{holding("ns/a", "192.0.2.1", true), holding("ns/b", "198.51.100.1", false)},
			outside: 1, heldStatus: metav1.ConditionTrue, heldMsg: []string{"1 addresses", "198.51.100.1 (ns/b)", "until released"}},
		{name: "narrowed, one address shared by two Services: counted once", holdings: []poolspec.Holding{holding("ns/a", "198.51.100.1", false), holding("ns/b", "198.51.100.1", false)},
			outside: 1, heldStatus: metav1.ConditionTrue, heldMsg: []string{"1 addresses", "198.51.100.1 (ns/a)", "198.51.100.1 (ns/b)"}},
		{name: "deleting, held", deleting: true, holdings: []poolspec.Holding{holding("ns/a", "192.0.2.1", true), holding("ns/a", "2001:db8::1", true)},
			heldStatus: metav1.ConditionFalse, readyReason: v1alpha1.ReasonTerminating, readyMsg: []string{"waits for 1 Service(s)", ": ns/a;"}},
		{name: "deleting, many holders: ten named and a count", deleting: true, holdings: many,
			heldStatus: metav1.ConditionFalse, readyReason: v1alpha1.ReasonTerminating, readyMsg: []string{"12 Service(s)", "ns/s09 and 2 more"}},
		{name: "deleting, nothing held", deleting: true, heldStatus: metav1.ConditionFalse,
			readyReason: v1alpha1.ReasonTerminating, readyMsg: []string{"hands out no new address"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := newIPPool(nil, "192.0.2.0/24")
			if tt.deleting {
				pool.DeletionTimestamp = ptr.To(metav1.Now())
			}
			st := desiredStatus(pool, ipam.PoolStats{IPv4: familyStats(big.NewInt(256), 1)}, true, poolspec.Refusal{})
			holdStatus(&st, pool, tt.holdings)
			if st.HeldOutsideSpec != tt.outside {
				t.Errorf("heldOutsideSpec = %d, want %d", st.HeldOutsideSpec, tt.outside)
			}
			held := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionHeldOutsideSpec)
			if held == nil || held.Status != tt.heldStatus {
				t.Fatalf("HeldOutsideSpec = %+v, want %s", held, tt.heldStatus)
			}
			for _, w := range tt.heldMsg {
				if !strings.Contains(held.Message, w) {
					t.Errorf("HeldOutsideSpec message %q lacks %q", held.Message, w)
				}
			}
			ready := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReady)
			want := tt.readyReason
			if want == "" {
				want = v1alpha1.ReasonValid
			}
			if ready.Reason != want {
				t.Fatalf("Ready reason %s, want %s", ready.Reason, want)
			}
			for _, w := range tt.readyMsg {
				if !strings.Contains(ready.Message, w) {
					t.Errorf("Ready message %q lacks %q", ready.Message, w)
				}
			}
		})
	}
}

func TestFinalizerPatch(t *testing.T) {
	tests := []struct {
		name       string
		finalizers []string
		deleting   bool
		held       bool
		want       string // "" for no patch
	}{
		{name: "added", want: `{"metadata":{"finalizers":["vipcast.io/pool-protection"],"resourceVersion":"5"}}`},
		{name: "added after another one", finalizers: []string{"example.com/x"},
			want: `{"metadata":{"finalizers":["example.com/x","vipcast.io/pool-protection"],"resourceVersion":"5"}}`},
		{name: "present", finalizers: []string{poolspec.Finalizer}, held: true},
		{name: "deleting while held: kept", finalizers: []string{poolspec.Finalizer}, deleting: true, held: true},
		{name: "deleting, nothing held: removed", finalizers: []string{poolspec.Finalizer}, deleting: true,
			want: `{"metadata":{"finalizers":[],"resourceVersion":"5"}}`},
		{name: "deleting, nothing held: only ours removed", finalizers: []string{"example.com/x", poolspec.Finalizer}, deleting: true,
			want: `{"metadata":{"finalizers":["example.com/x"],"resourceVersion":"5"}}`},
		{name: "deleting without ours: never added back", deleting: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := newIPPool(nil, "192.0.2.0/24")
			pool.Finalizers = tt.finalizers
			if tt.deleting {
				pool.DeletionTimestamp = ptr.To(metav1.Now())
			}
			got, err := finalizerPatch(pool, "5", tt.held)
			if err != nil || string(got) != tt.want {
				t.Errorf("finalizerPatch = %s, %v; want %s", got, err, tt.want)
			}
		})
	}
}

func TestPublishedServices(t *testing.T) {
	svc := func(name, pool string, typ v1.ServiceType, class *string, ips ...string) *v1.Service {
		s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Annotations: map[string]string{}},
			Spec: v1.ServiceSpec{Type: typ, LoadBalancerClass: class}}
		if pool != "" {
			s.Annotations[AnnotationPool] = pool
		}
		for _, ip := range ips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
		}
		return s
	}
	got := publishedServices([]*v1.Service{
		svc("b", "blue", v1.ServiceTypeLoadBalancer, nil, "192.0.2.1"),
		func() *v1.Service {
			s := svc("c", "gone", v1.ServiceTypeLoadBalancer, nil, "192.0.2.5")
			s.Annotations[poolspec.AnnotationAllocatedFrom] = "green"
			return s
		}(),
		svc("a", "", v1.ServiceTypeLoadBalancer, nil, "192.0.2.2", "2001:db8::2"),
		svc("pending", "blue", v1.ServiceTypeLoadBalancer, nil),
		svc("foreign", "", v1.ServiceTypeLoadBalancer, ptr.To("example.com/x"), "192.0.2.3"),
		svc("clusterip", "", v1.ServiceTypeClusterIP, nil, "192.0.2.4"),
	})
	want := fmt.Sprint([]poolspec.Published{
		{Service: "ns/a", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("2001:db8::2")}},
		{Service: "ns/b", Pool: "blue", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}},
		{Service: "ns/c", Pool: "green", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.5")}},
	})
	if fmt.Sprint(got) != want {
		t.Errorf("publishedServices = %v, want %v", got, want)
	}
}
