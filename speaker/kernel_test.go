//go:build kernel

package speaker

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	libipvs "github.com/moby/ipvs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/ipvs"
	"github.com/vipcast/vipcast/test/vm"
)

// planKeys returns the virtual servers a plan touches and the VIPs it binds
// or unbinds.
func planKeys(p ipvs.Plan) (keys map[ipvs.Key]bool, vips []netip.Addr) {
	keys = map[ipvs.Key]bool{}
	for _, k := range slices.Concat(p.AddSNAT, p.DelSNAT, p.DelServices) {
		keys[k] = true
	}
	for _, s := range slices.Concat(p.AddServices, p.UpdateServices) {
		keys[s.Key()] = true
	}
	for _, c := range slices.Concat(p.AddBackends, p.UpdateBackends, p.LowerBackends, p.DelBackends) {
		keys[c.Key] = true
	}
	for _, s := range slices.Concat(p.Tier2.Add, p.Tier2.Del, p.InCluster.Add, p.InCluster.Del) {
		keys[s.Key] = true
	}
	return keys, slices.Concat(p.AddVIPs, p.DelVIPs)
}

// TestControllerKernel runs a real Controller (fake API server, fake BGP)
// with the real ipvs.Dataplane in the VM's kernel and checks the kernel
// table it produces, in steps that each build on the one before:
// start-up (the start-up Sync), endpoints (an EndpointSlice update of one
// Service), drift (repair by the periodic resync next to foreign virtual
// servers), delete (Services deleted), ports (a port added and removed)
// and restart (a new Controller and Dataplane take the table over without
// a change). One VM boot.
func TestControllerKernel(t *testing.T) {
	if !vm.InVM() {
		vm.RunTest(t, vm.Options{Timeout: 4 * time.Minute})
		return
	}
	const link = "vipcast-k"
	const resync = time.Second
	addr := netip.MustParseAddr

	node := testNodeObject()
	svc := func(name string, ports []v1.ServicePort, vips ...string) *v1.Service {
		s := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Spec:       v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, Ports: ports},
		}
		for _, ip := range vips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
		}
		return s
	}
	type kep struct {
		addr, node string
		ready      bool
		term       bool
	}
	slice := func(svc, name string, fam discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...kep) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
			AddressType: fam,
			Ports:       ports,
		}
		for _, e := range eps {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.addr}, NodeName: ptr.To(e.node),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(e.ready), Terminating: ptr.To(e.term)}})
		}
		return s
	}
	eport := func(name string, port int32, proto v1.Protocol) discoveryv1.EndpointPort {
		return discoveryv1.EndpointPort{Name: ptr.To(name), Port: ptr.To(port), Protocol: ptr.To(proto)}
	}
	tcp := func(port int32) []v1.ServicePort { return []v1.ServicePort{{Port: port, Protocol: v1.ProtocolTCP}} }
	tcpSlicePort := func(port int32) []discoveryv1.EndpointPort {
		return []discoveryv1.EndpointPort{eport("", port, v1.ProtocolTCP)}
	}

	// a: Cluster, two ports (TCP and UDP, named), two ready endpoints.
	svcA := svc("a", []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}, {Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}}, "10.100.0.1")
	aPorts := []discoveryv1.EndpointPort{eport("http", 8080, v1.ProtocolTCP), eport("dns", 5353, v1.ProtocolUDP)}
	sliceA := slice("a", "a-1", discoveryv1.AddressTypeIPv4, aPorts,
		kep{"10.244.1.1", "n1", true, false}, kep{"10.244.1.2", "n2", true, false})
	// b: Local, scheduler rr: this node's ready and terminating endpoints only.
	svcB := svc("b", tcp(443), "10.100.0.2")
	svcB.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	svcB.Annotations = map[string]string{AnnotationScheduler: "rr"}
	sliceB := slice("b", "b-1", discoveryv1.AddressTypeIPv4, tcpSlicePort(8443),
		kep{"10.244.2.1", "n1", true, false}, kep{"10.244.2.2", "n2", true, false}, kep{"10.244.2.3", "n1", false, true})
	// c: Cluster, dual-stack, client affinity.
	svcC := svc("c", tcp(8080), "10.100.0.3", "fd00:100::3")
	svcC.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	svcC.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](600)}}
	sliceC4 := slice("c", "c-4", discoveryv1.AddressTypeIPv4, tcpSlicePort(80), kep{"10.244.3.1", "n2", true, false})
	sliceC6 := slice("c", "c-6", discoveryv1.AddressTypeIPv6, tcpSlicePort(80), kep{"fd00:244::3:1", "n2", true, false})
	// d and e share a VIP.
	svcD, svcE := svc("d", tcp(80), "10.100.0.4"), svc("e", tcp(81), "10.100.0.4")
	sliceD := slice("d", "d-1", discoveryv1.AddressTypeIPv4, tcpSlicePort(8080), kep{"10.244.4.1", "n2", true, false})
	sliceE := slice("e", "e-1", discoveryv1.AddressTypeIPv4, tcpSlicePort(8081), kep{"10.244.4.2", "n2", true, false})

	client := fake.NewClientset(node, svcA, sliceA, svcB, sliceB, svcC, sliceC4, sliceC6, svcD, sliceD, svcE, sliceE)
	dyn := fakePool(t, "10.100.0.0/24", "fd00:100::/120")

	dp, err := ipvs.New(ipvs.Options{LinkName: link})
	if err != nil {
		t.Fatalf("ipvs.New: %v", err)
	}
	// Closed once: a second Close would close file descriptors that may
	// have been reused by then.
	closeDP := sync.OnceValue(dp.Close)
	defer func() { _ = closeDP() }()
	rec := &fakeDataplane{wrapped: dp}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	// The probe is an hour away: the periodic resync alone finds c)'s
	// drift, and must report it as the probe would.
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: dyn, BGP: &flakyBGP{routes: map[netip.Prefix]bgp.Route{}},
		Resync: time.Hour, Dataplane: rec, DataplaneResync: resync, DataplaneProbe: time.Hour, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	stop := func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Controller.Run did not return after its context ended")
		}
	}
	defer stop()

	// The expected kernel table, written out by hand.
	rs := func(a string, port uint16, w int) ipvs.Backend {
		return ipvs.Backend{Addr: addr(a), Port: port, Weight: w}
	}
	mh := func(s ipvs.Service) ipvs.Service {
		s.Scheduler, s.Flags = ipvs.DefaultScheduler, ipvs.DefaultSchedulerFlags
		return s
	}
	// sessionAffinity ClientIP: mh without port hashing.
	affine := func(s ipvs.Service) ipvs.Service {
		s.Scheduler, s.Flags = ipvs.DefaultScheduler, ipvs.FlagMHFallback
		return s
	}
	want := map[ipvs.Key]ipvs.Service{}
	put := func(s ipvs.Service) { want[s.Key()] = s.Normalize() }
	aTCP := ipvs.Key{VIP: addr("10.100.0.1"), Port: 80, Protocol: ipvs.TCP}
	aUDP := ipvs.Key{VIP: addr("10.100.0.1"), Port: 53, Protocol: ipvs.UDP}
	bKey := ipvs.Key{VIP: addr("10.100.0.2"), Port: 443, Protocol: ipvs.TCP}
	c4 := ipvs.Key{VIP: addr("10.100.0.3"), Port: 8080, Protocol: ipvs.TCP}
	c6 := ipvs.Key{VIP: addr("fd00:100::3"), Port: 8080, Protocol: ipvs.TCP}
	dKey := ipvs.Key{VIP: addr("10.100.0.4"), Port: 80, Protocol: ipvs.TCP}
	eKey := ipvs.Key{VIP: addr("10.100.0.4"), Port: 81, Protocol: ipvs.TCP}
	put(mh(ipvs.Service{VIP: aTCP.VIP, Port: 80, Protocol: ipvs.TCP, SNAT: true, Backends: []ipvs.Backend{rs("10.244.1.1", 8080, 1), rs("10.244.1.2", 8080, 1)}}))
	put(mh(ipvs.Service{VIP: aUDP.VIP, Port: 53, Protocol: ipvs.UDP, SNAT: true, Backends: []ipvs.Backend{rs("10.244.1.1", 5353, 1), rs("10.244.1.2", 5353, 1)}}))
	put(ipvs.Service{VIP: bKey.VIP, Port: 443, Protocol: ipvs.TCP, Scheduler: "rr", Backends: []ipvs.Backend{rs("10.244.2.1", 8443, 1), rs("10.244.2.3", 8443, 0)}})
	put(affine(ipvs.Service{VIP: c4.VIP, Port: 8080, Protocol: ipvs.TCP, SNAT: true, Persistent: 600, Backends: []ipvs.Backend{rs("10.244.3.1", 80, 1)}}))
	put(affine(ipvs.Service{VIP: c6.VIP, Port: 8080, Protocol: ipvs.TCP, SNAT: true, Persistent: 600, Backends: []ipvs.Backend{rs("fd00:244::3:1", 80, 1)}}))
	put(mh(ipvs.Service{VIP: dKey.VIP, Port: 80, Protocol: ipvs.TCP, SNAT: true, Backends: []ipvs.Backend{rs("10.244.4.1", 8080, 1)}}))
	put(mh(ipvs.Service{VIP: eKey.VIP, Port: 81, Protocol: ipvs.TCP, SNAT: true, Backends: []ipvs.Backend{rs("10.244.4.2", 8081, 1)}}))
	wantVIPs := map[netip.Addr]struct{}{}
	for k := range want {
		wantVIPs[k.VIP] = struct{}{}
	}

	// foreign are virtual servers vipcast does not own (created by hand
	// below); the kernel holds them next to want.
	foreign := map[ipvs.Key]ipvs.Service{}
	read := func(t *testing.T) ipvs.State {
		t.Helper()
		st, err := dp.Read()
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		return st
	}
	// The VIP filter lets through exactly the Services' virtual servers
	// on exactly their VIPs: a Service gaining or losing a port (or going)
	// opens or closes that port.
	wantFilter := func() ipvs.Filter {
		f := ipvs.NewFilter()
		maps.Copy(f.VIPs, wantVIPs)
		for k := range want {
			f.Allow[k] = struct{}{}
		}
		return f
	}
	readFilter := func(t *testing.T) ipvs.Filter {
		t.Helper()
		f, err := dp.ReadFilter()
		if err != nil {
			t.Fatalf("ReadFilter: %v", err)
		}
		return f
	}
	matches := func(t *testing.T, st ipvs.State) bool {
		all := maps.Clone(want)
		maps.Copy(all, foreign)
		return reflect.DeepEqual(st.Services, all) && reflect.DeepEqual(st.VIPs, wantVIPs) && reflect.DeepEqual(readFilter(t), wantFilter())
	}
	describe := func(t *testing.T, st ipvs.State) string {
		var b strings.Builder
		all := maps.Clone(want)
		maps.Copy(all, foreign)
		keys := slices.Collect(maps.Keys(st.Services))
		for k := range all {
			if _, ok := st.Services[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.SortFunc(keys, func(x, y ipvs.Key) int { return strings.Compare(x.String(), y.String()) })
		for _, k := range keys {
			got, ok := st.Services[k]
			w, wok := all[k]
			switch {
			case !ok:
				fmt.Fprintf(&b, "\n  missing %s: want %+v", k, w)
			case !wok:
				fmt.Fprintf(&b, "\n  extra   %s: %+v", k, got)
			case !reflect.DeepEqual(got, w):
				fmt.Fprintf(&b, "\n  differs %s:\n    got  %+v\n    want %+v", k, got, w)
			}
		}
		fmt.Fprintf(&b, "\n  VIPs on %s: %v, want %v", link, sortedAddrs(st.VIPs), sortedAddrs(wantVIPs))
		fmt.Fprintf(&b, "\n  VIP filter: %+v, want %+v", readFilter(t), wantFilter())
		return b.String()
	}
	waitKernel := func(t *testing.T, what string, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			st := read(t)
			if matches(t, st) {
				return time.Since(start)
			}
			if time.Since(start) > within {
				calls, _ := rec.since(0)
				t.Fatalf("%s: the kernel does not match after %s:%s\ncontroller's dataplane calls: %v", what, within, describe(t, st), calls)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	// quiet checks that every call from index i on changed nothing or
	// only the virtual servers in keys, and no VIP.
	quiet := func(t *testing.T, what string, i int, vipsOK bool, keys ...ipvs.Key) int {
		t.Helper()
		calls, n := rec.since(i)
		for _, call := range calls {
			if call.err != nil {
				t.Errorf("%s: %v", what, call)
			}
			touched, vips := planKeys(call.plan)
			for k := range touched {
				if !slices.Contains(keys, k) {
					t.Errorf("%s: %v touches %s", what, call, k)
				}
			}
			if len(vips) > 0 && !vipsOK {
				t.Errorf("%s: %v binds or unbinds VIPs %v", what, call, vips)
			}
		}
		return n
	}

	// n counts the controller's dataplane calls up to the end of the
	// step before: each step checks the calls it caused.
	var (
		n     int
		calls []dataplaneCall
		took  time.Duration
	)
	if !t.Run("start-up", func(t *testing.T) {
		// a) Start-up: exactly the Services' virtual servers and real servers,
		// programmed by the start-up Sync.
		start := time.Now()
		for !c.HasSynced() {
			if time.Since(start) > 30*time.Second {
				t.Fatal("the controller did not sync")
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("controller synced after %s", time.Since(start).Round(time.Millisecond))
		st := read(t)
		if !matches(t, st) {
			t.Fatalf("a) kernel after start-up:%s", describe(t, st))
		}
		nSNAT, nRS, nSlots := 0, 0, 0
		for _, s := range want {
			if s.SNAT {
				nSNAT++
			}
			nRS += len(s.Backends)
			if !s.SNAT {
				// Local with one tier: in-cluster slots over the endpoints
				// everywhere (each such Service here has a ready one).
				nSlots += ipvs.Tier2Slots
			}
		}
		calls, n = rec.since(0)
		// Each VIP is bound and filtered; each virtual server is added and let
		// through the filter; each with in-cluster endpoints fills its slots.
		if len(calls) == 0 || !calls[0].full || calls[0].plan.Len() != 2*len(wantVIPs)+nSNAT+2*len(want)+nRS+nSlots {
			t.Fatalf("a) the first dataplane call is %v, want the start-up Sync: %d VIPs, %d SNAT, %d virtual servers, %d real servers, their filter elements and %d in-cluster slots",
				calls, len(wantVIPs), nSNAT, len(want), nRS, nSlots)
		}
		t.Logf("a) start-up: %v", calls[0])
		for _, call := range calls[1:] {
			if !call.plan.Empty() || call.err != nil {
				t.Errorf("a) after the start-up Sync: %v", call)
			}
		}
		for _, k := range []ipvs.Key{aTCP, aUDP, c4, c6, dKey, eKey} {
			if s := st.Services[k]; s.Scheduler != "mh" || !s.SNAT {
				t.Errorf("a) %s: scheduler %q, SNAT %v; want mh with SNAT (Cluster)", k, s.Scheduler, s.SNAT)
			}
		}
		if s := st.Services[bKey]; s.Scheduler != "rr" || s.SNAT {
			t.Errorf("a) %s: scheduler %q, SNAT %v; want rr without SNAT (Local)", bKey, s.Scheduler, s.SNAT)
		}
	}) {
		return
	}

	if !t.Run("endpoints", func(t *testing.T) {
		// b) An EndpointSlice update of Service a: only a's real servers
		// change; 10.244.1.1 terminates (weight 0), 10.244.1.3 arrives, and
		// 10.244.1.4 arrives not ready: weight 0 under TCP (the connections it
		// has go on), none under UDP (its flows are balanced afresh).
		others := func(st ipvs.State) map[ipvs.Key]ipvs.Service {
			m := maps.Clone(st.Services)
			delete(m, aTCP)
			delete(m, aUDP)
			return m
		}
		before := others(read(t)) // the table start-up left
		sliceA = slice("a", "a-1", discoveryv1.AddressTypeIPv4, aPorts,
			kep{"10.244.1.1", "n1", false, true}, kep{"10.244.1.2", "n2", true, false}, kep{"10.244.1.3", "n2", true, false},
			kep{"10.244.1.4", "n2", false, false})
		if _, err := client.DiscoveryV1().EndpointSlices("ns").Update(ctx, sliceA, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		put(mh(ipvs.Service{VIP: aTCP.VIP, Port: 80, Protocol: ipvs.TCP, SNAT: true,
			Backends: []ipvs.Backend{rs("10.244.1.1", 8080, 0), rs("10.244.1.2", 8080, 1), rs("10.244.1.3", 8080, 1), rs("10.244.1.4", 8080, 0)}}))
		put(mh(ipvs.Service{VIP: aUDP.VIP, Port: 53, Protocol: ipvs.UDP, SNAT: true,
			Backends: []ipvs.Backend{rs("10.244.1.1", 5353, 0), rs("10.244.1.2", 5353, 1), rs("10.244.1.3", 5353, 1)}}))
		took = waitKernel(t, "b) EndpointSlice update of a", 10*time.Second)
		t.Logf("b) a's real servers updated in the kernel after %s", took.Round(time.Millisecond))
		if after := others(read(t)); !reflect.DeepEqual(after, before) {
			t.Errorf("b) the other Services' virtual servers changed:\nbefore %+v\nafter  %+v", before, after)
		}
		time.Sleep(resync + resync/2) // and a periodic resync finds nothing to do
		calls, _ = rec.since(n)
		t.Logf("b) dataplane calls: %v", calls)
		// c) starts counting from its own mark, after the drift it makes.
		quiet(t, "b) EndpointSlice update of a", n, false, aTCP, aUDP)
	}) {
		return
	}

	if !t.Run("drift", func(t *testing.T) {
		// c) Drift: a virtual server of b (Local) and one of a (Cluster, with
		// source NAT) deleted by hand come back within the resync period; a
		// foreign virtual server (a VIP not on the link, one outside the pools
		// and one inside) is left alone.
		h, err := libipvs.New("")
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		for _, f := range []struct {
			vip  string
			port uint16
		}{{"198.51.100.7", 80}, {"10.100.0.99", 80}} {
			ks := &libipvs.Service{Address: net.ParseIP(f.vip), Protocol: unix.IPPROTO_TCP, Port: f.port,
				AddressFamily: unix.AF_INET, SchedName: "rr", Netmask: 0xffffffff}
			if err := h.NewService(ks); err != nil {
				t.Fatal(err)
			}
			if err := h.NewDestination(ks, &libipvs.Destination{Address: net.ParseIP("10.244.9.9"), Port: 80, Weight: 5,
				ConnectionFlags: libipvs.ConnectionFlagMasq, AddressFamily: unix.AF_INET}); err != nil {
				t.Fatal(err)
			}
			s := ipvs.Service{VIP: addr(f.vip), Port: f.port, Protocol: ipvs.TCP, Scheduler: "rr", Backends: []ipvs.Backend{rs("10.244.9.9", 80, 5)}}
			foreign[s.Key()] = s.Normalize()
		}
		if st := read(t); !matches(t, st) {
			t.Fatalf("c) with the foreign virtual servers:%s", describe(t, st))
		}
		if got := testutil.ToFloat64(m.drift); got != 0 {
			t.Errorf("c) vipcast_ipvs_drift_detected_total = %v before any drift (start-up and quiet resyncs), want 0", got)
		}
		n = rec.count()
		for _, k := range []ipvs.Key{bKey, aTCP} {
			ks := &libipvs.Service{Address: k.VIP.AsSlice(), Protocol: uint16(k.Protocol), Port: k.Port, AddressFamily: unix.AF_INET, Netmask: 0xffffffff}
			if err := h.DelService(ks); err != nil {
				t.Fatalf("delete %s by hand: %v", k, err)
			}
		}
		deleted := time.Now()
		for {
			st := read(t)
			_, okB := st.Services[bKey]
			_, okA := st.Services[aTCP]
			if okA && okB {
				t.Logf("c) the virtual servers deleted by hand are back after %s: %v, %v", time.Since(deleted).Round(time.Millisecond),
					st.Services[bKey], st.Services[aTCP])
				if !st.Services[aTCP].SNAT {
					t.Errorf("c) %s is back without its source NAT element (a Sync dropped the element that outlived it)", aTCP)
				}
				break
			}
			if time.Since(deleted) > 3*resync {
				t.Fatalf("c) the virtual servers deleted by hand are not back within %s:%s", 3*resync, describe(t, st))
			}
			time.Sleep(10 * time.Millisecond)
		}
		took = waitKernel(t, "c) drift repaired", 5*resync)
		t.Logf("c) kernel table complete again %s later", took.Round(time.Millisecond))
		// The resyncs that put them back said what they found gone: the two
		// deletions are two requests, so one resync or two.
		calls, _ = rec.since(n)
		lostSeen := map[ipvs.Key]int{}
		for _, cl := range calls {
			for _, k := range cl.plan.Lost {
				lostSeen[k]++
			}
		}
		if len(lostSeen) != 2 || lostSeen[bKey] != 1 || lostSeen[aTCP] != 1 {
			t.Errorf("c) the repairing resyncs' Lost: %v, want %s and %s once each", lostSeen, bKey, aTCP)
		}
		if got := testutil.ToFloat64(m.drift); got < 1 || got > 2 {
			t.Errorf("c) vipcast_ipvs_drift_detected_total = %v after the resync repaired the drift, want 1 or 2", got)
		}
		eventually(t, "c) a DataplaneDrift Warning Event on the Node after the resync repaired the drift", func() bool {
			return nodeWarning(ctx, t, client, "n1", func(e v1.Event) bool { return e.Reason == "DataplaneDrift" })
		}, func() string { return fmt.Sprintf("drift counter %v", testutil.ToFloat64(m.drift)) })
		// Two more resyncs with the foreign virtual servers around.
		for full := rec.fullSyncs(); rec.fullSyncs() < full+2; {
			if time.Since(deleted) > 10*resync {
				t.Fatal("c) no periodic resync")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if st := read(t); !matches(t, st) {
			t.Errorf("c) kernel after two more resyncs:%s", describe(t, st))
		}
		calls, _ = rec.since(n)
		t.Logf("c) dataplane calls: %v", calls)
		n = quiet(t, "c) drift", n, false, aTCP, bKey)
		for _, k := range []ipvs.Key{aTCP, bKey} {
			var repaired bool
			for _, call := range calls {
				if keys, _ := planKeys(call.plan); call.full && keys[k] {
					repaired = true
				}
			}
			if !repaired {
				t.Errorf("c) no periodic Sync repaired %s", k)
			}
		}
	}) {
		return
	}

	if !t.Run("delete", func(t *testing.T) {
		// d) Deleting Services: c's two virtual servers go and both its VIPs
		// are unbound; d's goes, but its VIP stays for e.
		for _, name := range []string{"c", "d"} {
			if err := client.CoreV1().Services("ns").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range []ipvs.Key{c4, c6, dKey} {
			delete(want, k)
		}
		delete(wantVIPs, c4.VIP)
		delete(wantVIPs, c6.VIP)
		took = waitKernel(t, "d) Services c and d deleted", 10*time.Second)
		t.Logf("d) Services c and d removed from the kernel after %s", took.Round(time.Millisecond))
		time.Sleep(resync + resync/2)
		if st := read(t); !matches(t, st) {
			t.Errorf("d) kernel after a resync:%s", describe(t, st))
		}
		calls, _ = rec.since(n)
		t.Logf("d) dataplane calls: %v", calls)
		quiet(t, "d) Services deleted", n, true, c4, c6, dKey)
		var unbound []netip.Addr
		for _, call := range calls {
			unbound = append(unbound, call.plan.DelVIPs...)
		}
		slices.SortFunc(unbound, netip.Addr.Compare)
		if want := []netip.Addr{c4.VIP, c6.VIP}; !slices.Equal(unbound, want) {
			t.Errorf("d) unbound VIPs %v, want %v", unbound, want)
		}
	}) {
		return
	}

	if !t.Run("ports", func(t *testing.T) {
		// d2) Service e gains port 82, then loses it: that port's virtual
		// server and filter element come and go, the rest stays (matches
		// checks the whole table and the whole filter).
		setPorts := func(ports ...int32) {
			t.Helper()
			e, err := client.CoreV1().Services("ns").Get(ctx, "e", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			e.Spec.Ports = nil
			for _, port := range ports {
				e.Spec.Ports = append(e.Spec.Ports, tcp(port)...)
			}
			if _, err := client.CoreV1().Services("ns").Update(ctx, e, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		e82 := ipvs.Key{VIP: eKey.VIP, Port: 82, Protocol: ipvs.TCP}
		setPorts(81, 82)
		want[e82] = mh(ipvs.Service{VIP: eKey.VIP, Port: 82, Protocol: ipvs.TCP, SNAT: true, Backends: []ipvs.Backend{rs("10.244.4.2", 8081, 1)}})
		took = waitKernel(t, "d2) Service e gains port 82", 10*time.Second)
		t.Logf("d2) port 82 programmed and let through after %s", took.Round(time.Millisecond))
		setPorts(81)
		delete(want, e82)
		took = waitKernel(t, "d2) Service e loses port 82", 10*time.Second)
		t.Logf("d2) port 82 removed and closed after %s", took.Round(time.Millisecond))
	}) {
		return
	}

	t.Run("restart", func(t *testing.T) {
		// e) A restarted speaker (a new Controller and a new Dataplane on the
		// same kernel) takes the table over without a single change: what
		// ServiceDataplane computes is what the kernel reports.
		stop()
		if err := closeDP(); err != nil {
			t.Fatalf("closing the first dataplane: %v", err)
		}
		dp2, err := ipvs.New(ipvs.Options{LinkName: link})
		if err != nil {
			t.Fatalf("ipvs.New after the restart: %v", err)
		}
		defer dp2.Close()
		dp = dp2 // read(t) reads through it from now on
		rec2 := &fakeDataplane{wrapped: dp2}
		c2, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: dyn, BGP: &flakyBGP{routes: map[netip.Prefix]bgp.Route{}},
			Resync: time.Hour, Dataplane: rec2, DataplaneResync: resync})
		if err != nil {
			t.Fatal(err)
		}
		ctx2, cancel2 := context.WithCancel(context.Background())
		done2 := make(chan struct{})
		go func() { _ = c2.Run(ctx2); close(done2) }()
		defer func() { cancel2(); <-done2 }()
		start := time.Now()
		for rec2.fullSyncs() < 2 {
			if time.Since(start) > 10*time.Second {
				t.Fatal("e) the restarted controller did not resync")
			}
			time.Sleep(10 * time.Millisecond)
		}
		calls, _ = rec2.since(0)
		t.Logf("e) restarted controller's dataplane calls: %v", calls)
		for _, call := range calls {
			if !call.plan.Empty() || call.err != nil {
				t.Errorf("e) after the restart: %v, want no change", call)
			}
		}
		if st := read(t); !matches(t, st) {
			t.Errorf("e) kernel after the restart:%s", describe(t, st))
		}
	})
}

func sortedAddrs(m map[netip.Addr]struct{}) []netip.Addr {
	return slices.SortedFunc(maps.Keys(m), netip.Addr.Compare)
}

// TestControllerKernelBadService starts a Controller against the VM's
// kernel with 100 Services, one of which asks for a scheduler the kernel
// does not have (its module is not loaded and the guest cannot load it):
// the 99 others are programmed and announced and the speaker is ready; the
// refused one has a Warning Event and no route. Once its annotation names
// an available scheduler it comes up alone: its virtual server is added
// and its route announced, and nothing else changes. One VM boot.
func TestControllerKernelBadService(t *testing.T) {
	if !vm.InVM() {
		vm.RunTest(t, vm.Options{Timeout: 4 * time.Minute})
		return
	}
	const n = 100
	objs := []runtime.Object{testNodeObject()}
	vipOf := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 100, 0, byte(i + 1)}) }
	for i := range n {
		name := fmt.Sprintf("s%03d", i)
		s := testLBService(name, vipOf(i).String())
		if i == 0 {
			s.Annotations = map[string]string{AnnotationScheduler: "sed"} // not in vm.DefaultModules
		}
		objs = append(objs, s, testSlice(name))
	}
	client := fake.NewClientset(objs...)
	dp, err := ipvs.New(ipvs.Options{LinkName: "vipcast-bad"})
	if err != nil {
		t.Fatalf("ipvs.New: %v", err)
	}
	defer dp.Close()
	rec := &fakeDataplane{wrapped: dp}
	engine := &flakyBGP{routes: map[netip.Prefix]bgp.Route{}}
	c, err := NewController(Options{NodeName: "n1", Client: client, Dynamic: fakePool(t, "10.100.0.0/24"), BGP: engine,
		Resync: time.Hour, Dataplane: rec, DataplaneResync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	badKey := ipvs.Key{VIP: vipOf(0), Port: 80, Protocol: ipvs.TCP}
	badPrefix := netip.PrefixFrom(vipOf(0), 32)
	kernel := func() map[ipvs.Key]ipvs.Service {
		st, err := dp.Read()
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
		return st.Services
	}
	waitFor := func(what string, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > time.Minute {
				calls, _ := rec.since(0)
				t.Fatalf("%s: not after a minute (ready %v, %d routes, %d virtual servers); dataplane calls: %v",
					what, c.HasSynced(), len(engine.prefixes()), len(kernel()), calls)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return time.Since(start)
	}
	took := waitFor("ready with 99 virtual servers and 99 routes", func() bool {
		k := kernel()
		_, bad := k[badKey]
		return c.HasSynced() && len(k) == n-1 && !bad && len(engine.prefixes()) == n-1
	})
	t.Logf("fresh start: ready, 99 virtual servers and 99 routes after %s", took)
	if engine.prefixes()[badPrefix] {
		t.Errorf("the refused Service's VIP %s is announced", badPrefix)
	}
	waitFor("a DataplaneRefused Event naming the node", func() bool {
		evs, err := client.CoreV1().Events("ns").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "s000" && e.Reason == "DataplaneRefused" && e.Type == v1.EventTypeWarning &&
				strings.Contains(e.Message, "node n1") && strings.Contains(e.Message, `"sed"`) {
				t.Logf("Event: %s", e.Message)
				return true
			}
		}
		return false
	})
	time.Sleep(time.Second) // its retries must not announce it
	if got := engine.prefixes(); len(got) != n-1 || got[badPrefix] {
		t.Fatalf("after the refused Service's retries: %d routes (its own: %v), want 99 without it", len(got), got[badPrefix])
	}

	before := kernel()
	bad, err := client.CoreV1().Services("ns").Get(ctx, "s000", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad.Annotations[AnnotationScheduler] = "rr"
	from := rec.count()
	if _, err := client.CoreV1().Services("ns").Update(ctx, bad, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	took = waitFor("the fixed Service programmed and announced", func() bool {
		_, ok := kernel()[badKey]
		return ok && engine.prefixes()[badPrefix]
	})
	t.Logf("fixed Service up after %s", took)
	after := kernel()
	if s := after[badKey]; s.Scheduler != "rr" || len(s.Backends) != 1 {
		t.Errorf("fixed virtual server %+v, want rr with one real server", s)
	}
	delete(after, badKey)
	if !reflect.DeepEqual(before, after) {
		t.Errorf("fixing one Service changed the other virtual servers")
	}
	if got := len(engine.prefixes()); got != n {
		t.Errorf("%d routes after the fix, want %d", got, n)
	}
	calls, _ := rec.since(from)
	for _, call := range calls {
		touched, _ := planKeys(call.plan)
		for k := range touched {
			if k != badKey {
				t.Errorf("after the fix %v touches %s", call, k)
			}
		}
	}
}
