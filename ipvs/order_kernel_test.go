//go:build kernel

package ipvs

import (
	"net"
	"slices"
	"testing"

	libipvs "github.com/moby/ipvs"
	"golang.org/x/sys/unix"

	"github.com/vipcast/vipcast/test/vm"
)

// TestKernelTier1Order: IPVS mh fills its table from the real servers in
// the kernel's list order, which is the order they were added (each new one
// goes first), so tier 1 of the two-tier dataplane picks the same node for
// a flow on every node only when every node's list is in the same order.
// Two nodes that learned the nodes with endpoints in different orders (one
// saw node .12 first, then .11; the other both at once) end with the same
// list; so does a node where a third one joins later.
func TestKernelTier1Order(t *testing.T) {
	if !vm.InVM() {
		kernelSuite.Run(t)
		return
	}
	tier1 := func(nodes ...string) State {
		var bs []Backend
		for _, n := range nodes {
			bs = append(bs, Backend{Addr: ip(n), Port: 80, Weight: 2, Tunnel: true})
		}
		return state(Service{VIP: ip("192.0.2.81"), Port: 80, Protocol: TCP, Backends: bs,
			Local: []Backend{{Addr: ip("10.61.1.2"), Port: 8080, Weight: 1}}})
	}
	order := func(n *teardownNode) []string {
		t.Helper()
		svc := &libipvs.Service{Address: net.ParseIP("192.0.2.81"), Protocol: unix.IPPROTO_TCP, Port: 80, AddressFamily: unix.AF_INET}
		dests, err := n.ih.GetDestinations(svc)
		must(t, err)
		var out []string
		for _, d := range dests {
			out = append(out, d.Address.String())
		}
		return out
	}
	late := newTeardownNode(t, Options{LinkName: "vip-late", Tunnel: &Tunnel{Self: ip("10.52.0.11"), MTU: 9000}})
	syncOK(t, late.d, tier1("10.52.0.12"))
	syncOK(t, late.d, tier1("10.52.0.11", "10.52.0.12"))
	once := newTeardownNode(t, Options{LinkName: "vip-once", Tunnel: &Tunnel{Self: ip("10.52.0.12"), MTU: 9000}})
	syncOK(t, once.d, tier1("10.52.0.11", "10.52.0.12"))
	if a, b := order(late), order(once); !slices.Equal(a, b) {
		t.Fatalf("tier 1's real servers in kernel order: %v on the node that learned .12 first, %v on the one that learned both at once: mh would give them different tables", a, b)
	}
	// A third node with endpoints joins, sorting between the others.
	syncOK(t, late.d, tier1("10.52.0.11", "10.52.0.115", "10.52.0.12"))
	syncOK(t, once.d, tier1("10.52.0.11", "10.52.0.115", "10.52.0.12"))
	fresh := newTeardownNode(t, Options{LinkName: "vip-fresh", Tunnel: &Tunnel{Self: ip("10.52.0.115"), MTU: 9000}})
	syncOK(t, fresh.d, tier1("10.52.0.11", "10.52.0.115", "10.52.0.12"))
	a, b, c := order(late), order(once), order(fresh)
	if !slices.Equal(a, b) || !slices.Equal(a, c) {
		t.Fatalf("after a third node joined, kernel orders %v, %v and %v: want one order on every node", a, b, c)
	}
	// Weights change in place: the order stays.
	st := tier1("10.52.0.11", "10.52.0.115", "10.52.0.12")
	svc := st.Services[Key{VIP: ip("192.0.2.81"), Port: 80, Protocol: TCP}]
	svc.Backends[0].Weight = 0
	st.Services[svc.Key()] = svc
	syncOK(t, late.d, st)
	if got := order(late); !slices.Equal(got, c) {
		t.Fatalf("after a weight change, kernel order %v, want %v", got, c)
	}
}
