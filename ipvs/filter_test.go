package ipvs

import (
	"net/netip"
	"reflect"
	"testing"
)

func filterOf(vips []string, keys ...Key) Filter {
	f := NewFilter()
	for _, v := range vips {
		f.VIPs[ip(v)] = struct{}{}
	}
	for _, k := range keys {
		f.Allow[k] = struct{}{}
	}
	return f
}

func TestFilterOf(t *testing.T) {
	tcp := func(vip string, port uint16) Key { return Key{VIP: ip(vip), Port: port, Protocol: TCP} }
	udp := func(vip string, port uint16) Key { return Key{VIP: ip(vip), Port: port, Protocol: UDP} }
	desired := state(
		svc("192.0.2.1", 80),
		svc("192.0.2.1", 443, be("10.0.0.1", 8443, 1)),
		Service{VIP: ip("::ffff:192.0.2.2"), Port: 53, Protocol: UDP}, // mapped: unmapped
		svc("2001:db8::1", 80),                                        // no real server: still let through
	)
	desired.AddVIP(ip("192.0.2.9")) // bound, no virtual server: filtered, nothing let through
	got := FilterOf(desired)
	want := filterOf([]string{"192.0.2.1", "192.0.2.2", "192.0.2.9", "2001:db8::1"},
		tcp("192.0.2.1", 80), tcp("192.0.2.1", 443), udp("192.0.2.2", 53), tcp("2001:db8::1", 80))
	if !reflect.DeepEqual(got, want) {
		t.Errorf("FilterOf:\n got %+v\nwant %+v", got, want)
	}
	if got := FilterOf(NewState()); len(got.VIPs) != 0 || len(got.Allow) != 0 {
		t.Errorf("FilterOf(empty) = %+v, want empty", got)
	}
}

func TestDiffFilter(t *testing.T) {
	k := func(vip string, port uint16, p Protocol) Key { return Key{VIP: ip(vip), Port: port, Protocol: p} }
	tests := []struct {
		name       string
		want, have Filter
		plan       FilterPlan
	}{
		{name: "empty", want: NewFilter(), have: NewFilter()},
		{
			name: "from empty",
			want: filterOf([]string{"192.0.2.1", "2001:db8::1"}, k("192.0.2.1", 80, TCP), k("2001:db8::1", 53, UDP)),
			have: NewFilter(),
			plan: FilterPlan{
				AddVIPs:  []netip.Addr{ip("192.0.2.1"), ip("2001:db8::1")},
				AddAllow: []Key{k("192.0.2.1", 80, TCP), k("2001:db8::1", 53, UDP)},
			},
		},
		{
			name: "no change",
			want: filterOf([]string{"192.0.2.1"}, k("192.0.2.1", 80, TCP)),
			have: filterOf([]string{"192.0.2.1"}, k("192.0.2.1", 80, TCP)),
		},
		{
			name: "a port gained, a port lost, the others kept",
			want: filterOf([]string{"192.0.2.1"}, k("192.0.2.1", 80, TCP), k("192.0.2.1", 8080, TCP)),
			have: filterOf([]string{"192.0.2.1"}, k("192.0.2.1", 80, TCP), k("192.0.2.1", 443, TCP)),
			plan: FilterPlan{AddAllow: []Key{k("192.0.2.1", 8080, TCP)}, DelAllow: []Key{k("192.0.2.1", 443, TCP)}},
		},
		{
			name: "same port, other protocol",
			want: filterOf([]string{"192.0.2.1"}, k("192.0.2.1", 53, UDP)),
			have: filterOf([]string{"192.0.2.1"}, k("192.0.2.1", 53, TCP)),
			plan: FilterPlan{AddAllow: []Key{k("192.0.2.1", 53, UDP)}, DelAllow: []Key{k("192.0.2.1", 53, TCP)}},
		},
		{
			name: "drift: elements deleted and added by hand",
			want: filterOf([]string{"192.0.2.1", "192.0.2.2"}, k("192.0.2.1", 80, TCP), k("192.0.2.2", 80, TCP)),
			have: filterOf([]string{"192.0.2.1", "192.0.2.7"}, k("192.0.2.1", 80, TCP), k("192.0.2.1", 22, TCP)),
			plan: FilterPlan{
				AddVIPs:  []netip.Addr{ip("192.0.2.2")},
				AddAllow: []Key{k("192.0.2.2", 80, TCP)},
				DelAllow: []Key{k("192.0.2.1", 22, TCP)},
				DelVIPs:  []netip.Addr{ip("192.0.2.7")},
			},
		},
		{
			name: "everything gone",
			want: NewFilter(),
			have: filterOf([]string{"192.0.2.1"}, k("192.0.2.1", 80, TCP)),
			plan: FilterPlan{DelAllow: []Key{k("192.0.2.1", 80, TCP)}, DelVIPs: []netip.Addr{ip("192.0.2.1")}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DiffFilter(tt.want, tt.have)
			if !reflect.DeepEqual(clean(Plan{Filter: got}).Filter, clean(Plan{Filter: tt.plan}).Filter) {
				t.Fatalf("DiffFilter:\n got %+v\nwant %+v", got, tt.plan)
			}
			after := tt.have.Clone()
			got.ApplyTo(&after)
			if !reflect.DeepEqual(after, tt.want) {
				t.Errorf("after ApplyTo: %+v, want %+v", after, tt.want)
			}
			if got.Len() != len(got.AddVIPs)+len(got.AddAllow)+len(got.DelAllow)+len(got.DelVIPs) {
				t.Errorf("Len %d", got.Len())
			}
		})
	}
}

// TestFilterStep: the incremental path (one virtual server at a time) keeps
// the filter equal to FilterOf of the state it programs.
func TestFilterStep(t *testing.T) {
	actual := state(svc("192.0.2.1", 80), svc("192.0.2.1", 443), svc("192.0.2.2", 80))
	have := FilterOf(actual)
	step := func(key Key, desired *Service) {
		t.Helper()
		p := DiffService(key, desired, actual)
		p.Filter = filterStep(key, desired, p, have)
		p.ApplyTo(&actual)
		p.Filter.ApplyTo(&have)
		if want := FilterOf(actual); !reflect.DeepEqual(have, want) {
			t.Fatalf("after %s (%v): filter %+v, want %+v", key, p, have, want)
		}
	}
	k := func(vip string, port uint16) Key { return Key{VIP: ip(vip), Port: port, Protocol: TCP} }
	step(k("192.0.2.1", 8080), ptr(svc("192.0.2.1", 8080)))                      // a port gained
	step(k("192.0.2.1", 443), nil)                                               // a port lost, the VIP kept
	step(k("192.0.2.2", 80), nil)                                                // the last port: VIP unbound, unfiltered
	step(k("192.0.2.3", 53), ptr(svc("2001:db8::3", 53)))                        // a new VIP
	step(k("192.0.2.1", 80), ptr(svc("192.0.2.1", 80, be("10.0.0.1", 8080, 1)))) // backends only
	if p := filterStep(k("192.0.2.1", 80), ptr(svc("192.0.2.1", 80)), Plan{}, have); p.Len() != 0 {
		t.Errorf("filterStep of a virtual server already let through: %+v", p)
	}
	// An element the in-memory filter has for a virtual server no longer
	// wanted goes, whoever owns the VIP.
	have.Allow[k("198.51.100.1", 22)] = struct{}{}
	if p := filterStep(k("198.51.100.1", 22), nil, Plan{}, have); len(p.DelAllow) != 1 {
		t.Errorf("filterStep of a stale element: %+v", p)
	}
}
