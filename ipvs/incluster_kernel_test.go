//go:build kernel

package ipvs

import (
	"bufio"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inClusterFlows is how many TCP connections the pod opens in
// testMoveInCluster: enough that tier 1 sends some to the other node.
const inClusterFlows = 30

// testMoveInCluster: with two tiers, pod pa1 on node A reaches the VIP of
// a Service whose pods run on both nodes. Tier 1 on node A sends some of
// its connections to node B, whose tier 2 answers from the VIP straight
// to pa1 over the pod network: node A must take those answers (a source
// that is one of its own addresses) and give them to the pod. Every
// connection is answered, some by node B's pod, and every pod sees pa1's
// own address.
//
// The kernel takes those answers only with accept_local, which PrepareTunnel
// sets; the two-tier raw chain keeps the martian check for the rest: from
// the fabric, a datagram to pod pa1 from node A's tunnel address (one of
// its own, not a VIP) is dropped, and so is one from the VIP to node A
// itself, while one from the VIP to the pod, and (the control) one from a
// foreign address, reach it.
//
// The connections are tried for an IPv6 VIP as well (IPv6 has no martian
// source check to keep).
func testMoveInCluster(t *testing.T) {
	eachFamily(t, func(t *testing.T, v6 bool) {
		f := newMoveFabricFamily(t, v6)
		for n := range f.nodes {
			twoTierNode(t, f, n)
		}
		inClusterConns(t, f)
		if !v6 {
			inClusterMartians(t, f)
		}
	})
}

// inClusterConns opens testMoveInCluster's connections from pa1.
func inClusterConns(t *testing.T, f *moveFabric) {
	self := f.pods[0][0] // pa1
	own := f.podAddr(self).String()
	onB := map[string]bool{}
	for _, p := range f.pods[1] {
		onB[p.name] = true
	}
	to := netip.AddrPortFrom(f.vip, movePort).String()
	fromB, failed := 0, 0
	for i := range inClusterFlows {
		var c net.Conn
		err := inNS(t, self.ns, func() (err error) {
			c, err = net.DialTimeout(f.network("tcp"), to, 2*time.Second)
			return err
		})
		var line string
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			line, err = bufio.NewReader(c).ReadString('\n')
			c.Close()
		}
		if err != nil {
			failed++
			t.Logf("connection %d from %s to the VIP: %v", i, self.name, err)
			continue
		}
		pod, src, _ := strings.Cut(strings.TrimSpace(line), " ")
		if onB[pod] {
			fromB++
		}
		if pod != self.name && src != own {
			t.Errorf("connection %d from %s reached %s from %s, want the pod's own address", i, self.name, pod, src)
		}
	}
	if fromB == 0 && failed == 0 {
		t.Fatalf("tier 1 sent none of %d connections to node B: the test proves nothing", inClusterFlows)
	}
	if failed > 0 {
		t.Errorf("%d of %d connections from %s (node A) to the VIP got no answer; %d answered by node B's pod", failed, inClusterFlows, self.name, fromB)
	}
	t.Logf("%d of %d connections from %s answered by node B's pod", fromB, inClusterFlows, self.name)
}

// inClusterMartians sends testMoveInCluster's martian sources from the
// fabric (the ToR's namespace, routing the pod and node A's addresses
// through node A).
func inClusterMartians(t *testing.T, f *moveFabric) {
	self := f.pods[0][0] // pa1
	route(t, f.hClient, self.v4(), f.fabricAddr(0).String())
	pod := podUDP(t, self, 9997)
	nodeA := nsUDP(t, f.nodes[0], netip.AddrPortFrom(f.fabricAddr(0), 9996))
	for _, c := range []struct {
		what     string
		src, dst netip.Addr
		recv     <-chan string
		want     bool
	}{
		{"a foreign address to the pod (the control)", ip("198.51.100.9"), self.v4(), pod, true},
		{"the VIP to the pod (another node's answer)", f.vip, self.v4(), pod, true},
		{"node A's tunnel address to the pod", tunnelAddr(0), self.v4(), pod, false},
		{"the VIP to node A itself", f.vip, f.fabricAddr(0), nodeA, false},
	} {
		if got := sendUDP(t, f, c.src, c.dst, c.recv); got != c.want {
			t.Errorf("from the fabric, a datagram from %s: received %v, want %v", c.what, got, c.want)
		}
	}
}

