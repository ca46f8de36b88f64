package ipvs

import (
	"net/netip"
	"slices"
	"testing"
)

// TestHairpinOf: the endpoints whose own connections through the VIP the
// hairpin rule masquerades: one tier's without source NAT, tier 2's; none
// of a virtual server with source NAT, which masquerades them all.
func TestHairpinOf(t *testing.T) {
	a, b := ip("10.0.0.1"), ip("10.0.0.2")
	node := Backend{Addr: ip("100.127.0.1"), Port: 80, Weight: 2, Tunnel: true}
	slots := []netip.AddrPort{netip.AddrPortFrom(b, 8080), {}, netip.AddrPortFrom(a, 8080), netip.AddrPortFrom(b, 8080)}
	for _, tc := range []struct {
		name  string
		svc   Service
		slots []netip.AddrPort
		want  []netip.Addr
	}{
		{"one tier, Local", Service{Backends: []Backend{be("10.0.0.2", 8080, 1), be("10.0.0.1", 8080, 0)}}, nil, []netip.Addr{a, b}},
		{"one tier, Cluster (source NAT)", Service{SNAT: true, Backends: []Backend{be("10.0.0.1", 8080, 1)}}, nil, nil},
		{"two tiers: tier 2's endpoints", Service{Backends: []Backend{node}}, slots, []netip.Addr{a, b}},
		{"two tiers, no local endpoint", Service{Backends: []Backend{node}}, nil, nil},
	} {
		if got := hairpinOf(tc.svc, tc.slots); !slices.Equal(got, tc.want) {
			t.Errorf("%s: hairpinOf = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestHairpins: the union counts each endpoint once per virtual server
// that needs it; set reports when the union changes.
func TestHairpins(t *testing.T) {
	a, b := ip("10.0.0.1"), ip("10.0.0.2")
	k1 := Key{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP}
	k2 := Key{VIP: ip("192.0.2.1"), Port: 53, Protocol: UDP}
	var h hairpins
	steps := []struct {
		key     Key
		addrs   []netip.Addr
		changed bool
		all     []netip.Addr
	}{
		{k1, []netip.Addr{a, b}, true, []netip.Addr{a, b}},
		{k2, []netip.Addr{a}, false, []netip.Addr{a, b}},
		{k1, []netip.Addr{b}, false, []netip.Addr{a, b}}, // a still k2's
		{k2, nil, true, []netip.Addr{b}},
		{k1, nil, true, nil},
	}
	for i, s := range steps {
		if got := h.set(s.key, s.addrs); got != s.changed {
			t.Errorf("step %d: set(%v, %v) changed = %v, want %v", i, s.key, s.addrs, got, s.changed)
		}
		all := h.all()
		slices.SortFunc(all, netip.Addr.Compare)
		if !slices.Equal(all, s.all) {
			t.Errorf("step %d: all = %v, want %v", i, all, s.all)
		}
	}
	if miss := h.missing(map[Key][]netip.Addr{k1: {a}}); !slices.Equal(miss, []netip.Addr{a}) {
		t.Errorf("missing = %v, want [%v]", miss, a)
	}
}

// TestSetCodec: the hairpin set's keys are the address twice; a key whose
// halves differ is not one of them.
func TestSetCodec(t *testing.T) {
	for _, a := range []netip.Addr{ip("10.0.0.1"), ip("fd00::1")} {
		for _, c := range []setCodec{addrCodec, pairCodec} {
			if got, ok := c.addr(c.key(a)); !ok || got != a {
				t.Errorf("codec %v: %v round trip = %v, %v", c, a, got, ok)
			}
		}
	}
	if _, ok := pairCodec.addr([]byte{10, 0, 0, 1, 10, 0, 0, 2}); ok {
		t.Error("pairCodec took a key whose halves differ")
	}
}
