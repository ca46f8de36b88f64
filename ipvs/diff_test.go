package ipvs

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func be(addr string, port uint16, w int) Backend {
	return Backend{Addr: ip(addr), Port: port, Weight: w}
}

func svc(vip string, port uint16, bs ...Backend) Service {
	return Service{VIP: ip(vip), Port: port, Protocol: TCP, Backends: bs}
}

func state(svcs ...Service) State {
	s := NewState()
	for _, v := range svcs {
		s.Add(v)
	}
	return s
}

func TestDiff(t *testing.T) {
	foreign := Service{VIP: ip("10.96.0.1"), Port: 443, Protocol: TCP, Scheduler: "rr", Backends: []Backend{be("10.1.0.1", 6443, 1)}}
	withForeign := func(s State) State {
		s.Services[foreign.Key()] = foreign.Normalize()
		return s
	}
	k := func(vip string, port uint16) Key { return Key{VIP: ip(vip), Port: port, Protocol: TCP} }
	tests := []struct {
		name            string
		desired, actual State
		want            Plan
	}{
		{
			name: "empty",
		},
		{
			name:    "from empty",
			desired: state(svc("192.0.2.1", 80, be("10.0.0.2", 8080, 1), be("10.0.0.1", 8080, 1))),
			actual:  NewState(),
			want: Plan{
				AddVIPs:     []netip.Addr{ip("192.0.2.1")},
				AddServices: []Service{{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP, Scheduler: "mh", Flags: FlagMHPort | FlagMHFallback}},
				AddBackends: []BackendChange{
					{Key: k("192.0.2.1", 80), Backend: be("10.0.0.1", 8080, 1)},
					{Key: k("192.0.2.1", 80), Backend: be("10.0.0.2", 8080, 1)},
				},
			},
		},
		{
			name:    "no change",
			desired: state(svc("192.0.2.1", 80, be("10.0.0.1", 8080, 1))),
			actual:  state(svc("192.0.2.1", 80, be("10.0.0.1", 8080, 1))),
		},
		{
			name:    "backend added, drained, removed",
			desired: state(svc("192.0.2.1", 80, be("10.0.0.1", 8080, 0), be("10.0.0.3", 8080, 1))),
			actual:  state(svc("192.0.2.1", 80, be("10.0.0.1", 8080, 1), be("10.0.0.2", 8080, 1))),
			want: Plan{
				DelBackends:   []BackendChange{{Key: k("192.0.2.1", 80), Backend: be("10.0.0.2", 8080, 1)}},
				LowerBackends: []BackendChange{{Key: k("192.0.2.1", 80), Backend: be("10.0.0.1", 8080, 0)}},
				AddBackends:   []BackendChange{{Key: k("192.0.2.1", 80), Backend: be("10.0.0.3", 8080, 1)}},
			},
		},
		{
			name:    "scheduler and affinity change",
			desired: state(Service{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP, Scheduler: "rr", Persistent: 10800}),
			actual:  state(svc("192.0.2.1", 80)),
			want: Plan{
				UpdateServices: []Service{{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP, Scheduler: "rr", Persistent: 10800}},
			},
		},
		{
			name:    "service gone, VIP kept for another port; foreign left alone",
			desired: state(svc("192.0.2.1", 80)),
			actual:  withForeign(state(svc("192.0.2.1", 80), svc("192.0.2.1", 443, be("10.0.0.1", 8443, 1)))),
			want:    Plan{DelServices: []Key{k("192.0.2.1", 443)}},
		},
		{
			name:    "everything gone, foreign left alone",
			desired: NewState(),
			actual:  withForeign(state(svc("192.0.2.1", 80), svc("2001:db8::1", 80))),
			want: Plan{
				DelServices: []Key{k("192.0.2.1", 80), k("2001:db8::1", 80)},
				DelVIPs:     []netip.Addr{ip("192.0.2.1"), ip("2001:db8::1")},
			},
		},
		{
			name:    "source NAT on, off, and gone with its service",
			desired: state(Service{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP, SNAT: true}, svc("192.0.2.1", 81)),
			actual: state(svc("192.0.2.1", 80), Service{VIP: ip("192.0.2.1"), Port: 81, Protocol: TCP, SNAT: true},
				Service{VIP: ip("192.0.2.1"), Port: 82, Protocol: TCP, SNAT: true}),
			want: Plan{
				AddSNAT:     []Key{k("192.0.2.1", 80)},
				DelServices: []Key{k("192.0.2.1", 82)},
				DelSNAT:     []Key{k("192.0.2.1", 81), k("192.0.2.1", 82)},
			},
		},
		{
			name:    "desired service on a foreign virtual server's VIP takes it over",
			desired: state(svc("10.96.0.1", 80)),
			actual:  withForeign(NewState()),
			want: Plan{
				AddVIPs:     []netip.Addr{ip("10.96.0.1")},
				AddServices: []Service{svc("10.96.0.1", 80).Normalize()},
				DelServices: []Key{foreign.Key()},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Diff(tt.desired, tt.actual)
			if !plansEqual(got, tt.want) {
				t.Errorf("Diff:\n got %+v\nwant %+v", got, tt.want)
			}
			checkPlan(t, tt.desired, tt.actual, got)
		})
	}
}

