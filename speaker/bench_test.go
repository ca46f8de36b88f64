package speaker

import (
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/api/v1alpha1"
	fx "github.com/vipcast/vipcast/api/v1alpha1/v1alpha1test"
)

const benchServices = 10000

// benchFixture builds 10,000 dual-stack Services with VIPs from one pool,
// each with an IPv4 and an IPv6 EndpointSlice of three endpoints (one of
// them on this node for every other Service), and a "down" variant of the
// slices with no ready endpoint.
func benchFixture(localPolicy bool) (svcs []*v1.Service, up, down [][]*discoveryv1.EndpointSlice, keys []string) {
	for i := range benchServices {
		name := fmt.Sprintf("svc-%05d", i)
		ip4 := netip.AddrFrom4([4]byte{192, 168, byte(i >> 8), byte(i)})
		ip6 := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)})
		s := mkSvc(name, ip4.String(), ip6.String())
		if localPolicy {
			local(s)
		}
		here := "n2"
		if i%2 == 0 {
			here = "n1"
		}
		eps := []ep{{node: here, ready: yes}, {node: "n3", ready: yes}, {node: "n4"}}
		downEps := []ep{{node: here, ready: no, term: true}, {node: "n3", ready: no}, {node: "n4", ready: no}}
		svcs = append(svcs, s)
		up = append(up, []*discoveryv1.EndpointSlice{mkSlice(name, v4, eps...), mkSlice(name, v6, eps...)})
		down = append(down, []*discoveryv1.EndpointSlice{mkSlice(name, v4, downEps...), mkSlice(name, v6, downEps...)})
		keys = append(keys, ServiceKey(s))
	}
	return svcs, up, down, keys
}

func benchView(b *testing.B, aggregate bool) *View {
	p := fx.Pool("bench", 0, "192.168.0.0/16", "2001:db8::/112")
	bgpCfg := v1alpha1.IPPoolBGP{
		Communities:      []string{"64512:100", "no-export"},
		LargeCommunities: []string{"4200000000:1:2"},
		LocalPref:        ptr.To[uint32](100),
		PeerSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{"role": "tor"}},
	}
	if aggregate {
		bgpCfg.AggregationLength = ptr.To[int32](24)
		bgpCfg.AggregationLengthV6 = ptr.To[int32](120)
	}
	fx.WithBGP(p, bgpCfg)
	// A hundred other pools, so the containment lookup is not trivial.
	pools := []*v1alpha1.IPPool{p}
	for i := range 100 {
		pools = append(pools, fx.Pool(fmt.Sprintf("other-%d", i), i+1, fmt.Sprintf("10.%d.0.0/16", i+10)))
	}
	peers := []*v1alpha1.BGPPeer{
		mkPeer("tor-a", "10.0.0.254", map[string]string{"role": "tor"}),
		mkPeer("tor-b", "10.0.0.253", map[string]string{"role": "tor"}),
	}
	view, errs := Compile(pools, peers, testNode())
	if len(errs) > 0 {
		b.Fatal(errs)
	}
	return view
}

// BenchmarkServiceRoutes measures one Service's update as the speaker does
// it: ServiceRoutes, then RouteTable.Set, in a table holding the routes of
// 10,000 dual-stack Services (20,000 VIPs). ns/op is per Service.
//
//   - resync: the routes did not change (a resync or an unrelated update);
//   - flap: every update turns the Service's endpoints down or back up, so
//     each Set withdraws or announces its prefixes (or, under aggregation,
//     changes the refcount of a shared /24 and /120).
func BenchmarkServiceRoutes(b *testing.B) {
	for _, bc := range []struct {
		name      string
		local     bool
		aggregate bool
	}{
		{"Cluster", false, false},
		{"Local", true, false},
		{"ClusterAggregated", false, true},
	} {
		svcs, up, down, keys := benchFixture(bc.local)
		view := benchView(b, bc.aggregate)
		fill := func() *RouteTable {
			tab := NewRouteTable()
			for i, s := range svcs {
				routes, _ := ServiceRoutes(s, up[i], view)
				tab.Set(keys[i], routes)
			}
			return tab
		}
		b.Run(bc.name+"/resync", func(b *testing.B) {
			tab := fill()
			b.ReportAllocs()
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				i := n % benchServices
				routes, _ := ServiceRoutes(svcs[i], up[i], view)
				tab.Set(keys[i], routes)
			}
		})
		b.Run(bc.name+"/flap", func(b *testing.B) {
			tab := fill()
			b.ReportAllocs()
			b.ResetTimer()
			changes := 0
			for n := 0; n < b.N; n++ {
				i := n % benchServices
				slices := down[i]
				if (n/benchServices)%2 == 1 {
					slices = up[i]
				}
				routes, _ := ServiceRoutes(svcs[i], slices, view)
				a, w := tab.Set(keys[i], routes)
				changes += len(a) + len(w)
			}
			b.ReportMetric(float64(changes)/float64(b.N), "changes/op")
		})
	}
	b.Run("FullPass10k", func(b *testing.B) {
		svcs, up, _, keys := benchFixture(false)
		view := benchView(b, false)
		b.ReportAllocs()
		b.ResetTimer()
		for n := 0; n < b.N; n++ {
			tab := NewRouteTable()
			for i, s := range svcs {
				routes, _ := ServiceRoutes(s, up[i], view)
				tab.Set(keys[i], routes)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchServices), "ns/service")
	})
}
