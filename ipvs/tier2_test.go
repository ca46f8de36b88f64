package ipvs

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/google/nftables"
)

// TestTier2Affinity checks where a virtual server's slots go: the random
// ones without client affinity, the hashed ones (Tier2Slots and above,
// which the first tunnel-dnat rule draws by the client's address) with
// it, and that a map element of either kind reads back.
func TestTier2Affinity(t *testing.T) {
	pods := []Backend{{Addr: ip("10.1.0.1"), Port: 8080, Weight: 1}, {Addr: ip("10.1.0.2"), Port: 8080, Weight: 1}}
	for _, affinity := range []bool{false, true} {
		svc := Service{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP, Local: pods, Affinity: affinity}
		slots := Tier2Of(state(svc))[svc.Key()]
		if len(slots) != tier2Space {
			t.Fatalf("affinity %v: %d slots, want %d", affinity, len(slots), tier2Space)
		}
		filled, from := 0, -1
		for i, s := range slots {
			if s.IsValid() {
				filled++
				if from < 0 {
					from = i
				}
				e, ok := parseTier2Elem(tier2Elem(Tier2Slot{Key: svc.Key(), Slot: i, To: s}))
				if !ok || e.Slot != i || e.To != s {
					t.Errorf("affinity %v: slot %d reads back as %+v (%v)", affinity, i, e, ok)
				}
			}
		}
		want := 0
		if affinity {
			want = Tier2Slots
		}
		if filled != Tier2Slots || from != want {
			t.Errorf("affinity %v: %d slots filled from slot %d, want %d from %d", affinity, filled, from, Tier2Slots, want)
		}
	}
	if _, ok := parseTier2Elem(tier2Elem(Tier2Slot{Key: Key{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP}, Slot: tier2Space, To: netip.MustParseAddrPort("10.1.0.1:80")})); ok {
		t.Errorf("a slot past the hashed ones parses")
	}
}

func TestTier2SlotsOf(t *testing.T) {
	a, b, c := ip("10.1.0.1"), ip("10.1.0.2"), ip("10.1.0.3")
	count := func(slots []netip.AddrPort) map[netip.AddrPort]int {
		m := map[netip.AddrPort]int{}
		for _, s := range slots {
			m[s]++
		}
		return m
	}
	ap := func(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, 8080) }
	for _, tc := range []struct {
		name  string
		local []Backend
		want  map[netip.AddrPort]int // slots per endpoint; nil: no slots
	}{
		{"none", nil, nil},
		{"only terminating", []Backend{{Addr: a, Port: 8080}}, nil},
		{"one", []Backend{{Addr: a, Port: 8080, Weight: 1}}, map[netip.AddrPort]int{ap(a): Tier2Slots}},
		{"two equal", []Backend{{Addr: b, Port: 8080, Weight: 1}, {Addr: a, Port: 8080, Weight: 1}},
			map[netip.AddrPort]int{ap(a): 16, ap(b): 16}},
		{"three equal", []Backend{{Addr: a, Port: 8080, Weight: 1}, {Addr: b, Port: 8080, Weight: 1}, {Addr: c, Port: 8080, Weight: 1}},
			map[netip.AddrPort]int{ap(a): 11, ap(b): 11, ap(c): 10}},
		{"terminating gets none", []Backend{{Addr: a, Port: 8080, Weight: 1}, {Addr: b, Port: 8080, Weight: 0}},
			map[netip.AddrPort]int{ap(a): Tier2Slots}},
		{"weighted 3:1", []Backend{{Addr: a, Port: 8080, Weight: 3}, {Addr: b, Port: 8080, Weight: 1}},
			map[netip.AddrPort]int{ap(a): 24, ap(b): 8}},
		{"duplicate counted once", []Backend{{Addr: a, Port: 8080, Weight: 1}, {Addr: a, Port: 8080, Weight: 1}, {Addr: b, Port: 8080, Weight: 1}},
			map[netip.AddrPort]int{ap(a): 16, ap(b): 16}},
		{"mapped address", []Backend{{Addr: netip.AddrFrom16(a.As16()), Port: 8080, Weight: 1}},
			map[netip.AddrPort]int{ap(a): Tier2Slots}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slots := Tier2SlotsOf(tc.local)
			if tc.want == nil {
				if slots != nil {
					t.Fatalf("got %v, want no slots", slots)
				}
				return
			}
			if len(slots) != Tier2Slots {
				t.Fatalf("%d slots, want %d", len(slots), Tier2Slots)
			}
			if got := count(slots); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("slots per endpoint %v, want %v", got, tc.want)
			}
			// The same endpoints in another order give the same slots.
			rev := make([]Backend, len(tc.local))
			for i, b := range tc.local {
				rev[len(rev)-1-i] = b
			}
			if again := Tier2SlotsOf(rev); !reflect.DeepEqual(again, slots) && !hasDuplicate(tc.local) {
				t.Errorf("reversed input gives %v, want %v", again, slots)
			}
		})
	}
}