// sendUDP sends, from the ToR (the client namespace, with a raw socket
// that writes the IP header itself), a UDP datagram from src to dst, port
// 9997 for a pod and 9996 for a node, with a fresh marker, and reports
// whether recv gets that marker within a second.
func sendUDP(t *testing.T, f *moveFabric, src, dst netip.Addr, recv <-chan string) bool {
	t.Helper()
	port := uint16(9997)
	if dst == f.fabricAddr(0) {
		port = 9996
	}
	marker, udp := markedUDP("vipcast-martian", port)
	sendRaw(t, f, dst, ipv4Header(src, dst, unix.IPPROTO_UDP, udp))
	return received(recv, marker)
}

// localInClusterFlows is how many TCP connections each in-cluster client
// opens in testMoveLocalInCluster and testMoveHostInCluster.
const localInClusterFlows = 12

// askVIP opens a TCP connection from namespace ns to the VIP and returns
// the answering pod's name and the client address it saw.
func askVIP(t *testing.T, ns netns.NsHandle, f *moveFabric) (pod, src string, err error) {
	t.Helper()
	to := netip.AddrPortFrom(f.vip, movePort).String()
	var c net.Conn
	if err := inNS(t, ns, func() (err error) {
		c, err = net.DialTimeout(f.network("tcp"), to, 2*time.Second)
		return err
	}); err != nil {
		return "", "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", "", err
	}
	pod, src, _ = strings.Cut(strings.TrimSpace(line), " ")
	return pod, src, nil
}

// testMoveLocalInCluster: one tier, externalTrafficPolicy Local, the
// Service's only endpoint pb1 on node B. Node A has no endpoint: its
// virtual server is empty and it refuses the fabric's client. Its pod pa1
// (in Options.PodCIDRs) and node A itself are in-cluster clients: every
// connection of theirs is answered by pb1 through the in-cluster map, pa1
// with its own address kept, node A masqueraded to its own address (not
// the VIP's, which node B would take as its own). A client outside the
// source ranges of a restricted virtual server is not let through that
// way either. Before the map, pa1 and node A were refused. For an IPv4 VIP
// and an IPv6 one.
func testMoveLocalInCluster(t *testing.T) { eachFamily(t, moveLocalInCluster) }

func moveLocalInCluster(t *testing.T, v6 bool) {
	f := newMoveFabricFamily(t, v6)
	pb1 := f.pods[1][0]
	cluster := []Backend{{Addr: f.podAddr(pb1), Port: backendPort, Weight: 1}}
	pods := []netip.Prefix{
		netip.MustParsePrefix("10.61.0.0/16"), netip.MustParsePrefix("10.62.0.0/16"),
		netip.MustParsePrefix("fd00:61::/32"), netip.MustParsePrefix("fd00:62::/32"),
	}
	nodeA, outside, podsA := "10.53.0.1", netip.MustParsePrefix("10.50.0.0/24"), pods[0]
	if v6 {
		nodeA, outside, podsA = "fd00:53::1", netip.MustParsePrefix("fd00:50::/64"), pods[2]
	}
	var ds [2]*Dataplane
	svcOf := func(n int) Service {
		s := Service{VIP: f.vip, Port: movePort, Protocol: TCP, Cluster: cluster}
		if n == 1 {
			s.Backends = cluster
		}
		return s
	}
	for n := range f.nodes {
		must(t, inNS(t, f.nodes[n], func() (err error) {
			ds[n], err = New(Options{LinkName: "vip0", PodCIDRs: pods})
			return err
		}))
		d := ds[n]
		t.Cleanup(func() { d.Close() })
		if _, err := d.Sync(state(svcOf(n))); err != nil {
			t.Fatalf("node %d: Sync: %v", n, err)
		}
	}
	got, err := ds[0].ReadInCluster()
	must(t, err)
	if want := InClusterOf(state(svcOf(0))); !maps.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("node A's in-cluster map: %v, want %v", got, want)
	}

	pa1 := f.pods[0][0]
	for _, c := range []struct {
		who     string
		ns      netns.NsHandle
		wantSrc string
	}{
		{"pod pa1 on node A", pa1.ns, f.podAddr(pa1).String()},
		{"node A itself", f.nodes[0], nodeA}, // its address towards node B
	} {
		for i := range localInClusterFlows {
			pod, src, err := askVIP(t, c.ns, f)
			switch {
			case err != nil:
				t.Errorf("%s, connection %d to the Local VIP (no endpoint on node A): %v", c.who, i, err)
			case pod != pb1.name || src != c.wantSrc:
				t.Errorf("%s, connection %d: answered by %s, which saw %s; want %s seeing %s", c.who, i, pod, src, pb1.name, c.wantSrc)
			}
		}
	}
	// The fabric's client through node A: Local, no endpoint there.
	f.steer(t, 0)
	if pod, _, err := askVIP(t, f.client, f); err == nil {
		t.Errorf("the fabric's client through node A (no endpoint, Local) was answered by %s: the in-cluster path took a client from outside", pod)
	}
	// The control: through node B it is answered, with its own address.
	f.steer(t, 1)
	if pod, src, err := askVIP(t, f.client, f); err != nil || pod != pb1.name || src != f.src.String() {
		t.Errorf("the fabric's client through node B: %s saw %s (%v), want %s seeing %s", pod, src, err, pb1.name, f.src)
	}
	if !v6 {
		forgedPodSource(t, f, ds[0], state(svcOf(0)))
	}

	// Source ranges: admitting the fabric's client only, pa1 is not let
	// through the map (and the VIP filter drops it); admitting pa1's
	// range, it is.
	for _, c := range []struct {
		ranges []netip.Prefix
		want   bool
	}{
		{[]netip.Prefix{outside}, false},
		{[]netip.Prefix{podsA}, true},
	} {
		s := svcOf(0)
		s.Restricted, s.SourceRanges = true, c.ranges
		if _, err := ds[0].Sync(state(s)); err != nil {
			t.Fatalf("node A: Sync restricted to %v: %v", c.ranges, err)
		}
		pod, _, err := askVIP(t, pa1.ns, f)
		if answered := err == nil; answered != c.want {
			t.Errorf("source ranges %v: pa1's connection answered %v (by %q, %v), want %v", c.ranges, answered, pod, err, c.want)
		}
	}
}

