package speaker

import (
	"context"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/bgp"
)

// holdSlice is EndpointSlice ns/s with an endpoint per address, each
// with the given conditions (ready, terminating).
func holdSlice(name string, eps map[string][2]bool) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, AddressType: discoveryv1.AddressTypeIPv4}
	for _, addr := range []string{"10.244.0.1", "10.244.0.2", "10.244.0.3", "10.244.0.4"} {
		c, ok := eps[addr]
		if !ok {
			continue
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(c[0]), Serving: ptr.To(c[0]), Terminating: ptr.To(c[1])}})
	}
	return s
}

// TestHoldReady: of the endpoints ready when the outage began, those the
// slices now call neither ready nor terminating read as ready (serving
// too); one that terminates, a new one, one that was not ready before,
// and the same address in another slice read as they are. The cache's
// objects are not modified; a slice with nothing to mark is returned as
// it is.
func TestHoldReady(t *testing.T) {
	ready := map[endpointRef]struct{}{
		{"ns/a", "10.244.0.1"}: {}, {"ns/a", "10.244.0.2"}: {}, {"ns/a", "10.244.0.3"}: {}, {"ns/c", "10.244.0.1"}: {},
	}
	a := holdSlice("a", map[string][2]bool{
		"10.244.0.1": {false, false}, // held: marked
		"10.244.0.2": {false, true},  // terminating: as it is
		"10.244.0.3": {true, false},  // ready anyway
		"10.244.0.4": {false, false}, // not ready before the outage
	})
	b := holdSlice("b", map[string][2]bool{"10.244.0.1": {false, false}}) // another slice's endpoint
	orig := []*discoveryv1.EndpointSlice{a.DeepCopy(), b.DeepCopy()}
	got, n := holdReady([]*discoveryv1.EndpointSlice{a, b}, ready)
	if n != 1 {
		t.Errorf("marked %d endpoints, want 1", n)
	}
	want := []endpointState{epReady, epDraining, epReady, epExcluded}
	for i, e := range got[0].Endpoints {
		if st := stateOf(&e); st != want[i] {
			t.Errorf("endpoint %s reads as %v, want %v", e.Addresses[0], st, want[i])
		}
	}
	if got[1] != b {
		t.Error("a slice with nothing held was copied")
	}
	if !reflect.DeepEqual(a, orig[0]) || !reflect.DeepEqual(b, orig[1]) {
		t.Error("holdReady modified the cache's objects")
	}
	if got, n := holdReady([]*discoveryv1.EndpointSlice{b}, ready); n != 0 || got[0] != b {
		t.Errorf("nothing held: %d marked, same slice %v", n, got[0] == b)
	}
}

// TestOutageHoldLifecycle: the hold takes the ready endpoints as the
// outage begins, applies while it lasts and for settle after it ends,
// then reads the slices as they are; an outage that begins while the last
// one's hold lasts keeps that hold's set (the caches may hold the node
// monitor's marks by then), and one after it takes a new set.
func TestOutageHoldLifecycle(t *testing.T) {
	clock := time.Unix(1_000_000, 0)
	h := &outageHold{settle: time.Minute, now: func() time.Time { return clock }}
	before := holdSlice("a", map[string][2]bool{"10.244.0.1": {true, false}, "10.244.0.2": {false, false}})
	marked := holdSlice("a", map[string][2]bool{"10.244.0.1": {false, false}, "10.244.0.2": {false, false}})
	held := func() int { _, n := h.apply([]*discoveryv1.EndpointSlice{marked}); return n }

	if n := held(); n != 0 {
		t.Fatalf("before any outage: %d held", n)
	}
	h.begin([]*discoveryv1.EndpointSlice{before})
	clock = clock.Add(3 * time.Minute)
	if n := held(); n != 1 {
		t.Errorf("during the outage: %d held, want 1", n)
	}
	h.end()
	clock = clock.Add(59 * time.Second)
	if n := held(); n != 1 {
		t.Errorf("59s after the return: %d held, want 1", n)
	}
	// A second outage within the settle time keeps the first set, though
	// the caches now hold the marks.
	h.begin([]*discoveryv1.EndpointSlice{marked})
	clock = clock.Add(5 * time.Minute)
	if n := held(); n != 1 {
		t.Errorf("during a second outage: %d held, want 1", n)
	}
	h.end()
	h.end() // a second end does not restart the settle time
	clock = clock.Add(time.Minute)
	if n := held(); n != 0 {
		t.Errorf("settle after the return: %d held, want 0", n)
	}
	// After the hold, a new outage takes a new set: the marked slice's.
	h.begin([]*discoveryv1.EndpointSlice{marked})
	if n := held(); n != 0 {
		t.Errorf("an outage that begins with every endpoint not ready: %d held, want 0", n)
	}
}

// TestControllerOutageHold: an endpoint marked not ready after the API
// server returns (Service a, Cluster policy, its only endpoint) keeps the
// VIP announced while the hold lasts, counted in
// vipcast_speaker_outage_held_endpoints; when the settle time ends, the
// full recompute it queues withdraws the VIP, as the slice says.
func TestControllerOutageHold(t *testing.T) {
	client := fakeServices(1)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	speaker := &flakyBGP{routes: map[netip.Prefix]bgp.Route{}}
	const settle = 2 * time.Second
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: fakePool(t, "10.100.0.0/24"), BGP: speaker,
		Resync: time.Hour, OutageSettle: settle, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Run(ctx) }()
	vip := netip.MustParsePrefix("10.100.0.1/32")
	announced := func() bool { return speaker.prefixes()[vip] }
	state := func() string { return "" }
	eventually(t, "the VIP announced", announced, state)

	c.watch.outageBegins() // contact lost, as the probe calls it
	slice := testSlice("a")
	slice.Endpoints[0].Conditions.Ready = ptr.To(false)
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.outageEnds(ctx) // contact back: the node monitor's marks arrive now
	c.queue.Add(keyConfig)
	eventually(t, "a full sync that reads the endpoint as held", func() bool { return testutil.ToFloat64(m.outageHeld) == 1 }, state)
	if !announced() {
		t.Fatal("the VIP was withdrawn while its only endpoint was held ready")
	}
	eventually(t, "the VIP withdrawn once the settle time is over", func() bool { return !announced() }, state)
	if v := testutil.ToFloat64(m.outageHeld); v != 0 {
		t.Errorf("held endpoints after the settle time: %v, want 0", v)
	}
}