func hasDuplicate(bs []Backend) bool {
	seen := map[netip.AddrPort]bool{}
	for _, b := range bs {
		if seen[b.AddrPort()] {
			return true
		}
		seen[b.AddrPort()] = true
	}
	return false
}

// TestDiffTier2 checks that the plans turn have into want, that an
// unchanged virtual server costs nothing, and that tier2Step gives the
// same changes for one virtual server as the whole diff.
func TestDiffTier2(t *testing.T) {
	vip := ip("192.0.2.1")
	web := Service{VIP: vip, Port: 80, Protocol: TCP}
	dns := Service{VIP: vip, Port: 53, Protocol: UDP}
	pods := func(addrs ...string) []Backend {
		var bs []Backend
		for _, a := range addrs {
			bs = append(bs, Backend{Addr: ip(a), Port: 8080, Weight: 1})
		}
		return bs
	}
	with := func(s Service, local []Backend) Service { s.Local = local; return s }
	affine := func(s Service) Service { s.Affinity = true; return s }
	for _, tc := range []struct {
		name       string
		have, want State
		changes    int // elements deleted plus added
	}{
		{"empty", state(), state(), 0},
		{"new service", state(), state(with(web, pods("10.1.0.1"))), Tier2Slots},
		{"unchanged", state(with(web, pods("10.1.0.1")), with(dns, pods("10.1.0.2"))),
			state(with(web, pods("10.1.0.1")), with(dns, pods("10.1.0.2"))), 0},
		// Half the slots move to the new pod: each is a delete and an add.
		{"pod added", state(with(web, pods("10.1.0.1"))), state(with(web, pods("10.1.0.1", "10.1.0.2"))), Tier2Slots},
		{"pod replaced", state(with(web, pods("10.1.0.1"))), state(with(web, pods("10.1.0.2"))), 2 * Tier2Slots},
		{"last pod terminating", state(with(web, pods("10.1.0.1"))),
			state(with(web, []Backend{{Addr: ip("10.1.0.1"), Port: 8080}})), Tier2Slots},
		{"service gone", state(with(web, pods("10.1.0.1")), with(dns, pods("10.1.0.2"))), state(with(dns, pods("10.1.0.2"))), Tier2Slots},
		// Client affinity moves the slots to the hashed ones: every
		// random slot goes, every hashed one comes.
		{"affinity on", state(with(web, pods("10.1.0.1"))), state(affine(with(web, pods("10.1.0.1")))), 2 * Tier2Slots},
		{"affinity off", state(affine(with(web, pods("10.1.0.1")))), state(with(web, pods("10.1.0.1"))), 2 * Tier2Slots},
		{"affine pod added", state(affine(with(web, pods("10.1.0.1")))), state(affine(with(web, pods("10.1.0.1", "10.1.0.2")))), Tier2Slots},
	} {
		t.Run(tc.name, func(t *testing.T) {
			have, want := Tier2Of(tc.have), Tier2Of(tc.want)
			p := DiffTier2(want, have)
			if p.Len() != tc.changes {
				t.Errorf("%d changes (%d deleted, %d added), want %d", p.Len(), len(p.Del), len(p.Add), tc.changes)
			}
			got := Tier2Of(tc.have)
			p.ApplyTo(got)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("after the plan: %v, want %v", got, want)
			}
			// One virtual server at a time, as SyncService does.
			step := Tier2Of(tc.have)
			for _, k := range []Key{web.Key(), dns.Key()} {
				var desired *Service
				if s, ok := tc.want.Services[k]; ok {
					desired = &s
				}
				tier2Step(k, desired, step).ApplyTo(step)
			}
			if !reflect.DeepEqual(step, want) {
				t.Errorf("after tier2Step of each service: %v, want %v", step, want)
			}
		})
	}
}

