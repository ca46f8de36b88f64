package speaker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/ipvs"
)

// flakyBGP is a bgp.Speaker that holds routes in memory and fails the
// first failures calls to Apply after applying only half of them, as an
// engine error midway would.
type flakyBGP struct {
	mu       sync.Mutex
	routes   map[netip.Prefix]bgp.Route
	failures int
}

func (f *flakyBGP) SetPeers(context.Context, []bgp.Peer) error { return nil }

func (f *flakyBGP) Apply(_ context.Context, announce []bgp.Route, withdraw []netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	fail := f.failures > 0
	if fail {
		f.failures--
		announce, withdraw = announce[:len(announce)/2], withdraw[:len(withdraw)/2]
	}
	for _, p := range withdraw {
		delete(f.routes, p)
	}
	for _, r := range announce {
		f.routes[r.Prefix] = r
	}
	if fail {
		return errors.New("injected failure")
	}
	return nil
}

func (f *flakyBGP) Sessions(context.Context) ([]bgp.SessionState, error) { return nil, nil }
func (f *flakyBGP) Stop(context.Context) error                           { return nil }

func (f *flakyBGP) prefixes() map[netip.Prefix]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[netip.Prefix]bool{}
	for p := range f.routes {
		out[p] = true
	}
	return out
}

// testNodeObject is Node n1 with InternalIP 10.0.0.2.
func testNodeObject() *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "uid-n1"},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "10.0.0.2"}}}}
}

// fakeServices is a fake API with node n1 and n LoadBalancer Services
// a, b, ... with VIPs 10.100.0.1, .2, ... and one ready endpoint each.
func fakeServices(n int) *fake.Clientset {
	objs := []runtime.Object{testNodeObject()}
	for i := range n {
		name := string(rune('a' + i))
		objs = append(objs, testLBService(name, "10.100.0."+string(rune('1'+i))), testSlice(name))
	}
	return fake.NewClientset(objs...)
}

// fakePool is a fake dynamic API serving IPPools and BGPPeers, holding
// IPPool "p" with the given addresses.
func fakePool(t *testing.T, addresses ...string) *dynamicfake.FakeDynamicClient {
	t.Helper()
	return fakePoolPeers(t, nil, addresses...)
}

// fakePoolPeers is fakePool with these BGPPeers too.
func fakePoolPeers(t *testing.T, peers []*vipcastv1alpha1.BGPPeer, addresses ...string) *dynamicfake.FakeDynamicClient {
	t.Helper()
	pool := &vipcastv1alpha1.IPPool{TypeMeta: metav1.TypeMeta{APIVersion: "vipcast.io/v1alpha1", Kind: "IPPool"},
		ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: vipcastv1alpha1.IPPoolSpec{Addresses: addresses}}
	objs := []runtime.Object{pool}
	for _, p := range peers {
		p = p.DeepCopy()
		p.TypeMeta = metav1.TypeMeta{APIVersion: "vipcast.io/v1alpha1", Kind: "BGPPeer"}
		objs = append(objs, p)
	}
	// NodeTunnels stay unstructured (putTunnel), as the speaker writes
	// them: the scheme knows only the kinds given typed.
	scheme := runtime.NewScheme()
	scheme.AddKnownTypes(vipcastv1alpha1.SchemeGroupVersion, &vipcastv1alpha1.IPPool{}, &vipcastv1alpha1.IPPoolList{},
		&vipcastv1alpha1.BGPPeer{}, &vipcastv1alpha1.BGPPeerList{})
	metav1.AddToGroupVersion(scheme, vipcastv1alpha1.SchemeGroupVersion)
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		vipcastv1alpha1.IPPoolsResource:     "IPPoolList",
		vipcastv1alpha1.BGPPeersResource:    "BGPPeerList",
		vipcastv1alpha1.NodeTunnelsResource: "NodeTunnelList",
	}, objs...)
}

// putTunnel creates or replaces node name's NodeTunnel in the fake
// dynamic API, as that node's speaker publishes it, with its addresses
// (IPv4, IPv6 or both).
func putTunnel(t *testing.T, dyn dynamic.Interface, name string, announces bool, addrs ...string) {
	t.Helper()
	u := tunnelObject(name, announces, addrs...)
	res := dyn.Resource(vipcastv1alpha1.NodeTunnelsResource)
	ctx := context.Background()
	if _, err := res.Get(ctx, name, metav1.GetOptions{}); err == nil {
		_, err = res.Update(ctx, u, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	} else if _, err := res.Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// tunnelObject is node name's NodeTunnel, unstructured, with its
// addresses (IPv4, IPv6 or both).
func tunnelObject(name string, announces bool, addrs ...string) *unstructured.Unstructured {
	spec := map[string]any{"announces": announces}
	for _, a := range addrs {
		if netip.MustParseAddr(a).Is4() {
			spec["ipv4"] = a
		} else {
			spec["ipv6"] = a
		}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "vipcast.io/v1alpha1", "kind": "NodeTunnel", "metadata": map[string]any{"name": name}, "spec": spec}}
}

// publishedTunnel returns what node name's NodeTunnel says in the fake
// dynamic API, its owner's UID, and whether it exists.
func publishedTunnel(ctx context.Context, dyn dynamic.Interface, name string) (vipcastv1alpha1.NodeTunnelSpec, string, bool) {
	u, err := dyn.Resource(vipcastv1alpha1.NodeTunnelsResource).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return vipcastv1alpha1.NodeTunnelSpec{}, "", false
	}
	nt := &vipcastv1alpha1.NodeTunnel{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, nt); err != nil {
		return vipcastv1alpha1.NodeTunnelSpec{}, "", false
	}
	var owner string
	for _, o := range nt.OwnerReferences {
		owner += fmt.Sprintf("%s/%s/%s", o.Kind, o.Name, o.UID)
	}
	return nt.Spec, owner, true
}

// TestControllerRecoversFromFailedApply checks that when the BGP engine
// fails midway, the speaker re-applies its whole table: every wanted route
// ends up announced and every unwanted one withdrawn, although its route
// table had already recorded the change.
func TestControllerRecoversFromFailedApply(t *testing.T) {
	client := fakeServices(4)
	dyn := fakePool(t, "10.100.0.0/24")
	engine := &flakyBGP{routes: map[netip.Prefix]bgp.Route{}, failures: 1}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: dyn, BGP: engine, Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Run(ctx) }()

	want := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if got := engine.prefixes(); len(got) == n {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("engine holds %v, want %d routes", engine.prefixes(), n)
	}
	// The first Apply (all four routes) fails halfway; the retry completes.
	want(4)

	// A withdrawal that fails halfway: the node is excluded, so nothing
	// may stay announced.
	engine.mu.Lock()
	engine.failures = 1
	engine.mu.Unlock()
	node := testNodeObject()
	node.Labels = map[string]string{LabelExcludeFromExternalLB: ""}
	if _, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want(0)
}

func testLBService(name, vip string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, Ports: []v1.ServicePort{{Port: 80}}},
		Status:     v1.ServiceStatus{LoadBalancer: v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: vip}}}},
	}
}