func plansEqual(a, b Plan) bool {
	norm := func(p Plan) Plan {
		for i := range p.AddServices {
			p.AddServices[i].Backends = nil
		}
		return p
	}
	return reflect.DeepEqual(clean(norm(a)), clean(norm(b)))
}

// clean turns empty slices into nil for comparison.
func clean(p Plan) Plan {
	if len(p.AddVIPs) == 0 {
		p.AddVIPs = nil
	}
	if len(p.DelVIPs) == 0 {
		p.DelVIPs = nil
	}
	if len(p.AddServices) == 0 {
		p.AddServices = nil
	}
	if len(p.UpdateServices) == 0 {
		p.UpdateServices = nil
	}
	if len(p.DelServices) == 0 {
		p.DelServices = nil
	}
	if len(p.AddBackends) == 0 {
		p.AddBackends = nil
	}
	if len(p.UpdateBackends) == 0 {
		p.UpdateBackends = nil
	}
	if len(p.DelBackends) == 0 {
		p.DelBackends = nil
	}
	if len(p.AddSNAT) == 0 {
		p.AddSNAT = nil
	}
	if len(p.DelSNAT) == 0 {
		p.DelSNAT = nil
	}
	f := &p.Filter
	if len(f.AddVIPs) == 0 {
		f.AddVIPs = nil
	}
	if len(f.DelVIPs) == 0 {
		f.DelVIPs = nil
	}
	if len(f.AddAllow) == 0 {
		f.AddAllow = nil
	}
	if len(f.DelAllow) == 0 {
		f.DelAllow = nil
	}
	return p
}

// checkPlan: applying p to actual yields desired for the owned virtual
// servers, leaves foreign ones as they were, and a second Diff is empty.
func checkPlan(t *testing.T, desired, actual State, p Plan) {
	t.Helper()
	owned := desired.allVIPs()
	for a := range actual.VIPs {
		owned[a] = struct{}{}
	}
	if msg := breakBeforeMake(actual, desired, p); msg != "" {
		t.Errorf("plan %v: %s", p, msg)
	}
	got := actual.Clone()
	p.ApplyTo(&got)
	if again := Diff(desired, got); !again.Empty() {
		t.Fatalf("Diff after applying the plan is not empty: %v %+v", again, again)
	}
	if !reflect.DeepEqual(keysOf(got.VIPs), keysOf(desired.allVIPs())) {
		t.Errorf("VIPs after plan: %v, want %v", keysOf(got.VIPs), keysOf(desired.allVIPs()))
	}
	for k, s := range actual.Services {
		if _, ours := owned[k.VIP]; ours {
			continue
		}
		// The source NAT entry is vipcast's, not the virtual server's.
		g := got.Services[k]
		if g.SNAT {
			t.Errorf("foreign virtual server %s keeps vipcast's source NAT", k)
		}
		g.SNAT = s.SNAT
		if !reflect.DeepEqual(g, s) {
			t.Errorf("foreign virtual server %s changed: %+v -> %+v", k, s, got.Services[k])
		}
	}
	for k, s := range desired.Services {
		g, ok := got.Services[k]
		if !ok {
			t.Errorf("desired %s missing after plan", k)
			continue
		}
		if w := s.Normalize(); !reflect.DeepEqual(g.Normalize(), w) && !(len(g.Backends) == 0 && len(w.Backends) == 0 && g.sameAttrs(w)) {
			t.Errorf("%s after plan: %+v, want %+v", k, g, w)
		}
	}
	for k := range got.Services {
		if _, ours := owned[k.VIP]; !ours {
			continue
		}
		if _, ok := desired.Services[k]; !ok {
			t.Errorf("owned %s still present after plan", k)
		}
	}
}

