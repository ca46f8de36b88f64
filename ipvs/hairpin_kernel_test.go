//go:build kernel

package ipvs

import (
	"bufio"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// hairpinFlows is how many TCP connections and UDP flows a pod opens to
// its own Service's VIP in testMoveHairpin: enough that some come back to
// it.
const hairpinFlows = 20

// testMoveHairpin: pod pa1, an endpoint of the Service, reaches the VIP
// and is balanced, for some of its flows, to itself; every flow is
// answered (hairpin.go masquerades those, so the pod's answer to itself
// comes back through the node), and the pod sees the node's address on
// them, while another pod sees pa1's own address on its flows (the rule
// touches the hairpin case only). One tier under Local policy (no source
// NAT; node A's pods), and
// two tiers, each for an IPv4 VIP and an IPv6 one. Before the hairpin
// rule, the flows back to pa1 failed.
func testMoveHairpin(t *testing.T) { eachFamily(t, moveHairpin) }

func moveHairpin(t *testing.T, v6 bool) {
	for _, twoTier := range []bool{false, true} {
		t.Run(map[bool]string{false: "OneTierLocal", true: "TwoTier"}[twoTier], func(t *testing.T) {
			f := newMoveFabricFamily(t, v6)
			if twoTier {
				// Node B without pods: tier 1 sends every flow to node A,
				// whose tier 2 balances it over pa1 and pa2. (A pod's
				// flow that tier 1 sends to another node is not this
				// test's matter.)
				f.pods[1] = nil
				for n := range f.nodes {
					twoTierNode(t, f, n)
				}
			} else {
				var local []Backend
				for _, p := range f.pods[0] {
					local = append(local, Backend{Addr: f.podAddr(p), Port: backendPort, Weight: 1})
				}
				tcp := Service{VIP: f.vip, Port: movePort, Protocol: TCP, Backends: local}
				udp := tcp
				udp.Protocol = UDP
				var d *Dataplane
				must(t, inNS(t, f.nodes[0], func() (err error) {
					d, err = New(Options{LinkName: "vip0"})
					return err
				}))
				t.Cleanup(func() { d.Close() })
				if _, err := d.Sync(state(tcp, udp)); err != nil {
					t.Fatalf("Sync: %v", err)
				}
			}
			self := f.pods[0][0] // pa1
			own := f.podAddr(self).String()
			to := netip.AddrPortFrom(f.vip, movePort).String()
			back := 0
			for i := range 2 * hairpinFlows {
				network := f.network("tcp")
				if i >= hairpinFlows {
					network = f.network("udp")
				}
				var c net.Conn
				must(t, inNS(t, self.ns, func() (err error) {
					c, err = net.DialTimeout(network, to, 2*time.Second)
					return err
				}))
				var line string
				var err error
				if network == f.network("tcp") {
					_ = c.SetDeadline(time.Now().Add(2 * time.Second))
					line, err = bufio.NewReader(c).ReadString('\n')
				} else {
					var pod string
					for try := 0; try < 3 && pod == ""; try++ {
						_ = c.SetDeadline(time.Now().Add(time.Second))
						if _, err = c.Write([]byte("ping\n")); err == nil {
							buf := make([]byte, 1500)
							var k int
							if k, err = c.Read(buf); err == nil {
								line, pod = string(buf[:k]), "answered"
							}
						}
					}
				}
				c.Close()
				if err != nil {
					t.Errorf("%s flow %d from %s to its own Service's VIP: %v", network, i, self.name, err)
					continue
				}
				pod, src, _ := strings.Cut(strings.TrimSpace(line), " ")
				switch {
				case pod == self.name:
					back++
					if src == own {
						t.Errorf("%s flow %d came back to %s from its own address %s: not masqueraded", network, i, pod, src)
					}
				case src != own:
					// The rule masquerades a pod's flow to itself only.
					t.Errorf("%s flow %d from %s reached %s from %s, want %s's own address", network, i, self.name, pod, src, self.name)
				}
			}
			if back == 0 {
				t.Fatalf("none of %d flows from %s came back to it: the test proves nothing", 2*hairpinFlows, self.name)
			}
			t.Logf("%d of %d flows from %s to its Service's VIP came back to it, all answered", back, 2*hairpinFlows, self.name)
		})
	}
}
