package speaker

import (
	"context"
	"net/netip"
	"reflect"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/bgp"
)

// TestHandoverRoutes: the routes a Local Service's node keeps for a
// handover are exactly those withheld because its endpoints all terminate
// and serve while another node's are ready.
func TestHandoverRoutes(t *testing.T) {
	pools, peers := routesConfig()
	view, _ := Compile(pools, peers, testNode())
	slices := func(eps ...ep) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{mkSlice("s", v4, eps...)}
	}
	for _, tc := range []struct {
		name   string
		svc    *v1.Service
		slices []*discoveryv1.EndpointSlice
		want   []bgp.Route
	}{
		{"Local: serving terminating here, ready elsewhere", local(mkSvc("s", "192.0.2.1")),
			slices(ep{node: "n1", ready: no, serving: yes, term: true}, ep{node: "n2", ready: yes}), []bgp.Route{route("192.0.2.1/32")}},
		{"Local: ready here (announced anyway)", local(mkSvc("s", "192.0.2.1")),
			slices(ep{node: "n1", ready: yes}, ep{node: "n2", ready: yes}), nil},
		{"Local: terminating here, no longer serving", local(mkSvc("s", "192.0.2.1")),
			slices(ep{node: "n1", ready: no, serving: no, term: true}, ep{node: "n2", ready: yes}), nil},
		{"Local: serving terminating here, none ready anywhere (announced anyway)", local(mkSvc("s", "192.0.2.1")),
			slices(ep{node: "n1", ready: no, serving: yes, term: true}), nil},
		{"Local: nothing here", local(mkSvc("s", "192.0.2.1")), slices(ep{node: "n2", ready: yes}), nil},
		{"Cluster: no handover", mkSvc("s", "192.0.2.1"),
			slices(ep{node: "n1", ready: no, serving: yes, term: true}, ep{node: "n2", ready: yes}), nil},
		{"Local dual-stack: only the family that terminates here", local(mkSvc("s", "192.0.2.5", "2001:db8::5")),
			[]*discoveryv1.EndpointSlice{mkSlice("s", v4, ep{node: "n1", ready: no, serving: yes, term: true}, ep{node: "n2", ready: yes}), mkSlice("s6", v6, ep{node: "n1"})},
			[]bgp.Route{route("192.0.2.5/32")}},
	} {
		if got := HandoverRoutes(tc.svc, tc.slices, view); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestHandoversKeep: a handover keeps the routes the node announces for
// the delay from its start, not one it did not announce, and starts afresh
// once over.
func TestHandoversKeep(t *testing.T) {
	a, b := route("192.0.2.1/32"), route("192.0.2.2/32")
	t0 := time.Unix(1000, 0)
	h := handovers{delay: 3 * time.Second}
	steps := []struct {
		what         string
		linger, held []bgp.Route
		at           time.Duration
		keep         []bgp.Route
		again        time.Duration
	}{
		{"no handover", nil, []bgp.Route{a}, 0, nil, 0},
		{"starts: the held route stays", []bgp.Route{a, b}, []bgp.Route{a}, 0, []bgp.Route{a}, 3 * time.Second},
		{"within the delay", []bgp.Route{a, b}, []bgp.Route{a}, 2 * time.Second, []bgp.Route{a}, time.Second},
		{"over", []bgp.Route{a, b}, []bgp.Route{a}, 3 * time.Second, nil, 0},
		{"withdrawn: not started again", []bgp.Route{a, b}, nil, 4 * time.Second, nil, 0},
		{"ends when nothing lingers", nil, []bgp.Route{a}, 5 * time.Second, nil, 0},
		{"a new one starts afresh", []bgp.Route{a}, []bgp.Route{a}, 6 * time.Second, []bgp.Route{a}, 3 * time.Second},
	}
	for _, s := range steps {
		keep, again := h.keep("ns/s", s.linger, s.held, t0.Add(s.at))
		if !reflect.DeepEqual(keep, s.keep) || again != s.again {
			t.Errorf("%s: keep %+v again %v, want %+v %v", s.what, keep, again, s.keep, s.again)
		}
	}
	off := handovers{}
	if keep, _ := off.keep("ns/s", []bgp.Route{a}, []bgp.Route{a}, t0); keep != nil {
		t.Errorf("delay 0: keep %+v, want none", keep)
	}
}

// timedBGP is a bgp.Speaker that records when each prefix was last
// withdrawn.
type timedBGP struct {
	mu        sync.Mutex
	routes    map[netip.Prefix]bool
	withdrawn map[netip.Prefix]time.Time
}

func (f *timedBGP) SetPeers(context.Context, []bgp.Peer) error { return nil }

func (f *timedBGP) Apply(_ context.Context, announce []bgp.Route, withdraw []netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range withdraw {
		delete(f.routes, p)
		f.withdrawn[p] = time.Now()
	}
	for _, r := range announce {
		f.routes[r.Prefix] = true
	}
	return nil
}

func (f *timedBGP) Sessions(context.Context) ([]bgp.SessionState, error) { return nil, nil }
func (f *timedBGP) Stop(context.Context) error                           { return nil }

func (f *timedBGP) state(p netip.Prefix) (announced bool, withdrawn time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.routes[p], f.withdrawn[p]
}

// TestControllerLocalHandover: a node whose only endpoint of a Local
// Service starts terminating (serving on) while another node's is ready
// withdraws the VIP no sooner than Options.Handover after it saw the
// change, and does withdraw it; with no handover it withdraws too.
func TestControllerLocalHandover(t *testing.T) {
	vip := netip.MustParsePrefix("10.100.0.1/32")
	for _, handover := range []time.Duration{0, 1500 * time.Millisecond} {
		t.Run(handover.String(), func(t *testing.T) {
			client := fakeServices(1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			svc, err := client.CoreV1().Services("ns").Get(ctx, "a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			svc.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			if _, err := client.CoreV1().Services("ns").Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			slice := testSlice("a")
			slice.Endpoints[0].NodeName = ptr.To("n1")
			if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			engine := &timedBGP{routes: map[netip.Prefix]bool{}, withdrawn: map[netip.Prefix]time.Time{}}
			c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: fakePool(t, "10.100.0.0/24"), BGP: engine, Resync: time.Hour, Handover: handover})
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = c.Run(ctx) }()
			eventually(t, "the VIP announced while n1's endpoint is ready", func() bool {
				on, _ := engine.state(vip)
				return on
			}, func() string { return "not announced" })

			// The rollout: n1's endpoint terminating and serving, n2's ready.
			slice.Endpoints = []discoveryv1.Endpoint{
				{Addresses: []string{"10.244.0.1"}, NodeName: ptr.To("n1"),
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}},
				{Addresses: []string{"10.244.1.1"}, NodeName: ptr.To("n2"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			}
			changed := time.Now()
			if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the VIP withdrawn", func() bool {
				on, _ := engine.state(vip)
				return !on
			}, func() string { return "still announced" })
			_, at := engine.state(vip)
			if took := at.Sub(changed); took < handover {
				t.Errorf("withdrawn %v after the change, want no sooner than the handover, %v", took, handover)
			}
		})
	}
}