func keysOf(m map[netip.Addr]struct{}) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for a := range m {
		out[a] = true
	}
	return out
}

func TestDiffService(t *testing.T) {
	actual := state(svc("192.0.2.1", 80, be("10.0.0.1", 8080, 1)), svc("192.0.2.1", 443), svc("192.0.2.2", 80))
	actual.Services[Key{VIP: ip("10.96.0.1"), Port: 80, Protocol: TCP}] = svc("10.96.0.1", 80).Normalize()

	p := DiffService(Key{}, ptr(svc("192.0.2.1", 80, be("10.0.0.1", 8080, 0))), actual)
	if p.Len() != 1 || len(p.LowerBackends) != 1 {
		t.Errorf("drain: %v", p)
	}
	p = DiffService(Key{VIP: ip("192.0.2.1"), Port: 443, Protocol: TCP}, nil, actual)
	if p.Len() != 1 || len(p.DelServices) != 1 {
		t.Errorf("delete, VIP still used: %v", p)
	}
	p = DiffService(Key{VIP: ip("192.0.2.2"), Port: 80, Protocol: TCP}, nil, actual)
	if p.Len() != 2 || len(p.DelVIPs) != 1 {
		t.Errorf("delete last service of a VIP: %v", p)
	}
	p = DiffService(Key{VIP: ip("10.96.0.1"), Port: 80, Protocol: TCP}, nil, actual)
	if !p.Empty() {
		t.Errorf("delete of a foreign virtual server: %v", p)
	}
	p = DiffService(Key{}, ptr(svc("192.0.2.3", 53)), actual)
	if p.Len() != 2 || len(p.AddVIPs) != 1 || len(p.AddServices) != 1 {
		t.Errorf("new VIP: %v", p)
	}
}

func ptr[T any](v T) *T { return &v }

func TestValidScheduler(t *testing.T) {
	for _, s := range []string{"rr", "wrr", "mh", "sh", "wlc"} {
		if err := ValidScheduler(s); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	err := ValidScheduler("roundrobin")
	if err == nil {
		t.Fatal("roundrobin accepted")
	}
	for _, want := range []string{"vipcast.io/scheduler", `"roundrobin"`, "rr, wrr", "mh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	if n, f, err := ParseScheduler(""); n != "mh" || f != FlagMHPort|FlagMHFallback || err != nil {
		t.Errorf(`ParseScheduler(""): %s %#x %v`, n, f, err)
	}
	if n, f, err := ParseScheduler(" rr "); n != "rr" || f != 0 || err != nil {
		t.Errorf(`ParseScheduler("rr"): %s %#x %v`, n, f, err)
	}
	if _, _, err := ParseScheduler("RR"); err == nil {
		t.Error("RR accepted")
	}
}

func TestValidate(t *testing.T) {
	good := svc("192.0.2.1", 80, be("10.0.0.1", 8080, 1))
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []Service{
		svc("192.0.2.1", 0),
		svc("192.0.2.1", 80, be("2001:db8::1", 80, 1)),
		svc("192.0.2.1", 80, be("10.0.0.1", 80, -1)),
		{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP, Scheduler: "nope"},
		{VIP: ip("192.0.2.1"), Port: 80, Protocol: 1},
	}
	for _, s := range bad {
		if err := s.Validate(); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
}

// FuzzDiff: for random desired and actual states (with foreign virtual
// servers), applying Diff's plan to actual yields desired for vipcast's
// virtual servers and VIPs, leaves the foreign ones unchanged, and a second
// Diff is empty; DiffService of every key converges the same way.
func FuzzDiff(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Add([]byte("vipcast dataplane: desired vs actual, with foreign servers"))
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &byteReader{b: data}
		desired := randomState(r, false)
		actual := randomState(r, true)
		p := Diff(desired, actual)
		checkPlan(t, desired, actual, p)

		// Service by service, from actual, the same way.
		got := actual.Clone()
		keys := map[Key]bool{}
		for k := range desired.Services {
			keys[k] = true
		}
		for k := range actual.Services {
			keys[k] = true
		}
		for k := range keys {
			var want *Service
			if s, ok := desired.Services[k]; ok {
				want = &s
			}
			DiffService(k, want, got).ApplyTo(&got)
		}
		for k, s := range desired.Services {
			if g := got.Services[k]; !reflect.DeepEqual(g.Normalize(), s.Normalize()) && !(len(g.Backends) == 0 && len(s.Backends) == 0 && g.sameAttrs(s)) {
				t.Errorf("DiffService: %s = %+v, want %+v", k, g, s)
			}
		}
		for k, s := range actual.Services {
			_, ours := actual.VIPs[k.VIP]
			_, wanted := desired.allVIPs()[k.VIP]
			g := got.Services[k]
			g.SNAT = s.SNAT
			if !ours && !wanted && !reflect.DeepEqual(g, s) {
				t.Errorf("DiffService changed foreign %s", k)
			}
		}
	})
}

