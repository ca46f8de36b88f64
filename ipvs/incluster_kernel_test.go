//go:build kernel

package ipvs

import (
	"bufio"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

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
func testMoveInCluster(t *testing.T) {
	f := newMoveFabric(t)
	for n := range f.nodes {
		twoTierNode(t, f, n)
	}
	self := f.pods[0][0] // pa1
	onB := map[string]bool{}
	for _, p := range f.pods[1] {
		onB[p.name] = true
	}
	to := netip.AddrPortFrom(f.vip, movePort).String()
	fromB, failed := 0, 0
	for i := range inClusterFlows {
		var c net.Conn
		err := inNS(t, self.ns, func() (err error) {
			c, err = net.DialTimeout("tcp4", to, 2*time.Second)
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
		if pod != self.name && src != self.v4().String() {
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

	// Martian sources from the fabric (the ToR's namespace, routing the
	// pod and node A's addresses through node A).
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