func testSlice(svc string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: svc + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: ptr.To[int32](8080), Protocol: ptr.To(v1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.1"}, NodeName: ptr.To("n2"),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}
}

// TestControllerProgramsDataplane checks the dataplane wiring: one full
// Sync with every Service's virtual servers at start-up; an EndpointSlice
// change costs one SyncService for that Service only; a deleted Service
// removes its virtual server; the resync timer compares the whole table
// again.
func TestControllerProgramsDataplane(t *testing.T) {
	client := fakeServices(4)
	dyn := fakePool(t, "10.100.0.0/24")
	dp := &fakeDataplane{}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: dyn, BGP: &flakyBGP{routes: map[netip.Prefix]bgp.Route{}},
		Resync: time.Hour, Dataplane: dp, DataplaneResync: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Run(ctx) }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		eventually(t, what, cond, func() string {
			s, u, d := dp.counts()
			return fmt.Sprintf("syncs %d, service syncs %d, deletes %d", s, u, d)
		})
	}
	waitFor("the start-up Sync", func() bool { s, _, _ := dp.counts(); return s >= 1 })
	dp.mu.Lock()
	first := dp.syncs[0]
	dp.mu.Unlock()
	if len(first.Services) != 4 {
		t.Fatalf("start-up Sync with %d virtual servers, want 4: %v", len(first.Services), first.Services)
	}
	for k, s := range first.Services {
		if len(s.Backends) != 1 || !s.SNAT || k.Port != 80 {
			t.Errorf("virtual server %s = %+v, want port 80, SNAT (Cluster) and one backend", k, s)
		}
	}

	// Stop counting resyncs' effect: an EndpointSlice change of Service a.
	_, before, _ := dp.counts()
	slice := testSlice("a")
	slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.244.0.9"}, NodeName: ptr.To("n3"),
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("a SyncService for Service a", func() bool { _, n, _ := dp.counts(); return n > before })
	time.Sleep(100 * time.Millisecond)
	dp.mu.Lock()
	calls := slices.Clone(dp.service[before:])
	dp.mu.Unlock()
	want := ipvs.Key{VIP: netip.MustParseAddr("10.100.0.1"), Port: 80, Protocol: ipvs.TCP}
	if len(calls) != 1 || calls[0] != want {
		t.Errorf("one EndpointSlice change made SyncService calls %v, want exactly [%v]", calls, want)
	}

	// Deleting Service b removes its virtual server.
	if err := client.CoreV1().Services("ns").Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("the virtual server of b removed", func() bool { _, _, d := dp.counts(); return d == 1 })

	// The timer resyncs the whole table, now without b.
	s0, _, _ := dp.counts()
	waitFor("a periodic resync", func() bool { s, _, _ := dp.counts(); return s > s0 })
	dp.mu.Lock()
	last := dp.syncs[len(dp.syncs)-1]
	dp.mu.Unlock()
	if len(last.Services) != 3 {
		t.Errorf("resync with %d virtual servers, want 3", len(last.Services))
	}
}

// startDataplaneController runs a Controller on node n1 over two fake
// Services with dp as its dataplane, its periodic syncs an hour away and
// its probe every probe, until the test ends; it returns the fake API
// and the Controller's metrics.
func startDataplaneController(t *testing.T, dp *fakeDataplane, probe time.Duration) (*fake.Clientset, *Metrics) {
	t.Helper()
	client := fakeServices(2)
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: fakePool(t, "10.100.0.0/24"), BGP: &flakyBGP{routes: map[netip.Prefix]bgp.Route{}},
		Resync: time.Hour, Dataplane: dp, DataplaneResync: time.Hour, DataplaneProbe: probe, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = c.Run(ctx) }()
	return client, m
}

// TestControllerProbesDataplane: when the dataplane's probe finds a
// programmed virtual server gone (kube-proxy flushed IPVS), the speaker
// resyncs the whole table at once, long before the periodic resync (an
// hour here), counts it and puts a Warning Event on its Node; a probe
// that finds nothing changes nothing.
func TestControllerProbesDataplane(t *testing.T) {
	dp := &fakeDataplane{}
	client, m := startDataplaneController(t, dp, 20*time.Millisecond)
	ctx := t.Context()
	state := func() string {
		dp.mu.Lock()
		defer dp.mu.Unlock()
		return fmt.Sprintf("syncs %d, probes %d, drifted %v", len(dp.syncs), dp.probes, dp.drifted)
	}
	eventually(t, "the start-up Sync and ten probes", func() bool {
		dp.mu.Lock()
		defer dp.mu.Unlock()
		return len(dp.syncs) == 1 && dp.probes >= 10
	}, state)
	if s, _, _ := dp.counts(); s != 1 {
		t.Fatalf("probes that found no drift made %d full Syncs, want only the start-up one", s)
	}

	dp.mu.Lock()
	dp.drifted = true
	dp.mu.Unlock()
	eventually(t, "a full Sync after the probe found drift", func() bool { s, _, _ := dp.counts(); return s == 2 }, state)
	dp.mu.Lock()
	resynced := dp.syncs[1]
	dp.mu.Unlock()
	if len(resynced.Services) != 2 {
		t.Errorf("the resync after drift had %d virtual servers, want both Services'", len(resynced.Services))
	}
	eventually(t, "a DataplaneDrift Warning Event on the Node", func() bool {
		return nodeWarning(ctx, t, client, "n1", func(e v1.Event) bool {
			return e.Reason == "DataplaneDrift" && strings.Contains(e.Message, "kube-proxy")
		})
	}, state)
	if got := testutil.ToFloat64(m.drift); got != 1 {
		t.Errorf("vipcast_ipvs_drift_detected_total = %v, want 1", got)
	}
	time.Sleep(200 * time.Millisecond) // ten more probes, no drift
	if s, _, _ := dp.counts(); s != 2 {
		t.Errorf("%d full Syncs after the repair, want 2 (the drift repaired once)", s)
	}
	if got := testutil.ToFloat64(m.drift); got != 1 {
		t.Errorf("vipcast_ipvs_drift_detected_total = %v after quiet probes, want still 1", got)
	}
}

// TestControllerReportsLostFromServiceSync: when one Service's sync finds
// virtual servers gone (SyncService's second kernel read, after a change
// the kernel refused because another program had removed them), the
// speaker reports it like a probe's finding and runs a full resync at
// once for the others, which that read dropped from the dataplane's
// in-memory state: with the periodic resync and the probe an hour away,
// nothing else would put them back.
func TestControllerReportsLostFromServiceSync(t *testing.T) {
	dp := &fakeDataplane{}
	client, m := startDataplaneController(t, dp, time.Hour)
	ctx := t.Context()
	state := func() string {
		s, u, d := dp.counts()
		return fmt.Sprintf("syncs %d, service syncs %d, deletes %d", s, u, d)
	}
	eventually(t, "the start-up Sync", func() bool { s, _, _ := dp.counts(); return s == 1 }, state)
	if got := testutil.ToFloat64(m.drift); got != 0 {
		t.Fatalf("vipcast_ipvs_drift_detected_total = %v after the start-up Sync, want 0", got)
	}

	a := ipvs.Key{VIP: netip.MustParseAddr("10.100.0.1"), Port: 80, Protocol: ipvs.TCP}
	b := ipvs.Key{VIP: netip.MustParseAddr("10.100.0.2"), Port: 80, Protocol: ipvs.TCP}
	dp.mu.Lock()
	dp.lostOnService = []ipvs.Key{a, b}
	dp.mu.Unlock()
	slice := testSlice("a")
	slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.244.0.9"}, NodeName: ptr.To("n3"),
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a full Sync after Service a's sync found a and b gone", func() bool { s, _, _ := dp.counts(); return s == 2 }, state)
	eventually(t, "a DataplaneDrift Warning Event on the Node", func() bool {
		return nodeWarning(ctx, t, client, "n1", func(e v1.Event) bool { return e.Reason == "DataplaneDrift" })
	}, state)
	if got := testutil.ToFloat64(m.drift); got != 1 {
		t.Errorf("vipcast_ipvs_drift_detected_total = %v, want 1", got)
	}
	time.Sleep(100 * time.Millisecond)
	if s, _, _ := dp.counts(); s != 2 {
		t.Errorf("%d full Syncs, want 2: the start-up one and one for the lost virtual servers", s)
	}
}