type byteReader struct {
	b []byte
	i int
}

func (r *byteReader) next() byte {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[r.i%len(r.b)] ^ byte(r.i/len(r.b))
	r.i++
	return v
}

// randomState draws a state over a small universe so that desired and
// actual overlap: 4 VIPs (2 IPv4, 2 IPv6), 2 ports, 2 protocols, 3 backend
// addresses per family. With foreign, some virtual servers are on VIPs not
// bound to the link (they are somebody else's).
func randomState(r *byteReader, foreign bool) State {
	vips := []netip.Addr{ip("192.0.2.1"), ip("192.0.2.2"), ip("2001:db8::1"), ip("2001:db8::2"), ip("10.96.0.1"), ip("fd00::1")}
	scheds := []string{"", "rr", "mh", "wlc"}
	st := NewState()
	n := int(r.next() % 8)
	for i := 0; i < n; i++ {
		nv := 4
		if foreign {
			nv = len(vips)
		}
		v := vips[int(r.next())%nv]
		s := Service{VIP: v, Port: 80 + uint16(r.next()%2), Protocol: []Protocol{TCP, UDP}[r.next()%2],
			Scheduler: scheds[r.next()%4], Persistent: uint32(r.next()%2) * 60, SNAT: r.next()%2 == 0}
		nb := int(r.next() % 4)
		for j := 0; j < nb; j++ {
			var a netip.Addr
			if v.Is4() {
				a = netip.AddrFrom4([4]byte{10, 0, 0, 1 + r.next()%3})
			} else {
				var b [16]byte
				binary.BigEndian.PutUint16(b[:], 0xfd00)
				b[15] = 1 + r.next()%3
				a = netip.AddrFrom16(b)
			}
			s.Backends = append(s.Backends, Backend{Addr: a, Port: 8080, Weight: int(r.next() % 3)})
		}
		s = s.Normalize()
		st.Services[s.Key()] = s
		if v != vips[4] && v != vips[5] {
			st.VIPs[v] = struct{}{}
		}
	}
	// A VIP bound without virtual servers.
	if r.next()%3 == 0 {
		st.VIPs[vips[r.next()%4]] = struct{}{}
	}
	return st
}

// weightOf is the total weight of the real servers of k in s.
func weightOf(s State, k Key) int {
	w := 0
	for _, b := range s.Services[k].Backends {
		w += b.Weight
	}
	return w
}

// breakBeforeMake replays p's real-server commands one by one on actual,
// in the order Apply runs them, and says which command leaves a virtual
// server that has weight in actual and in desired without any (a new
// connection then gets ICMP port unreachable); "" when none does.
func breakBeforeMake(actual, desired State, p Plan) string {
	s := actual.Clone()
	for i, op := range p.backendOps() {
		Plan{AddBackends: pick(op, ipvsCmdNewDest), UpdateBackends: pick(op, ipvsCmdSetDest), DelBackends: pick(op, ipvsCmdDelDest)}.applyBackends(&s)
		k := op.Key
		if weightOf(actual, k) > 0 && weightOf(desired, k) > 0 && weightOf(s, k) == 0 {
			return fmt.Sprintf("after command %d (%d %v) of %d, %s has no real server with weight: %v", i+1, op.cmd, op.BackendChange, len(p.backendOps()), k, s.Services[k].Backends)
		}
	}
	return ""
}

