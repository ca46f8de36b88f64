package ipvs

import (
	"net"
	"net/netip"
	"reflect"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestStaleFlows: the endpoints a tier-2 plan takes out of a UDP or SCTP
// virtual server for good are its stale flows; one that only loses its
// slots (weight 0: it drains, as a terminating endpoint does), TCP, and
// slots that move between endpoints that stay are not.
func TestStaleFlows(t *testing.T) {
	udp := Key{VIP: ip("192.0.2.1"), Port: 53, Protocol: UDP}
	sctp := Key{VIP: ip("192.0.2.1"), Port: 9, Protocol: SCTP}
	tcp := Key{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP}
	a := netip.MustParseAddrPort("10.0.0.1:8080")
	b := netip.MustParseAddrPort("10.0.0.2:8080")
	local := withLocal
	del := func(k Key, to ...netip.AddrPort) Tier2Plan {
		var p Tier2Plan
		for i, ap := range to {
			p.Del = append(p.Del, Tier2Slot{Key: k, Slot: i, To: ap})
		}
		return p
	}
	for _, tc := range []struct {
		name    string
		plan    Tier2Plan
		desired *Service
		want    []StaleFlow
	}{
		{"UDP endpoint gone", del(udp, a, a, b), local(udp, map[netip.AddrPort]int{b: 1}), []StaleFlow{{udp, a}}},
		{"SCTP endpoint gone", del(sctp, a), local(sctp, map[netip.AddrPort]int{b: 1}), []StaleFlow{{sctp, a}}},
		{"UDP endpoint draining keeps its flows", del(udp, a, a), local(udp, map[netip.AddrPort]int{a: 0, b: 1}), nil},
		{"TCP endpoint gone: nothing", del(tcp, a), local(tcp, map[netip.AddrPort]int{b: 1}), nil},
		{"virtual server gone", del(udp, a, b), nil, []StaleFlow{{udp, a}, {udp, b}}},
		{"slot moved between endpoints that stay", del(udp, a), local(udp, map[netip.AddrPort]int{a: 1, b: 2}), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var key Key
			if len(tc.plan.Del) > 0 {
				key = tc.plan.Del[0].Key
			}
			if got := staleFlows(tc.plan, desiredOne(key, tc.desired)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("staleFlows = %v, want %v", got, tc.want)
			}
			st := State{Services: map[Key]Service{}}
			if tc.desired != nil {
				st.Services[key] = *tc.desired
			}
			if got := staleFlows(tc.plan, desiredIn(st)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("staleFlows over a State = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestServingSets: an endpoint that drained first (weight 0, its slots
// gone with nothing stale) and leaves later makes its flows stale when it
// leaves, although no slot changes then; so does every endpoint of a
// virtual server that goes, in a Sync as in a SyncService. TCP is never
// recorded.
func TestServingSets(t *testing.T) {
	udp := Key{VIP: ip("192.0.2.1"), Port: 53, Protocol: UDP}
	tcp := Key{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP}
	a := netip.MustParseAddrPort("10.0.0.1:8080")
	b := netip.MustParseAddrPort("10.0.0.2:8080")
	svc := withLocal
	s := servingSets{}
	steps := []struct {
		name    string
		key     Key
		desired *Service
		want    []StaleFlow
	}{
		{"a and b", udp, svc(udp, map[netip.AddrPort]int{a: 1, b: 1}), nil},
		{"a drains", udp, svc(udp, map[netip.AddrPort]int{a: 0, b: 1}), nil},
		{"a leaves", udp, svc(udp, map[netip.AddrPort]int{b: 1}), []StaleFlow{{udp, a}}},
		{"a leaves again: nothing new", udp, svc(udp, map[netip.AddrPort]int{b: 1}), nil},
		{"TCP", tcp, svc(tcp, map[netip.AddrPort]int{a: 1}), nil},
		{"TCP endpoint leaves", tcp, svc(tcp, nil), nil},
		{"virtual server goes", udp, nil, []StaleFlow{{udp, b}}},
	}
	for _, st := range steps {
		if got := s.update(st.key, st.desired); !reflect.DeepEqual(got, st.want) {
			t.Errorf("%s: stale %v, want %v", st.name, got, st.want)
		}
	}
	if len(s) != 0 {
		t.Errorf("after every virtual server went: %v, want nothing recorded", s)
	}

	// A full Sync's view: the same, over whole States.
	all := servingSets{}
	both := State{Services: map[Key]Service{udp: *svc(udp, map[netip.AddrPort]int{a: 0, b: 1})}}
	if got := all.updateAll(both); got != nil {
		t.Errorf("first Sync: stale %v, want none", got)
	}
	if got := all.updateAll(NewState()); !reflect.DeepEqual(got, []StaleFlow{{udp, a}, {udp, b}}) {
		t.Errorf("Sync without the virtual server: stale %v, want both endpoints, the drained one too", got)
	}
	if got := mergeStale([]StaleFlow{{udp, b}}, []StaleFlow{{udp, a}, {udp, b}}); !reflect.DeepEqual(got, []StaleFlow{{udp, a}, {udp, b}}) {
		t.Errorf("mergeStale = %v, want sorted without repeats", got)
	}
}

// withLocal returns the virtual server k with the Local endpoints ws, at
// their weights.
func withLocal(k Key, ws map[netip.AddrPort]int) *Service {
	s := Service{VIP: k.VIP, Port: k.Port, Protocol: k.Protocol}
	for ap, w := range ws {
		s.Local = append(s.Local, Backend{Addr: ap.Addr(), Port: ap.Port(), Weight: w})
	}
	return &s
}

// TestServedBy: the full Sync after New deletes the conntrack entries of
// UDP and SCTP flows that went to an endpoint the virtual server no longer
// lists (Local at any weight, or a real server); a flow not DNATed (tier
// 1's, tunnelled with the VIP kept), to an endpoint still listed, of TCP,
// or to another virtual server is left.
func TestServedBy(t *testing.T) {
	svc := Service{VIP: ip("192.0.2.1"), Port: 53, Protocol: UDP,
		Backends: []Backend{{Addr: ip("10.52.0.2"), Port: 53, Weight: 1, Tunnel: true}},
		Local:    []Backend{{Addr: ip("10.0.0.1"), Port: 8053, Weight: 0}, {Addr: ip("10.0.0.2"), Port: 8053, Weight: 1}}}
	tcp := svc
	tcp.Protocol = TCP
	gone := []StaleFlow{{Key: Key{VIP: ip("192.0.2.7"), Port: 53, Protocol: UDP}, To: netip.MustParseAddrPort("10.0.0.5:8053")}}
	served := servedByOf(state(svc, tcp), gone)
	flow := func(proto Protocol, dst, replySrc string) *netlink.ConntrackFlow {
		d, r := netip.MustParseAddrPort(dst), netip.MustParseAddrPort(replySrc)
		return &netlink.ConntrackFlow{
			Forward: netlink.IPTuple{Protocol: uint8(proto), SrcIP: net.ParseIP("192.168.50.2"), SrcPort: 5353, DstIP: d.Addr().AsSlice(), DstPort: d.Port()},
			Reverse: netlink.IPTuple{Protocol: uint8(proto), SrcIP: r.Addr().AsSlice(), SrcPort: r.Port(), DstIP: net.ParseIP("192.168.50.2"), DstPort: 5353},
		}
	}
	for _, tc := range []struct {
		name string
		flow *netlink.ConntrackFlow
		want bool
	}{
		{"to an endpoint that left", flow(UDP, "192.0.2.1:53", "10.0.0.3:8053"), true},
		{"to a draining endpoint", flow(UDP, "192.0.2.1:53", "10.0.0.1:8053"), false},
		{"to a serving endpoint", flow(UDP, "192.0.2.1:53", "10.0.0.2:8053"), false},
		{"to another port of a serving endpoint", flow(UDP, "192.0.2.1:53", "10.0.0.2:9053"), true},
		{"not DNATed (tier 1)", flow(UDP, "192.0.2.1:53", "192.0.2.1:53"), false},
		{"TCP", flow(TCP, "192.0.2.1:53", "10.0.0.3:8053"), false},
		{"another virtual server", flow(UDP, "192.0.2.9:53", "10.0.0.3:8053"), false},
		{"a virtual server that goes", flow(UDP, "192.0.2.7:53", "10.0.0.5:8053"), true},
		{"a virtual server that goes, to another endpoint", flow(UDP, "192.0.2.7:53", "10.0.0.6:8053"), true},
		{"a virtual server that goes, not DNATed", flow(UDP, "192.0.2.7:53", "192.0.2.7:53"), false},
		{"IPv4-mapped addresses", &netlink.ConntrackFlow{
			Forward: netlink.IPTuple{Protocol: uint8(UDP), DstIP: net.ParseIP("::ffff:192.0.2.1"), DstPort: 53},
			Reverse: netlink.IPTuple{Protocol: uint8(UDP), SrcIP: net.ParseIP("::ffff:10.0.0.3"), SrcPort: 8053},
		}, true},
	} {
		if got := served.MatchConntrackFlow(tc.flow); got != tc.want {
			t.Errorf("%s: matched %v, want %v", tc.name, got, tc.want)
		}
	}
}