// TestControllerAnnouncesOnlyOnceTheDataplaneWorks checks that a speaker
// whose dataplane fails at start-up announces nothing and is not ready
// until the dataplane has been programmed: routes to a node that cannot
// forward would black-hole traffic.
func TestControllerAnnouncesOnlyOnceTheDataplaneWorks(t *testing.T) {
	client := fakeServices(1)
	dyn := fakePool(t, "10.100.0.0/24")
	dp := &fakeDataplane{failSyncs: 2}
	engine := &flakyBGP{routes: map[netip.Prefix]bgp.Route{}}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: dyn, BGP: engine,
		Resync: time.Hour, Dataplane: dp, DataplaneResync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Run(ctx) }()

	deadline := time.Now().Add(10 * time.Second)
	for {
		d := func() int { dp.mu.Lock(); defer dp.mu.Unlock(); return dp.failSyncs }()
		routes := len(engine.prefixes())
		if d > 0 && (routes > 0 || c.HasSynced()) {
			t.Fatalf("with the dataplane failing: %d routes announced, ready %v; want none and not ready", routes, c.HasSynced())
		}
		if d == 0 && routes == 1 && c.HasSynced() {
			return // programmed, then announced
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the dataplane recovered: %d routes, ready %v; want 1 and ready", routes, c.HasSynced())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestControllerServiceRefusedByDataplane checks that a Service whose
// virtual server the kernel refuses fails alone: on a fresh start the
// other Services are programmed and announced and the speaker is ready;
// the refused one is not announced, has a Warning Event naming the node and
// the kernel's reason and is counted by vipcast_speaker_service_errors;
// once its annotation is fixed it is programmed and announced.
func TestControllerServiceRefusedByDataplane(t *testing.T) {
	client := fakeServices(4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	setScheduler(ctx, t, client, "d", "sed")
	dp := &fakeDataplane{refuse: "sed"}
	engine := &flakyBGP{routes: map[netip.Prefix]bgp.Route{}}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: fakePool(t, "10.100.0.0/24"), BGP: engine,
		Resync: time.Hour, Dataplane: dp, DataplaneResync: time.Hour, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	badPrefix := netip.MustParsePrefix("10.100.0.4/32")
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		eventually(t, what, cond, func() string { return fmt.Sprintf("ready %v, routes %v", c.HasSynced(), engine.prefixes()) })
	}
	waitFor("three Services announced and the speaker ready", func() bool { return c.HasSynced() && len(engine.prefixes()) == 3 })
	waitFor("a Warning Event on the refused Service", func() bool {
		return hasWarning(ctx, t, client, "d", "DataplaneRefused", "node n1", "not available in this kernel")
	})
	time.Sleep(200 * time.Millisecond) // retries of d must not announce it
	if got := engine.prefixes(); got[badPrefix] || len(got) != 3 {
		t.Errorf("routes %v, want 10.100.0.1-3 and not the refused 10.100.0.4", got)
	}
	if got := testutil.ToFloat64(m.serviceErrors.WithLabelValues(reasonScheduler)); got != 1 {
		t.Errorf("vipcast_speaker_service_errors{reason=%q} = %v, want 1", reasonScheduler, got)
	}

	setScheduler(ctx, t, client, "d", "rr")
	waitFor("the fixed Service programmed and announced", func() bool { return dp.has("10.100.0.4") && engine.prefixes()[badPrefix] })
	if got := testutil.ToFloat64(m.serviceErrors.WithLabelValues(reasonScheduler)); got != 0 {
		t.Errorf("vipcast_speaker_service_errors{reason=%q} = %v after the fix, want 0", reasonScheduler, got)
	}

	// On the running speaker, Service a now asks for the refused
	// scheduler: its route is withdrawn, the others stay.
	setScheduler(ctx, t, client, "a", "sed")
	aPrefix := netip.MustParsePrefix("10.100.0.1/32")
	waitFor("Service a withdrawn once refused", func() bool { got := engine.prefixes(); return !got[aPrefix] && len(got) == 3 })
}

// TestControllerRetriesRefusedService checks that a Service the dataplane
// refused is retried on its own, without any change in the API: once the
// kernel accepts it (say, the scheduler's module was loaded on the host),
// it is programmed and announced.
func TestControllerRetriesRefusedService(t *testing.T) {
	_, c, dp, engine := startRefusing(t, 2, "b", "sed", "sed")
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		eventually(t, what, cond, func() string { return fmt.Sprintf("ready %v, routes %v", c.HasSynced(), engine.prefixes()) })
	}
	waitFor("Service a announced and the speaker ready", func() bool { return c.HasSynced() && len(engine.prefixes()) == 1 })
	dp.mu.Lock()
	dp.refuse = "none" // the kernel has the scheduler now
	dp.mu.Unlock()
	waitFor("the refused Service retried, programmed and announced", func() bool {
		return dp.has("10.100.0.2") && engine.prefixes()[netip.MustParsePrefix("10.100.0.2/32")]
	})
}

// TestControllerTwoTier checks the two-tier wiring with TunnelPrefix: the
// speaker publishes its node's NodeTunnel (its address, that it announces,
// owned by its Node), reads the other nodes' NodeTunnels, routes their
// tunnel addresses through their addresses, and programs tier 1 over the
// nodes hosting endpoints (tier 2: this node's); a node joining adds its
// route, and a Service's endpoint there adds it to tier 1. The connection
// sync relay's peers follow the other nodes' addresses. Its NodeTunnel,
// deleted or changed by someone else, is put back.
func TestControllerTwoTier(t *testing.T) {
	client := fakeServices(1) // Service a, VIP 10.100.0.1, one endpoint on n2
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dyn := fakePoolPeers(t, []*vipcastv1alpha1.BGPPeer{mkPeer("tor", "10.0.0.254", nil)}, "10.100.0.0/24")
	putTunnel(t, dyn, "n2", true, "10.0.0.3")
	dp := &fakeDataplane{}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: dyn, BGP: &flakyBGP{routes: map[netip.Prefix]bgp.Route{}},
		Resync: time.Hour, Dataplane: dp, DataplaneResync: 300 * time.Millisecond, TunnelPrefix: netip.MustParsePrefix("100.127.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	a := netip.MustParseAddr
	key := ipvs.Key{VIP: a("10.100.0.1"), Port: 80, Protocol: ipvs.TCP}
	tier1 := func(st ipvs.State) string { return fmt.Sprint(st.Services[key].Backends) }
	eventually(t, "the routes and tier 1 over n2", func() bool {
		st, r := dp.last()
		return reflect.DeepEqual(r, map[netip.Addr]netip.Addr{a("100.127.0.3"): a("10.0.0.3")}) &&
			tier1(st) == "[100.127.0.3:80 w1 ipip]" && !st.Services[key].SNAT && len(st.Services[key].Local) == 0 &&
			dp.syncPeers() == "[10.0.0.3]"
	}, func() string {
		st, r := dp.last()
		return fmt.Sprintf("routes %v, virtual server %+v, sync peers %s", r, st.Services[key], dp.syncPeers())
	})

	published := func() string {
		spec, owner, ok := publishedTunnel(ctx, dyn, "n1")
		return fmt.Sprintf("%+v owner %s exists %v", spec, owner, ok)
	}
	const want = "{IPv4:10.0.0.2 IPv6: Announces:true} owner Node/n1/uid-n1 exists true"
	eventually(t, "n1's NodeTunnel", func() bool { return published() == want },
		func() string { return published() + ", want " + want })

	// Node n3 joins, and Service a gets an endpoint there and one here.
	putTunnel(t, dyn, "n3", true, "10.0.0.4")
	slice := testSlice("a")
	for _, ep := range []struct{ addr, node string }{{"10.244.1.1", "n3"}, {"10.244.2.1", "n1"}} {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{ep.addr}, NodeName: ptr.To(ep.node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	}
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n3's route and tier 1 over three nodes", func() bool {
		st, r := dp.last()
		return len(r) == 2 && r[a("100.127.0.4")] == a("10.0.0.4") &&
			tier1(st) == "[100.127.0.2:80 w1 ipip 100.127.0.3:80 w1 ipip 100.127.0.4:80 w1 ipip]" &&
			fmt.Sprint(st.Services[key].Local) == "[10.244.2.1:8080 w1]" && dp.syncPeers() == "[10.0.0.3 10.0.0.4]"
	}, func() string {
		st, r := dp.last()
		return fmt.Sprintf("routes %v, virtual server %+v, sync peers %s", r, st.Services[key], dp.syncPeers())
	})

	// Someone changes n1's NodeTunnel, then deletes it: it is put back.
	putTunnel(t, dyn, "n1", false, "10.9.9.9")
	eventually(t, "n1's NodeTunnel put back after a change", func() bool { return published() == want },
		func() string { return published() + ", want " + want })
	if err := dyn.Resource(vipcastv1alpha1.NodeTunnelsResource).Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n1's NodeTunnel put back after a delete", func() bool { return published() == want },
		func() string { return published() + ", want " + want })
}