// pick is op's change when its command is cmd, else nil.
func pick(op backendOp, cmd uint8) []BackendChange {
	if op.cmd != cmd {
		return nil
	}
	return []BackendChange{op.BackendChange}
}

// TestMakeBeforeBreak: a virtual server whose real servers have weight
// before and after a plan has weight at every command of it, whichever
// real server gains or loses it: the Local handover of the lab's rollout
// (one node's endpoint terminates as another node's becomes ready, with
// the new node sorting before or after the old), a real server that
// tier 1 adds again with a lower weight, a pod replaced by another one.
func TestMakeBeforeBreak(t *testing.T) {
	node := func(a string, w int) Backend {
		return Backend{Addr: ip("10.52.0." + a), Port: 80, Weight: w, Tunnel: true}
	}
	tier1 := func(bs ...Backend) State { return state(svc("192.0.2.1", 80, bs...)) }
	tests := []struct {
		name           string
		actual, wanted State
	}{
		{"handover to a node that sorts after", tier1(node("1", 1)), tier1(node("1", 0), node("2", 1))},
		{"handover to a node that sorts before", tier1(node("2", 1)), tier1(node("1", 1), node("2", 0))},
		{"handover between kept nodes", tier1(node("1", 1), node("2", 0)), tier1(node("1", 0), node("2", 1))},
		{"added again with a lower weight", tier1(node("2", 1), node("3", 0)), tier1(node("1", 0), node("2", 0), node("3", 1))},
		{"a pod replaced", state(svc("192.0.2.1", 80, be("10.0.0.2", 80, 1))), state(svc("192.0.2.1", 80, be("10.0.0.1", 80, 1)))},
		{"a pod drained, another ready", state(svc("192.0.2.1", 80, be("10.0.0.1", 80, 1), be("10.0.0.2", 80, 0))),
			state(svc("192.0.2.1", 80, be("10.0.0.1", 80, 0), be("10.0.0.2", 80, 1)))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Diff(tt.wanted, tt.actual)
			if msg := breakBeforeMake(tt.actual, tt.wanted, p); msg != "" {
				t.Errorf("plan %v: %s", p, msg)
			}
			checkPlan(t, tt.wanted, tt.actual, p)
		})
	}
}

// TestDiffTier1Order: a real server added to tier 1 of the two-tier
// dataplane (tunnel real servers) re-adds those that sort after it, in the
// plan's order, so that every node's kernel list (and mh table) has one
// order whatever the order it learned them in; one that sorts last re-adds
// none; a weight change or a removal keeps the order and touches only that
// real server; one tier (pods) adds only the new one.
func TestDiffTier1Order(t *testing.T) {
	node := func(a string, w int) Backend { return Backend{Addr: ip(a), Port: 80, Weight: w, Tunnel: true} }
	actual := state(svc("192.0.2.1", 80, node("10.52.0.12", 2)), svc("192.0.2.2", 80, be("10.0.0.1", 8080, 1)))
	p := DiffService(Key{}, ptr(svc("192.0.2.1", 80, node("10.52.0.11", 2), node("10.52.0.12", 2))), actual)
	var adds []string
	for _, c := range p.AddBackends {
		adds = append(adds, fmt.Sprintf("%s again=%v", c.Backend.Addr, c.Again))
	}
	// .12 is deleted right before it is added back, not with the plan's
	// deletions: see diffService.
	if len(p.DelBackends) != 0 || !slices.Equal(adds, []string{"10.52.0.11 again=false", "10.52.0.12 again=true"}) {
		t.Errorf("tier 1 gains a node: %v (adds %v), want .11 added, then .12 added again, in that order", p, adds)
	}
	got := actual.Clone()
	p.ApplyTo(&got)
	if want := svc("192.0.2.1", 80, node("10.52.0.11", 2), node("10.52.0.12", 2)).Normalize(); !reflect.DeepEqual(got.Services[want.Key()], want) {
		t.Errorf("after the plan %+v, want %+v", got.Services[want.Key()], want)
	}
	p = DiffService(Key{}, ptr(svc("192.0.2.1", 80, node("10.52.0.12", 2), node("10.52.0.13", 2))), actual)
	if p.Len() != 1 || len(p.AddBackends) != 1 || p.AddBackends[0].Again {
		t.Errorf("tier 1 gains a node that sorts last: %v, want it added alone", p)
	}
	three := state(svc("192.0.2.1", 80, node("10.52.0.11", 2), node("10.52.0.13", 2), node("10.52.0.14", 2)))
	p = DiffService(Key{}, ptr(svc("192.0.2.1", 80, node("10.52.0.11", 3), node("10.52.0.12", 2), node("10.52.0.13", 2), node("10.52.0.14", 2))), three)
	adds = adds[:0]
	for _, c := range p.AddBackends {
		adds = append(adds, fmt.Sprintf("%s again=%v", c.Backend.Addr, c.Again))
	}
	if len(p.UpdateBackends) != 1 || !slices.Equal(adds, []string{"10.52.0.12 again=false", "10.52.0.13 again=true", "10.52.0.14 again=true"}) {
		t.Errorf("tier 1 gains a node in the middle: %v (adds %v), want .11 updated in place, .12 added, .13 and .14 added again", p, adds)
	}
	p = DiffService(Key{}, ptr(svc("192.0.2.1", 80, node("10.52.0.12", 0))), actual)
	if p.Len() != 1 || len(p.LowerBackends) != 1 {
		t.Errorf("tier 1 weight change: %v, want one update", p)
	}
	p = DiffService(Key{}, ptr(svc("192.0.2.2", 80, be("10.0.0.1", 8080, 1), be("10.0.0.2", 8080, 1))), actual)
	if p.Len() != 1 || len(p.AddBackends) != 1 {
		t.Errorf("one tier gains a pod: %v, want one add", p)
	}
}