// TestTier2Chunks: the chunks hold every change once, in order, none
// larger than the limit unless one virtual server alone is, and a virtual
// server's changes are never split.
func TestTier2Chunks(t *testing.T) {
	want := State{}
	for i := range 100 {
		s := Service{VIP: netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), Port: 80, Protocol: TCP,
			Local: []Backend{{Addr: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Port: 8080, Weight: 1}}}
		want.Add(s)
	}
	have := State{}
	for i := range 100 {
		if i%3 == 0 {
			continue // new
		}
		s := Service{VIP: netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), Port: 80, Protocol: TCP,
			Local: []Backend{{Addr: netip.AddrFrom4([4]byte{10, 2, 0, byte(i)}), Port: 8080, Weight: 1}}}
		have.Add(s) // replaced
	}
	p := DiffTier2(Tier2Of(want), Tier2Of(have))
	for _, max := range []int{1, 50, 64, 100, 1000, p.Len()} {
		chunks := tier2Chunks(p, max)
		var joined Tier2Plan
		seen := map[Key]int{}
		for ci, c := range chunks {
			if c.Len() > max && c.Len() > 2*Tier2Slots {
				t.Errorf("max %d: chunk %d has %d changes", max, ci, c.Len())
			}
			keys := map[Key]bool{}
			for _, s := range append(append([]Tier2Slot(nil), c.Del...), c.Add...) {
				keys[s.Key] = true
			}
			for k := range keys {
				if prev, ok := seen[k]; ok {
					t.Errorf("max %d: %s in chunks %d and %d", max, k, prev, ci)
				}
				seen[k] = ci
			}
			joined.merge(c)
		}
		joined.sort()
		if !reflect.DeepEqual(joined, p) {
			t.Errorf("max %d: the chunks joined differ from the plan", max)
		}
	}
}