// testMoveHostInCluster: two tiers; a node's own connections to the VIP
// (the host, not its pods) leave from the VIP, and another node's pod
// answers to the VIP, which is that node's own address. With Cluster
// endpoints the in-cluster map sends them straight to a pod, masqueraded:
// every one of node A's connections is answered, some by node B's pod.
// For an IPv4 VIP and an IPv6 one.
func testMoveHostInCluster(t *testing.T) { eachFamily(t, moveHostInCluster) }

func moveHostInCluster(t *testing.T, v6 bool) {
	f := newMoveFabricFamily(t, v6)
	var cluster []Backend
	for _, p := range f.allPods() {
		cluster = append(cluster, Backend{Addr: f.podAddr(p), Port: backendPort, Weight: 1})
	}
	for n := range f.nodes {
		d, desired := twoTierNode(t, f, n)
		for k, s := range desired.Services {
			s.Cluster = cluster
			desired.Services[k] = s
		}
		if _, err := d.Sync(desired); err != nil {
			t.Fatalf("node %d: Sync with Cluster endpoints: %v", n, err)
		}
	}
	onB := 0
	for i := range 2 * localInClusterFlows {
		pod, src, err := askVIP(t, f.nodes[0], f)
		switch {
		case err != nil:
			t.Errorf("node A itself, connection %d to the VIP: %v", i, err)
		case src == f.vip.String():
			t.Errorf("node A itself, connection %d: %s saw the VIP as its client", i, pod)
		case pod == f.pods[1][0].name:
			onB++
		}
	}
	if onB == 0 {
		t.Errorf("none of node A's %d connections reached node B's pod: the test proves nothing", 2*localInClusterFlows)
	}
}

// forgedPodSource: on node A of testMoveLocalInCluster (one tier, Local,
// no endpoint; desired its state), a UDP virtual server on the VIP, port
// 9997, whose Cluster endpoint is pb1. A datagram from pa1 reaches pb1
// through the in-cluster map (the control); the same datagram forged by
// the fabric's client, pa1's address as its source, sent to node A, does
// not: it came in on the fabric, not on the interface node A routes pa1
// through, so it is not taken for a pod's.
func forgedPodSource(t *testing.T, f *moveFabric, d *Dataplane, desired State) {
	t.Helper()
	pa1, pb1 := f.pods[0][0], f.pods[1][0]
	const port = 9997
	udp := Service{VIP: f.vip, Port: port, Protocol: UDP, Cluster: []Backend{{Addr: pb1.v4(), Port: port, Weight: 1}}}
	desired.Services[udp.Key()] = udp
	if _, err := d.Sync(desired); err != nil {
		t.Fatalf("node A: Sync with a UDP virtual server: %v", err)
	}
	recv := podUDP(t, pb1, port)
	if !sendUDPFrom(t, pa1.ns, pa1.v4(), netip.AddrPortFrom(f.vip, port), recv) {
		t.Fatalf("pa1's datagram to the VIP did not reach %s through the in-cluster map: the forged case proves nothing", pb1.name)
	}
	f.steer(t, 0)
	if sendUDP(t, f, pa1.v4(), f.vip, recv) {
		t.Errorf("a datagram from the fabric with pa1's address forged as its source reached %s through node A's in-cluster map", pb1.name)
	}
}