// FuzzTier1KernelOrder: whatever the history of tier 1's real servers
// (added, removed, reweighted, in any order), the plans Diff makes keep the
// kernel's list, as IPVS keeps it (an added real server goes first, a
// deleted one leaves the others in place), in one order: descending, the
// order a node that learns them all at once gets. mh builds its table in
// that order, so every node builds the same one.
func FuzzTier1KernelOrder(f *testing.F) {
	f.Add([]byte{0x12, 0x0b, 0x13, 0x0e, 0x91, 0x0c, 0x2a})
	f.Add([]byte{0xff, 0x01, 0x80, 0x7f})
	f.Fuzz(func(t *testing.T, steps []byte) {
		key := Key{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP}
		actual := State{Services: map[Key]Service{}, VIPs: map[netip.Addr]struct{}{}}
		var kernel []netip.AddrPort // IPVS's list, first first
		members := map[byte]int{}   // last octet: weight
		for _, st := range steps {
			// Node n of 16 joins with weight w (0, 1 or 2), or leaves
			// (the high bit).
			n, w := 1+st&0x0f, int(st>>4&0x07)%3
			if st&0x80 != 0 {
				delete(members, n)
			} else {
				members[n] = w
			}
			var bs []Backend
			for m, mw := range members {
				bs = append(bs, Backend{Addr: netip.AddrFrom4([4]byte{10, 52, 0, m}), Port: 80, Weight: mw, Tunnel: true})
			}
			want := Service{VIP: key.VIP, Port: 80, Protocol: TCP, Backends: bs}.Normalize()
			p := DiffService(key, &want, actual)
			for _, op := range p.backendOps() {
				switch op.cmd {
				case ipvsCmdDelDest:
					kernel = slices.DeleteFunc(kernel, func(a netip.AddrPort) bool { return a == op.Backend.AddrPort() })
				case ipvsCmdNewDest:
					kernel = slices.DeleteFunc(kernel, func(a netip.AddrPort) bool { return a == op.Backend.AddrPort() })
					kernel = slices.Insert(kernel, 0, op.Backend.AddrPort())
				}
			}
			wanted := State{Services: map[Key]Service{key: want}}
			if msg := breakBeforeMake(actual, wanted, p); msg != "" {
				t.Fatalf("after %v: %s", want.Backends, msg)
			}
			p.ApplyTo(&actual)
			var canonical []netip.AddrPort
			for _, b := range want.Backends {
				canonical = append(canonical, b.AddrPort())
			}
			slices.SortFunc(canonical, func(a, b netip.AddrPort) int { return b.Compare(a) })
			if !slices.Equal(kernel, canonical) {
				t.Fatalf("after %v: kernel list %v, want %v (plan %v)", want.Backends, kernel, canonical, p)
			}
		}
	})
}