// TestValidateTwoTier: what Validate refuses in the two-tier fields.
func TestValidateTwoTier(t *testing.T) {
	pod := Backend{Addr: ip("10.1.0.1"), Port: 8080, Weight: 1}
	node := Backend{Addr: ip("10.52.0.1"), Port: 80, Weight: 1, Tunnel: true}
	for _, tc := range []struct {
		name string
		svc  Service
		want string // "" valid
	}{
		{"two tiers", Service{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP, Backends: []Backend{node}, Local: []Backend{pod}}, ""},
		{"local endpoint tunnelled", Service{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP, Local: []Backend{node}}, "tier-1 backends only"},
		{"local endpoint without port", Service{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP, Local: []Backend{{Addr: ip("10.1.0.1"), Weight: 1}}}, "local endpoint 10.1.0.1:0: port 0"},
		{"IPv6 two tiers over IPv4 tunnel addresses", Service{VIP: ip("2001:db8::1"), Port: 80, Protocol: TCP, Backends: []Backend{node},
			Local: []Backend{{Addr: ip("2001:db8:1::1"), Port: 8080, Weight: 1}}}, ""},
		{"IPv6 two tiers over IPv6 tunnel addresses", Service{VIP: ip("2001:db8::1"), Port: 80, Protocol: TCP, Backends: []Backend{{Addr: ip("2001:db8:52::1"), Port: 80, Weight: 1, Tunnel: true}},
			Local: []Backend{{Addr: ip("2001:db8:1::1"), Port: 8080, Weight: 1}}}, ""},
		{"IPv6 tunnel backend of an IPv4 VIP", Service{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP, Backends: []Backend{{Addr: ip("2001:db8:52::1"), Port: 80, Weight: 1, Tunnel: true}}},
			"backend [2001:db8:52::1]:80: an IPv4 VIP's tunnel real server (two-tier dataplane) must be an IPv4 tunnel address"},
		{"IPv4 local endpoint of an IPv6 VIP", Service{VIP: ip("2001:db8::1"), Port: 80, Protocol: TCP, Local: []Backend{pod}}, "local endpoint 10.1.0.1:8080: address family differs"},
		{"IPv6 plain backend of an IPv4 VIP", Service{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP, Backends: []Backend{{Addr: ip("2001:db8:1::1"), Port: 80, Weight: 1}}}, "address family differs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.svc.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestTier2ElemRoundTrip: a tier-2 slot of either family encodes to the
// map element's layout and decodes back; byFamily puts it in its family's
// plan.
func TestTier2ElemRoundTrip(t *testing.T) {
	for _, s := range []Tier2Slot{
		{Key: Key{VIP: ip("192.0.2.1"), Protocol: TCP, Port: 80}, Slot: 31, To: netip.MustParseAddrPort("10.1.0.1:8080")},
		{Key: Key{VIP: ip("2001:db8::1"), Protocol: UDP, Port: 53}, Slot: 7, To: netip.MustParseAddrPort("[2001:db8:1::1]:5353")},
	} {
		e := tier2Elem(s)
		wantKey, wantVal := 16, 8 // VIP . proto . port . slot, address . port (padded)
		fam := 0
		if s.Key.VIP.Is6() {
			wantKey, wantVal, fam = 28, 20, 1
		}
		if len(e.Key) != wantKey || len(e.Val) != wantVal {
			t.Errorf("%v: element of %d+%d bytes, want %d+%d", s, len(e.Key), len(e.Val), wantKey, wantVal)
		}
		got, ok := parseTier2Elem(e)
		if !ok || got != s {
			t.Errorf("parseTier2Elem(tier2Elem(%v)) = %v, %v", s, got, ok)
		}
		split := Tier2Plan{Add: []Tier2Slot{s}}.byFamily()
		if len(split[fam].Add) != 1 || len(split[1-fam].Add) != 0 {
			t.Errorf("byFamily put %v in %v", s, split)
		}
	}
	if _, ok := parseTier2Elem(nftables.SetElement{Key: make([]byte, 16), Val: make([]byte, 20)}); ok {
		t.Error("parseTier2Elem took a key of one family and a value of the other")
	}
}

// TestClampFor: the MSS clamp is the fabric's MTU less the outer header
// (IPv4 20; IPv6 40 for IPv6 VIPs with ip6ip6), the inner header (IPv4 20,
// IPv6 40) and TCP's 20; MTUs outside 576..65535 are refused.
func TestClampFor(t *testing.T) {
	for mtu, want := range map[int][2]uint16{1500: {1440, 1420}, 9000: {8940, 8920}, 576: {516, 496}} {
		if got, err := clampFor(mtu, false); err != nil || got != want {
			t.Errorf("clampFor(%d, false) = %v, %v; want %v", mtu, got, err, want)
		}
	}
	for mtu, want := range map[int][2]uint16{1500: {1440, 1400}, 9000: {8940, 8900}} {
		if got, err := clampFor(mtu, true); err != nil || got != want {
			t.Errorf("clampFor(%d, true) = %v, %v; want %v", mtu, got, err, want)
		}
	}
	for _, mtu := range []int{575, 65536, 0} {
		if _, err := clampFor(mtu, false); err == nil {
			t.Errorf("clampFor(%d) succeeded, want an error", mtu)
		}
	}
}