// TestControllerRelayFollowsAnnouncers: with two tiers, the relay's peers
// are the other nodes whose NodeTunnel says they announce, and they
// follow those (a node starting to announce, one stopping, which syncs no
// Service), this node's labels (unlabelled, it announces nothing,
// exchanges nothing and publishes so) and the BGPPeers.
func TestControllerRelayFollowsAnnouncers(t *testing.T) {
	client := fakeServices(1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n1, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setLabels := func(n *v1.Node, lbls map[string]string) {
		t.Helper()
		n = n.DeepCopy()
		n.Labels = lbls
		if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	edge := map[string]string{"role": "edge"}
	setLabels(n1, edge)
	peer := mkPeer("tor", "10.0.0.254", nil)
	peer.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: edge}
	dp := &fakeDataplane{}
	dyn := fakePoolPeers(t, []*vipcastv1alpha1.BGPPeer{peer}, "10.100.0.0/24")
	putTunnel(t, dyn, "n2", true, "10.0.0.3")
	putTunnel(t, dyn, "n3", false, "10.0.0.4")
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: dyn,
		BGP: &flakyBGP{routes: map[netip.Prefix]bgp.Route{}}, Resync: time.Hour, Dataplane: dp, DataplaneResync: time.Hour,
		TunnelPrefix: netip.MustParsePrefix("100.127.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	serviceSyncs := func() int {
		dp.mu.Lock()
		defer dp.mu.Unlock()
		return len(dp.service)
	}
	for _, step := range []struct {
		name      string
		change    func()
		want      string
		announces bool // what n1 publishes
	}{
		{"the announcing nodes", func() {}, "[10.0.0.3]", true},
		{"n3 announces", func() { putTunnel(t, dyn, "n3", true, "10.0.0.4") }, "[10.0.0.3 10.0.0.4]", true},
		{"n2 stops announcing", func() { putTunnel(t, dyn, "n2", false, "10.0.0.3") }, "[10.0.0.4]", true},
		{"this node unlabelled", func() { setLabels(n1, nil) }, "[]", false},
		{"this node labelled again", func() { setLabels(n1, edge) }, "[10.0.0.4]", true},
		{"the BGPPeer selects no node", func() {
			res := dyn.Resource(vipcastv1alpha1.BGPPeersResource)
			u, err := res.Get(ctx, "tor", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := unstructured.SetNestedStringMap(u.Object, map[string]string{"role": "none"}, "spec", "nodeSelector", "matchLabels"); err != nil {
				t.Fatal(err)
			}
			u.SetGeneration(u.GetGeneration() + 1) // as the API server does on a spec change

			if _, err := res.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}, "[]", false},
	} {
		before := serviceSyncs()
		step.change()
		eventually(t, step.name, func() bool {
			spec, _, _ := publishedTunnel(ctx, dyn, "n1")
			return dp.syncPeers() == step.want && spec.Announces == step.announces
		}, func() string {
			spec, _, _ := publishedTunnel(ctx, dyn, "n1")
			return fmt.Sprintf("sync peers %s, want %s; n1 publishes %+v, want announces %v", dp.syncPeers(), step.want, spec, step.announces)
		})
		if step.name == "n2 stops announcing" {
			// n2 hosts Service a's endpoint: whether it announces changes
			// no Service's virtual servers, so none is synced for it.
			time.Sleep(200 * time.Millisecond)
			if got := serviceSyncs() - before; got != 0 {
				t.Errorf("%s: %d SyncService calls, want none (Announces alone)", step.name, got)
			}
		}
	}
}

// TestControllerNodeChangeScoped: with two tiers, a node that joins or
// leaves (its NodeTunnel comes or goes) changes the tunnel routes, the relay's peers and the tier 1 of
// the Services with endpoints on it, one SyncService each, and nothing
// else: no full sync of every Service (the periodic ones an hour away).
func TestControllerNodeChangeScoped(t *testing.T) {
	client := fakeServices(3) // Services a, b, c; VIPs 10.100.0.1-3; one endpoint each on n2
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dyn := fakePoolPeers(t, []*vipcastv1alpha1.BGPPeer{mkPeer("tor", "10.0.0.254", nil)}, "10.100.0.0/24")
	putTunnel(t, dyn, "n2", true, "10.0.0.3")
	sb := testSlice("b") // b's endpoint on n4, a node not there yet
	sb.Endpoints[0].NodeName = ptr.To("n4")
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, sb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	dp := &fakeDataplane{}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: dyn, BGP: &flakyBGP{routes: map[netip.Prefix]bgp.Route{}},
		Resync: time.Hour, Dataplane: dp, DataplaneResync: time.Hour, TunnelPrefix: netip.MustParsePrefix("100.127.0.0/16"), Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	a := netip.MustParseAddr
	vs := func(vip string) ipvs.Key { return ipvs.Key{VIP: a(vip), Port: 80, Protocol: ipvs.TCP} }
	// Full recomputes of every Service, and node-scoped ones.
	recomputes := func(kind string) uint64 {
		h, ok := m.syncSeconds.WithLabelValues(kind).(prometheus.Histogram)
		if !ok {
			return 0
		}
		var pb dto.Metric
		_ = h.Write(&pb)
		return pb.GetHistogram().GetSampleCount()
	}
	state := func() string {
		dp.mu.Lock()
		defer dp.mu.Unlock()
		return fmt.Sprintf("syncs %d, service syncs %v, routes %v, sync peers %v, b %+v", len(dp.syncs), dp.service, dp.routes, dp.peers, dp.desired[vs("10.100.0.2")])
	}
	eventually(t, "the first full sync, b without tier 1", func() bool {
		st, r := dp.last()
		return len(st.Services) == 3 && len(st.Services[vs("10.100.0.2")].Backends) == 0 && len(r) == 1
	}, state)
	calls := func() (syncs int, services []ipvs.Key) {
		dp.mu.Lock()
		defer dp.mu.Unlock()
		return len(dp.syncs), slices.Clone(dp.service)
	}
	time.Sleep(200 * time.Millisecond) // the Services' own keys, queued at start, find nothing to change
	syncs0, before := calls()
	configs := recomputes("config")

	putTunnel(t, dyn, "n4", true, "10.0.0.5")
	eventually(t, "n4's route and b's tier 1 through n4", func() bool {
		_, r := dp.last()
		dp.mu.Lock()
		b := dp.desired[vs("10.100.0.2")]
		dp.mu.Unlock()
		return r[a("100.127.0.5")] == a("10.0.0.5") && fmt.Sprint(b.Backends) == "[100.127.0.5:80 w1 ipip]" && dp.syncPeers() == "[10.0.0.3 10.0.0.5]"
	}, state)
	time.Sleep(200 * time.Millisecond)
	syncs, after := calls()
	if got := after[len(before):]; syncs != syncs0 || !slices.Equal(got, []ipvs.Key{vs("10.100.0.2")}) {
		t.Errorf("n4 joined: %d full syncs and SyncService calls %v, want none and [b's]", syncs-syncs0, got)
	}
	if n, scoped := recomputes("config")-configs, recomputes("nodes"); n != 0 || scoped != 1 {
		t.Errorf("n4 joined: %d recomputes of every Service and %d node-scoped ones, want 0 and 1", n, scoped)
	}

	// n2's Node deleted: the garbage collector deletes its NodeTunnel.
	if err := dyn.Resource(vipcastv1alpha1.NodeTunnelsResource).Delete(ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "n2's route gone, a's and c's tier 1 without it", func() bool {
		_, r := dp.last()
		dp.mu.Lock()
		defer dp.mu.Unlock()
		return len(r) == 1 && len(dp.desired[vs("10.100.0.1")].Backends) == 0 && len(dp.desired[vs("10.100.0.3")].Backends) == 0
	}, state)
	time.Sleep(200 * time.Millisecond)
	syncs2, after2 := calls()
	got := after2[len(after):]
	slices.SortFunc(got, func(x, y ipvs.Key) int { return strings.Compare(x.String(), y.String()) })
	if syncs2 != syncs || !slices.Equal(got, []ipvs.Key{vs("10.100.0.1"), vs("10.100.0.3")}) {
		t.Errorf("n2 left: %d full syncs and SyncService calls %v, want none and [a's c's]", syncs2-syncs, got)
	}
	if n := recomputes("config") - configs; n != 0 {
		t.Errorf("n2 left: %d recomputes of every Service, want 0", n)
	}
}

// TestControllerTier1Readiness: with SpeakerService, tier 1 gives weight 0
// to a node whose speaker has no ready endpoint of that Service (it took
// 2/3 of the new flows before, with no speaker to decapsulate them), takes
// it back when its speaker's endpoint turns ready, drops it again when the
// endpoint goes not ready, and ignores an EndpointSlice the EndpointSlice
// controller does not manage.
func TestControllerTier1Readiness(t *testing.T) {
	client := fakeServices(1) // Service a, VIP 10.100.0.1, one endpoint on n2
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dyn := fakePool(t, "10.100.0.0/24")
	putTunnel(t, dyn, "n2", true, "10.0.0.3")
	putTunnel(t, dyn, "n3", true, "10.0.0.4")
	slice := testSlice("a") // endpoints on n2 and n3
	slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.244.1.1"}, NodeName: ptr.To("n3"),
		Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
	if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The speakers' Service: n2's speaker is ready, n3 has none yet.
	// speakers is the speakers' slice with an endpoint per node of
	// state: "ready", "unready", or "terminating" (a pod being deleted, as
	// in a rollout: not ready, not serving, terminating).
	speakers := func(name string, managed bool, state map[string]string) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "vipcast", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "speakers"}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		if managed {
			s.Labels[discoveryv1.LabelManagedBy] = managedByController
		}
		for _, node := range slices.Sorted(maps.Keys(state)) {
			cond := discoveryv1.EndpointConditions{Ready: ptr.To(state[node] == "ready"), Serving: ptr.To(state[node] == "ready")}
			if state[node] == "terminating" {
				cond.Terminating = ptr.To(true)
			}
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.0.0.9"}, NodeName: ptr.To(node), Conditions: cond})
		}
		return s
	}
	sl := client.DiscoveryV1().EndpointSlices("vipcast")
	if _, err := sl.Create(ctx, speakers("speakers-1", true, map[string]string{"n2": "ready"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dp := &fakeDataplane{}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: dyn, BGP: &flakyBGP{routes: map[netip.Prefix]bgp.Route{}},
		Resync: time.Hour, Dataplane: dp, DataplaneResync: 100 * time.Millisecond, TunnelPrefix: netip.MustParsePrefix("100.127.0.0/16"),
		SpeakerService: "vipcast/speakers"}) // dp.last is the last resync's state
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	key := ipvs.Key{VIP: netip.MustParseAddr("10.100.0.1"), Port: 80, Protocol: ipvs.TCP}
	waitTier1 := func(what, want string) {
		t.Helper()
		eventually(t, what, func() bool {
			st, _ := dp.last()
			return fmt.Sprint(st.Services[key].Backends) == want
		}, func() string {
			st, _ := dp.last()
			return fmt.Sprintf("tier 1 %v, want %s", st.Services[key].Backends, want)
		})
	}
	waitTier1("n3 without a speaker drained", "[100.127.0.3:80 w1 ipip 100.127.0.4:80 w0 ipip]")

	// A slice someone wrote by hand does not make n3 ready.
	if _, err := sl.Create(ctx, speakers("forged", false, map[string]string{"n3": "ready"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// n3's speaker turns ready: its endpoint in the managed slice.
	if _, err := sl.Update(ctx, speakers("speakers-1", true, map[string]string{"n2": "ready", "n3": "unready"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTier1("n3 still drained (endpoint not ready, forged slice ignored)", "[100.127.0.3:80 w1 ipip 100.127.0.4:80 w0 ipip]")
	if _, err := sl.Update(ctx, speakers("speakers-1", true, map[string]string{"n2": "ready", "n3": "ready"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTier1("n3 ready takes flows", "[100.127.0.3:80 w1 ipip 100.127.0.4:80 w1 ipip]")

	// n2's speaker terminates (a rollout, a SIGTERM): it withdraws its
	// routes while its kernel state stays, so n2 keeps its weight until
	// its endpoint is gone: a flow the ToR sent to n2 just before it
	// withdrew, and moves here, still goes to the node n2 picked.
	if _, err := sl.Update(ctx, speakers("speakers-1", true, map[string]string{"n2": "terminating", "n3": "ready"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The change is seen when the informer passes it on: wait for a
	// resync after it, then check n2 kept its weight.
	eventually(t, "the terminating slice in the cache", func() bool {
		obj, ok, _ := c.watch.slices.GetIndexer().GetByKey("vipcast/speakers-1")
		s, _ := obj.(*discoveryv1.EndpointSlice)
		return ok && len(s.Endpoints) == 2 && s.Endpoints[0].Conditions.Terminating != nil
	}, func() string { return "n2's speaker endpoint not terminating in the cache" })
	time.Sleep(300 * time.Millisecond) // three dataplane resyncs
	waitTier1("n2 terminating keeps its weight", "[100.127.0.3:80 w1 ipip 100.127.0.4:80 w1 ipip]")

	// n2's speaker goes away (its pod deleted: its endpoint too).
	if _, err := sl.Update(ctx, speakers("speakers-1", true, map[string]string{"n3": "ready"}), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTier1("n2 drained", "[100.127.0.3:80 w0 ipip 100.127.0.4:80 w1 ipip]")

	// Neither ready: both keep their weight rather than refuse every flow.
	// The forged slice still says n3 is ready: were it read, n2 alone
	// would drain here.
	if err := sl.Delete(ctx, "speakers-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitTier1("fallback to the unready nodes", "[100.127.0.3:80 w1 ipip 100.127.0.4:80 w1 ipip]")
}

// TestControllerTwoTierIPv6: with TunnelPrefix, an IPv6 VIP goes through
// the two tiers (tier 1 over the nodes' IPv4 tunnel addresses, no SNAT)
// when the Dataplane's TwoTierIPv6 says so, and keeps one tier with SNAT
// otherwise; with TunnelPrefix6 its tier 1 goes over the nodes' IPv6
// tunnel addresses, routed through their IPv6 addresses. The IPv4 VIP goes
// through two tiers either way.
func TestControllerTwoTierIPv6(t *testing.T) {
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name    string
		on      bool
		prefix6 string
		want6   string
		routes  map[netip.Addr]netip.Addr
	}{
		{name: "TwoTierIPv6=true", on: true, want6: "[100.127.0.3:80 w1 ipip] SNAT false",
			routes: map[netip.Addr]netip.Addr{a("100.127.0.3"): a("10.0.0.3")}},
		{name: "TwoTierIPv6=false", want6: "[[fd00:244::1]:8080 w1] SNAT true",
			routes: map[netip.Addr]netip.Addr{a("100.127.0.3"): a("10.0.0.3")}},
		{name: "IPv6 tunnel addresses", on: true, prefix6: "fd00:7f::/64", want6: "[[fd00:7f::3]:80 w1 ipip] SNAT false",
			routes: map[netip.Addr]netip.Addr{a("100.127.0.3"): a("10.0.0.3"), a("fd00:7f::3"): a("fd00:10::3")}},
		// A node whose Dataplane cannot take IPv6 tunnel addresses: one
		// tier, and a Warning Event on its Node.
		{name: "IPv6 tunnel addresses refused", prefix6: "fd00:7f::/64", want6: "[[fd00:244::1]:8080 w1] SNAT true",
			routes: map[netip.Addr]netip.Addr{a("100.127.0.3"): a("10.0.0.3"), a("fd00:7f::3"): a("fd00:10::3")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slice6 := testSlice("v")
			slice6.AddressType = discoveryv1.AddressTypeIPv6
			slice6.Endpoints[0].Addresses = []string{"fd00:244::1"}
			client := fake.NewClientset(testNodeObject(), testLBService("a", "10.100.0.1"), testSlice("a"),
				testLBService("v", "2001:db8:100::1"), slice6)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			dp := &fakeDataplane{twoTierIPv6: tc.on}
			if !tc.on {
				dp.no6 = errors.New("connection sync is on")
			}
			dyn := fakePool(t, "10.100.0.0/24", "2001:db8:100::/64")
			putTunnel(t, dyn, "n2", true, "10.0.0.3", "fd00:10::3")
			opts := Options{NodeName: "n1", Client: client, Dynamic: dyn,
				BGP: &flakyBGP{routes: map[netip.Prefix]bgp.Route{}}, Resync: time.Hour, Dataplane: dp,
				DataplaneResync: 300 * time.Millisecond, TunnelPrefix: netip.MustParsePrefix("100.127.0.0/16")}
			if tc.prefix6 != "" {
				opts.TunnelPrefix6 = netip.MustParsePrefix(tc.prefix6)
			}
			c, err := NewController(opts)
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = c.Run(ctx) }()
			key4 := ipvs.Key{VIP: a("10.100.0.1"), Port: 80, Protocol: ipvs.TCP}
			key6 := ipvs.Key{VIP: a("2001:db8:100::1"), Port: 80, Protocol: ipvs.TCP}
			show := func(s ipvs.Service) string { return fmt.Sprintf("%v SNAT %v", s.Backends, s.SNAT) }
			eventually(t, "the IPv4 VIP on two tiers, the IPv6 VIP as TwoTierIPv6 says, the routes", func() bool {
				st, r := dp.last()
				return show(st.Services[key4]) == "[100.127.0.3:80 w1 ipip] SNAT false" && show(st.Services[key6]) == tc.want6 &&
					maps.Equal(r, tc.routes)
			}, func() string {
				st, r := dp.last()
				return fmt.Sprintf("IPv4 %s, IPv6 %s, want %s; routes %v, want %v", show(st.Services[key4]), show(st.Services[key6]), tc.want6, r, tc.routes)
			})
			if tc.prefix6 != "" && !tc.on {
				eventually(t, "a Warning Event on the Node saying IPv6 VIPs keep one tier, and why", func() bool {
					return nodeWarning(ctx, t, client, "n1", func(e v1.Event) bool {
						return strings.Contains(e.Message, "IPv6 VIPs keep one tier on this node, and flows the other nodes send to its IPv6 endpoints are lost: connection sync is on")
					})
				}, func() string { return "" })
			}
		})
	}
}

// TestControllerConnSyncProblem: a Dataplane running without the sync
// daemons it was asked for still gets its virtual servers, and the speaker
// puts a Warning Event on its Node that names the flag, the consequence
// and the kernel's reason.
func TestControllerConnSyncProblem(t *testing.T) {
	client := fakeServices(1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dp := &fakeDataplane{connSyncProblem: errors.New("connection sync: link nosuch0: Link not found (name the link to the other nodes, or turn connection sync off)")}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: fakePool(t, "10.100.0.0/24"), BGP: &flakyBGP{routes: map[netip.Prefix]bgp.Route{}},
		Resync: time.Hour, Dataplane: dp, DataplaneResync: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(ctx) }()
	key := ipvs.Key{VIP: netip.MustParseAddr("10.100.0.1"), Port: 80, Protocol: ipvs.TCP}
	eventually(t, "the virtual server programmed", func() bool {
		dp.mu.Lock()
		defer dp.mu.Unlock()
		if len(dp.syncs) == 0 {
			return false
		}
		_, ok := dp.syncs[len(dp.syncs)-1].Services[key]
		return ok
	}, func() string { return "" })
	eventually(t, "a Warning Event on the Node naming --conn-sync-interface and nosuch0", func() bool {
		return nodeWarning(ctx, t, client, "n1", func(e v1.Event) bool {
			return strings.Contains(e.Message, "--conn-sync-interface") && strings.Contains(e.Message, "serves without them") &&
				strings.Contains(e.Message, "nosuch0")
		})
	}, func() string { return "" })
}

// nodeWarning reports whether client holds a Warning Event on Node node
// that match accepts.
func nodeWarning(ctx context.Context, t *testing.T, client *fake.Clientset, node string, match func(v1.Event) bool) bool {
	t.Helper()
	evs, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == node && e.Type == v1.EventTypeWarning && match(e) {
			return true
		}
	}
	return false
}

// TestRelayMetrics: the relay's counters are read at each scrape, by
// direction, and a speaker without a relay has no samples.
func TestRelayMetrics(t *testing.T) {
	const name = "vipcast_ipvs_conn_sync_relay_messages_total"
	stats, on := ipvs.RelayStats{Sent: 4, Received: 3, Dropped: 1,
		DroppedBy: map[string]uint64{ipvs.SyncDropBadMAC: 1}, DroppedConns: map[string]uint64{ipvs.SyncDropUnknownTarget: 2}, ClampedConns: 3}, true
	reg := prometheus.NewRegistry()
	if err := RegisterRelayMetrics(reg, func() (ipvs.RelayStats, bool) { return stats, on }); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(reg, name); err != nil || len(problems) != 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	stats.Received = 5 // read again at the next scrape
	want := fmt.Sprintf(`# HELP %[1]s %[2]s
# TYPE %[1]s counter
%[1]s{direction="dropped"} 1
%[1]s{direction="received"} 5
%[1]s{direction="sent"} 4
`, name, relayHelp(t, reg))
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), name); err != nil {
		t.Error(err)
	}
	for metric, want := range map[string]string{
		"vipcast_ipvs_conn_sync_relay_dropped_messages_total":    `{reason="bad-mac"} 1`,
		"vipcast_ipvs_conn_sync_relay_dropped_connections_total": `{reason="unknown-target"} 2`,
		"vipcast_ipvs_conn_sync_relay_clamped_connections_total": ` 3`,
	} {
		if problems, err := testutil.GatherAndLint(reg, metric); err != nil || len(problems) != 0 {
			t.Errorf("lint %s: %v %v", metric, problems, err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, mf := range mfs {
			if mf.GetName() != metric {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := ""
				for _, l := range m.GetLabel() {
					labels += fmt.Sprintf("{%s=%q}", l.GetName(), l.GetValue())
				}
				got = append(got, fmt.Sprintf("%s %g", labels, m.GetCounter().GetValue()))
			}
		}
		if len(got) != 1 || got[0] != want {
			t.Errorf("%s: %q, want %q", metric, got, want)
		}
	}
	on = false
	for _, metric := range []string{name, "vipcast_ipvs_conn_sync_relay_dropped_messages_total", "vipcast_ipvs_conn_sync_relay_clamped_connections_total"} {
		if n := testutil.CollectAndCount(reg, metric); n != 0 {
			t.Errorf("%s: %d samples without a relay, want none", metric, n)
		}
	}
}

// relayHelp returns the relay metric's help text as reg gathers it.
func relayHelp(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "vipcast_ipvs_conn_sync_relay_messages_total" {
			return mf.GetHelp()
		}
	}
	t.Fatalf("gather: no vipcast_ipvs_conn_sync_relay_messages_total among %d families", len(mfs))
	return ""
}

// orderLog is the order in which a dataplane and a BGP engine saw VIPs:
// "dp VIP" when the dataplane was asked for a virtual server of VIP,
// "bgp VIP" when VIP's route was announced.
type orderLog struct {
	mu      sync.Mutex
	entries []string
}

func (o *orderLog) add(e string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.entries = append(o.entries, e)
}

func (o *orderLog) index(e string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Index(o.entries, e)
}

// orderedBGP is flakyBGP that logs each announced VIP in an orderLog.
type orderedBGP struct {
	flakyBGP
	log *orderLog
}

func (b *orderedBGP) Apply(ctx context.Context, announce []bgp.Route, withdraw []netip.Prefix) error {
	for _, r := range announce {
		b.log.add("bgp " + r.Prefix.Addr().String())
	}
	return b.flakyBGP.Apply(ctx, announce, withdraw)
}

// createServiceZ creates Service z (VIP 10.100.0.9, one ready endpoint)
// and waits until the caches of c hold it.
func createServiceZ(client *fake.Clientset, c *Controller) {
	ctx := context.Background()
	_, _ = client.CoreV1().Services("ns").Create(ctx, testLBService("z", "10.100.0.9"), metav1.CreateOptions{})
	_, _ = client.DiscoveryV1().EndpointSlices("ns").Create(ctx, testSlice("z"), metav1.CreateOptions{})
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, svc := range c.watch.listServices() {
			if svc.Name == "z" && len(c.watch.slicesOf(svc)) > 0 {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestControllerAnnouncesOnlyWhatItProgrammed: a full sync announces the
// routes of the Services whose virtual servers it programmed, not of a
// Service that reached the caches meanwhile; that one is announced once
// its own sync has programmed it. (A full sync once read the Services
// twice, for the dataplane and then for the routes, and announced a VIP
// the node had not bound yet: the fabric sent its traffic to a node that
// routed it back, and a new Service's first connections failed with "no
// route to host".)
func TestControllerAnnouncesOnlyWhatItProgrammed(t *testing.T) {
	client := fakeServices(2)
	log := &orderLog{}
	engine := &orderedBGP{flakyBGP: flakyBGP{routes: map[netip.Prefix]bgp.Route{}}, log: log}
	// The dataplane logs each VIP it is asked to program and, during its
	// first Sync, has Service z created: a Service that arrives while a
	// full sync programs the others.
	var c *Controller
	var once sync.Once
	dp := &fakeDataplane{
		beforeSync: func(desired ipvs.State) {
			for k := range desired.Services {
				log.add("dp " + k.VIP.String())
			}
			once.Do(func() { createServiceZ(client, c) })
		},
		beforeService: func(key ipvs.Key, desired *ipvs.Service) {
			if desired != nil {
				log.add("dp " + key.VIP.String())
			}
		},
	}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: fakePool(t, "10.100.0.0/24"), BGP: engine,
		Resync: time.Hour, Dataplane: dp, DataplaneResync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Run(ctx) }()
	z := netip.MustParsePrefix("10.100.0.9/32")
	eventually(t, "Service z announced", func() bool { return engine.prefixes()[z] }, func() string {
		log.mu.Lock()
		defer log.mu.Unlock()
		return fmt.Sprint(log.entries)
	})
	for _, vip := range []string{"10.100.0.1", "10.100.0.2", "10.100.0.9"} {
		programmed, announced := log.index("dp "+vip), log.index("bgp "+vip)
		if programmed < 0 || programmed > announced {
			log.mu.Lock()
			t.Errorf("VIP %s announced (at %d) before its virtual server was programmed (at %d): %v", vip, announced, programmed, log.entries)
			log.mu.Unlock()
		}
	}
}

// TestGuardMetrics: the guards' drop counters are read at each scrape, by
// reason; a failed read is reported as the scrape's error, not as zeros.
func TestGuardMetrics(t *testing.T) {
	const name = "vipcast_ipvs_guard_dropped_packets_total"
	drops, readErr := map[string]uint64{"bfd": 2, "tunnel": 7}, error(nil)
	reg := prometheus.NewRegistry()
	if err := RegisterGuardMetrics(reg, func() (map[string]uint64, error) { return drops, readErr }); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(reg, name); err != nil || len(problems) != 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	drops = map[string]uint64{"bfd": 3, "tunnel": 7, "metrics": 1}
	if n, err := testutil.GatherAndCount(reg, name); err != nil || n != 3 {
		t.Errorf("samples %d, %v; want 3", n, err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	if fmt.Sprint(got) != "map[bfd:3 metrics:1 tunnel:7]" {
		t.Errorf("samples %v, want bfd 3, metrics 1, tunnel 7", got)
	}
	readErr = errors.New("netlink: no such table")
	if _, err := reg.Gather(); err == nil || !strings.Contains(err.Error(), "no such table") {
		t.Errorf("a failed read: gather err = %v, want the read's error", err)
	}
}

// guardBGP records, at each SetPeers, the peers with BFD it configures and
// what the host guard lets in at that moment.
type guardBGP struct {
	flakyBGP
	guard *fakeDataplane
	mu    sync.Mutex
	calls []guardCall
}

type guardCall struct{ bfd, guarded []netip.Addr }

func (b *guardBGP) SetPeers(_ context.Context, peers []bgp.Peer) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, guardCall{bfd: bfdPeers(peers), guarded: b.guard.guarded()})
	return nil
}

func (b *guardBGP) lastCall() (guardCall, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.calls) == 0 {
		return guardCall{}, 0
	}
	return b.calls[len(b.calls)-1], len(b.calls)
}

// TestControllerBFDGuardOrder checks the order of the host guard's BFD
// peers around the sessions: a peer with BFD is let in before SetPeers
// starts its session, and one whose BFD is turned off is shut out only
// after SetPeers has stopped its session (when the guard narrowed first,
// the router's packets to the still running session were dropped, it went
// down on its detection time and reset BGP instead of ending AdminDown:
// seen in the lab, TestCluster/fabric).
func TestControllerBFDGuardOrder(t *testing.T) {
	client := fakeServices(1)
	scheme := runtime.NewScheme()
	if err := vipcastv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	pool := &vipcastv1alpha1.IPPool{TypeMeta: metav1.TypeMeta{APIVersion: "vipcast.io/v1alpha1", Kind: "IPPool"},
		ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: vipcastv1alpha1.IPPoolSpec{Addresses: []string{"10.100.0.0/24"}}}
	peer := mkPeer("tor", "10.0.0.254", nil)
	peer.TypeMeta = metav1.TypeMeta{APIVersion: "vipcast.io/v1alpha1", Kind: "BGPPeer"}
	peer.Spec.BFD = &vipcastv1alpha1.BFDConfig{}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{
		vipcastv1alpha1.IPPoolsResource:  "IPPoolList",
		vipcastv1alpha1.BGPPeersResource: "BGPPeerList",
	}, pool, peer)
	dp := &fakeDataplane{}
	engine := &guardBGP{flakyBGP: flakyBGP{routes: map[netip.Prefix]bgp.Route{}}, guard: dp}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: dyn, BGP: engine, Dataplane: dp, Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Run(ctx) }()

	tor := netip.MustParseAddr("10.0.0.254")
	waitCall := func(what string, ok func(guardCall) bool) int {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if call, n := engine.lastCall(); n > 0 && ok(call) {
				return n
			}
			time.Sleep(10 * time.Millisecond)
		}
		call, n := engine.lastCall()
		t.Fatalf("%s: last of %d SetPeers calls %+v", what, n, call)
		return 0
	}
	waitCall("BFD on", func(c guardCall) bool { return slices.Equal(c.bfd, []netip.Addr{tor}) })
	engine.mu.Lock()
	for i, call := range engine.calls {
		if len(call.bfd) > 0 && !slices.Contains(call.guarded, tor) {
			t.Errorf("SetPeers call %d started BFD with %s while the guard let in only %v: its first packets would be dropped", i, tor, call.guarded)
		}
	}
	engine.mu.Unlock()

	// BFD off in the BGPPeer.
	u, err := dyn.Resource(vipcastv1alpha1.BGPPeersResource).Get(ctx, "tor", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unstructuredDelete(u.Object, "spec", "bfd")
	u.SetGeneration(u.GetGeneration() + 1) // as the API server does on a spec change
	if _, err := dyn.Resource(vipcastv1alpha1.BGPPeersResource).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCall("BFD off", func(c guardCall) bool { return len(c.bfd) == 0 })
	call, _ := engine.lastCall()
	if !slices.Contains(call.guarded, tor) {
		t.Errorf("SetPeers stopped the BFD session with %s while the guard already let in only %v: the router's packets to the running session were dropped", tor, call.guarded)
	}
	// Then the guard shuts it out.
	deadline := time.Now().Add(10 * time.Second)
	for slices.Contains(dp.guarded(), tor) {
		if time.Now().After(deadline) {
			t.Fatalf("the guard still lets in %v after BFD was turned off and its session stopped", dp.guarded())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// unstructuredDelete removes the field at path from obj.
func unstructuredDelete(obj map[string]any, path ...string) {
	for _, p := range path[:len(path)-1] {
		next, ok := obj[p].(map[string]any)
		if !ok {
			return
		}
		obj = next
	}
	delete(obj, path[len(path)-1])
}

// TestControllerInvalidDataplaneConfig: a Service whose scheduler
// annotation names no IPVS scheduler loses nothing — it is programmed with
// the default scheduler and announced — and the speaker puts no Event on
// it: vipcast-ccm reports it once (TestDataplaneConfigJudgedOnce), where
// each speaker would add one per node. A dataplane refusal, which is the
// node's own, is still reported by the node (the control).
func TestControllerInvalidDataplaneConfig(t *testing.T) {
	client, _, dp, engine := startRefusing(t, 2, "a", "bogus", "sed")
	setScheduler(t.Context(), t, client, "b", "sed")
	eventually(t, "Service a programmed with the default scheduler and announced, b refused", func() bool {
		dp.mu.Lock()
		s, ok := dp.kernel[ipvs.Key{VIP: netip.MustParseAddr("10.100.0.1"), Port: 80, Protocol: ipvs.TCP}]
		dp.mu.Unlock()
		return ok && s.Scheduler == ipvs.DefaultScheduler && engine.prefixes()[netip.MustParsePrefix("10.100.0.1/32")] &&
			hasWarning(t.Context(), t, client, "b", "DataplaneRefused", "node n1")
	}, func() string { return fmt.Sprintf("kernel %v, routes %v", dp.kernel, engine.prefixes()) })
	if hasWarning(t.Context(), t, client, "a", "InvalidDataplaneConfig") {
		t.Errorf("the speaker put an InvalidDataplaneConfig Event on Service a: one per node")
	}
}

// hasWarning reports whether namespace ns holds a Warning Event of reason
// on the object named name whose message contains every one of parts.
func hasWarning(ctx context.Context, t *testing.T, client *fake.Clientset, name, reason string, parts ...string) bool {
	t.Helper()
	evs, err := client.CoreV1().Events("ns").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.InvolvedObject.Name != name || e.Type != v1.EventTypeWarning || e.Reason != reason {
			continue
		}
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(e.Message, p) }) {
			return true
		}
	}
	return false
}

// startRefusing runs, until the test ends, a controller for node n1 over n
// fake Services (fakeServices), Service name's scheduler annotation set to
// sched, on a dataplane that refuses the scheduler refuse.
func startRefusing(t *testing.T, n int, name, sched, refuse string) (*fake.Clientset, *Controller, *fakeDataplane, *flakyBGP) {
	t.Helper()
	client := fakeServices(n)
	setScheduler(t.Context(), t, client, name, sched)
	dp := &fakeDataplane{refuse: refuse}
	engine := &flakyBGP{routes: map[netip.Prefix]bgp.Route{}}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: fakePool(t, "10.100.0.0/24"), BGP: engine,
		Resync: time.Hour, Dataplane: dp, DataplaneResync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Run(t.Context()) }()
	return client, c, dp, engine
}

// TestControllerPrefixCountWarning: a node that comes to announce more
// prefixes than Options.PrefixWarning gets one PrefixCountHigh Warning on
// its Node naming the count and the setting; none at or under it.
func TestControllerPrefixCountWarning(t *testing.T) {
	for _, tc := range []struct {
		limit int
		warn  bool
	}{{3, true}, {4, false}, {0, false}} {
		client := fakeServices(4)
		engine := &flakyBGP{routes: map[netip.Prefix]bgp.Route{}}
		c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: fakePool(t, "10.100.0.0/24"), BGP: engine,
			Resync: time.Hour, PrefixWarning: tc.limit})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		go func() { _ = c.Run(ctx) }()
		eventually(t, "4 prefixes announced", func() bool { return len(engine.prefixes()) == 4 },
			func() string { return fmt.Sprint(engine.prefixes()) })
		warned := func() bool {
			evs, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return slices.ContainsFunc(evs.Items, func(e v1.Event) bool {
				return e.InvolvedObject.Kind == "Node" && e.Reason == "PrefixCountHigh" &&
					strings.Contains(e.Message, "announces 4 prefixes") && strings.Contains(e.Message, fmt.Sprintf("=%d", tc.limit))
			})
		}
		if tc.warn {
			eventually(t, "a PrefixCountHigh Warning on the Node", warned, func() string { return "none" })
		} else {
			time.Sleep(statusCompute + time.Second) // the status (and the check) is computed at most this often
			if warned() {
				t.Errorf("limit %d: a PrefixCountHigh Warning for 4 prefixes", tc.limit)
			}
		}
		cancel()
	}
}
