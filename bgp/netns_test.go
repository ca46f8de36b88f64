//go:build routing

package bgp_test

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/test/netns"
	"github.com/vipcast/vipcast/test/routers"
)

// TestKernelRoutesInNetns runs bgpd and zebra in a namespace connected by
// a veth pair (root only) and checks that an announced route reaches the
// namespace's kernel with the announced next hop, and leaves it on
// withdrawal.
func TestKernelRoutesInNetns(t *testing.T) {
	netns.Require(t)
	ns := netns.New(t, "bgp-tor")
	host, tor := pfx("10.254.77.1/30"), pfx("10.254.77.2/30")
	netns.Veth(t, nil, "vcbgp0", host.String(), ns, "eth0", tor.String())
	f := routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: tor.Addr(), Netns: ns.Name, Zebra: true,
		Neighbors: []routers.FRRNeighbor{{Address: host.Addr(), ASN: localASN}}})
	s, _ := newSpeaker(t, host.Addr().String())
	if err := s.SetPeers(ctxT(), []bgp.Peer{{Name: "tor", Address: tor.Addr(), Port: uint16(f.Port), ASN: routerASN,
		LocalASN: localASN, SourceAddress: host.Addr()}}); err != nil {
		t.Fatal(err)
	}
	vip := pfx("10.77.0.1/32")
	if err := s.Apply(ctxT(), []bgp.Route{{Prefix: vip, NextHop: host.Addr()}}, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the route is in the namespace's kernel", func() bool {
		r, err := f.KernelRoutes(routers.IPv4)
		return err == nil && slices.Equal(r[vip], []netip.Addr{host.Addr()})
	})
	r, _ := f.KernelRoutes(routers.IPv4)
	t.Logf("kernel routes in %s: %v", ns.Name, r)
	if err := s.Apply(ctxT(), nil, []netip.Prefix{vip}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the route leaves the kernel", func() bool {
		r, err := f.KernelRoutes(routers.IPv4)
		return err == nil && len(r[vip]) == 0
	})
}
