package ipvs

import (
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"
)

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestNormalizeRanges(t *testing.T) {
	v4, v6 := ip("192.0.2.1"), ip("2001:db8::1")
	tests := []struct {
		name       string
		vip        netip.Addr
		restricted bool
		in         []string
		want       []string
	}{
		{name: "unrestricted: none", vip: v4, in: []string{"10.0.0.0/8"}},
		{name: "restricted without ranges", vip: v4, restricted: true},
		{name: "masked and sorted", vip: v4, restricted: true, in: []string{"10.20.1.7/16", "10.0.0.1/32"}, want: []string{"10.0.0.1/32", "10.20.0.0/16"}},
		{name: "other family left out", vip: v4, restricted: true, in: []string{"2001:db8::/32", "10.0.0.0/8"}, want: []string{"10.0.0.0/8"}},
		{name: "only the other family: none", vip: v6, restricted: true, in: []string{"10.0.0.0/8"}},
		{name: "held ranges left out", vip: v4, restricted: true, in: []string{"10.1.0.0/16", "10.0.0.0/8", "10.0.0.0/24", "10.0.0.0/8", "11.0.0.0/8"}, want: []string{"10.0.0.0/8", "11.0.0.0/8"}},
		{name: "mapped IPv4 range unmapped", vip: v4, restricted: true, in: []string{"::ffff:10.0.0.0/104"}, want: []string{"10.0.0.0/8"}},
		{name: "everything", vip: v6, restricted: true, in: []string{"2001:db8:1::/48", "::/0"}, want: []string{"::/0"}},
		{name: "IPv6 kept", vip: v6, restricted: true, in: []string{"2001:db8:2::/48", "2001:db8:1::5/64"}, want: []string{"2001:db8:1::/64", "2001:db8:2::/48"}},
		{name: "invalid skipped", vip: v4, restricted: true, in: nil, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := normalizeRanges(tt.vip, tt.restricted, append(prefixes(tt.in...), netip.Prefix{}))
			want := prefixes(tt.want...)
			if len(want) == 0 {
				want = nil
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("normalizeRanges(%s, %v, %v) = %v, want %v", tt.vip, tt.restricted, tt.in, got, want)
			}
		})
	}
}

// TestNormalizeRangesDisjoint checks, over random range lists, that the
// kept ranges are disjoint (the kernel refuses overlapping elements) and
// admit exactly the addresses the input admits.
func TestNormalizeRangesDisjoint(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	vip := ip("192.0.2.1")
	for range 500 {
		var in []netip.Prefix
		for range r.IntN(6) {
			a := netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(4)), byte(r.IntN(256))})
			in = append(in, netip.PrefixFrom(a, 8+r.IntN(25)))
		}
		got := normalizeRanges(vip, true, in)
		for i := range got {
			for j := i + 1; j < len(got); j++ {
				if got[i].Overlaps(got[j]) {
					t.Fatalf("normalizeRanges(%v) = %v: %s and %s overlap", in, got, got[i], got[j])
				}
			}
		}
		for range 50 {
			a := netip.AddrFrom4([4]byte{10, byte(r.IntN(4)), byte(r.IntN(4)), byte(r.IntN(256))})
			inIn := slices.ContainsFunc(in, func(p netip.Prefix) bool { return p.Contains(a) })
			inGot := slices.ContainsFunc(got, func(p netip.Prefix) bool { return p.Contains(a) })
			if inIn != inGot {
				t.Fatalf("normalizeRanges(%v) = %v: %s admitted %v before, %v after", in, got, a, inIn, inGot)
			}
		}
	}
}

func TestSourceElementRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		key   Key
		r     string
		first string
		last  string
	}{
		{Key{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP}, "10.20.0.0/16", "10.20.0.0", "10.20.255.255"},
		{Key{VIP: ip("192.0.2.1"), Port: 53, Protocol: UDP}, "0.0.0.0/0", "0.0.0.0", "255.255.255.255"},
		{Key{VIP: ip("192.0.2.1"), Port: 443, Protocol: SCTP}, "198.51.100.7/32", "198.51.100.7", "198.51.100.7"},
		{Key{VIP: ip("2001:db8::1"), Port: 443, Protocol: TCP}, "2001:db8:1::/48", "2001:db8:1::", "2001:db8:1:ffff:ffff:ffff:ffff:ffff"},
		{Key{VIP: ip("2001:db8::1"), Port: 8080, Protocol: TCP}, "::/0", "::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
	} {
		sr := SourceRange{Key: tt.key, Range: netip.MustParsePrefix(tt.r)}
		e := sourceElement(sr)
		n := len(tt.key.VIP.AsSlice())
		if want := n + 8 + n; len(e.key) != want || len(e.keyEnd) != want {
			t.Errorf("%s: key %d and key end %d bytes, want %d", sr, len(e.key), len(e.keyEnd), want)
		}
		if got, _ := netip.AddrFromSlice(e.key[n+8:]); got.String() != tt.first {
			t.Errorf("%s: key starts the range at %s, want %s", sr, got, tt.first)
		}
		if got, _ := netip.AddrFromSlice(e.keyEnd[n+8:]); got.String() != tt.last {
			t.Errorf("%s: key end %s, want %s", sr, got, tt.last)
		}
		back, ok := parseSourceElement(e.key, e.keyEnd)
		if !ok || back != sr {
			t.Errorf("parseSourceElement(sourceElement(%s)) = %s, %v", sr, back, ok)
		}
	}
	// A range that is not a prefix (written by hand) is not read back.
	e := sourceElement(SourceRange{Key: Key{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP}, Range: netip.MustParsePrefix("10.0.0.0/24")})
	e.keyEnd[len(e.keyEnd)-1] = 0x7e // 10.0.0.0-10.0.0.126
	if r, ok := parseSourceElement(e.key, e.keyEnd); ok {
		t.Errorf("parseSourceElement(10.0.0.0-10.0.0.126) = %s, want not ok", r)
	}
}

func FuzzParseSourceElement(f *testing.F) {
	e := sourceElement(SourceRange{Key: Key{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP}, Range: netip.MustParsePrefix("10.0.0.0/8")})
	f.Add(e.key, e.keyEnd)
	e6 := sourceElement(SourceRange{Key: Key{VIP: ip("2001:db8::1"), Port: 80, Protocol: UDP}, Range: netip.MustParsePrefix("2001:db8::/32")})
	f.Add(e6.key, e6.keyEnd)
	f.Fuzz(func(t *testing.T, key, end []byte) {
		r, ok := parseSourceElement(key, end)
		if !ok {
			return
		}
		if !r.Range.IsValid() || r.Range != r.Range.Masked() || r.Range.Addr().Is4() != r.Key.VIP.Is4() {
			t.Fatalf("%x/%x decodes to a bad range %s", key, end, r)
		}
		again := sourceElement(r)
		if back, ok := parseSourceElement(again.key, again.keyEnd); !ok || back != r {
			t.Fatalf("%x/%x decodes to %s, which encodes to one that decodes to %s, %v", key, end, r, back, ok)
		}
	})
}

func restrictedSvc(vip string, port uint16, ranges ...string) Service {
	return Service{VIP: ip(vip), Port: port, Protocol: TCP, Restricted: true, SourceRanges: prefixes(ranges...)}
}

func TestFilterOfSources(t *testing.T) {
	k := func(vip string, port uint16) Key { return Key{VIP: ip(vip), Port: port, Protocol: TCP} }
	desired := state(
		restrictedSvc("192.0.2.1", 80, "10.20.0.0/16", "2001:db8::/32"),
		restrictedSvc("192.0.2.1", 443), // restricted, no range: no one
		svc("192.0.2.2", 80),
		restrictedSvc("2001:db8::1", 80, "10.0.0.0/8"), // no range of its family: no one
	)
	got := FilterOf(desired)
	wantRestricted := map[Key]struct{}{k("192.0.2.1", 80): {}, k("192.0.2.1", 443): {}, k("2001:db8::1", 80): {}}
	wantSources := map[Key][]netip.Prefix{k("192.0.2.1", 80): prefixes("10.20.0.0/16")}
	if !reflect.DeepEqual(got.Restricted, wantRestricted) {
		t.Errorf("Restricted = %v, want %v", got.Restricted, wantRestricted)
	}
	if !reflect.DeepEqual(got.Sources, wantSources) {
		t.Errorf("Sources = %v, want %v", got.Sources, wantSources)
	}
	if len(got.Allow) != 4 {
		t.Errorf("Allow = %v, want the 4 virtual servers", got.Allow)
	}
}

// TestFilterStepSources walks one virtual server through restriction
// changes and checks each step against the full diff: filterStep on the
// filter so far, applied, equals FilterOf of the new desired state.
func TestFilterStepSources(t *testing.T) {
	key := Key{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP}
	other := restrictedSvc("192.0.2.1", 443, "10.0.0.0/8")
	steps := []struct {
		name string
		svc  *Service
		want FilterPlan
	}{
		{name: "created open", svc: ptr(svc("192.0.2.1", 80)), want: FilterPlan{AddAllow: []Key{key}}},
		{name: "restricted", svc: ptr(restrictedSvc("192.0.2.1", 80, "10.20.0.0/16", "192.168.0.0/24")),
			want: FilterPlan{AddRestricted: []Key{key}, AddSources: []SourceRange{{key, pfx("10.20.0.0/16")}, {key, pfx("192.168.0.0/24")}}}},
		{name: "narrowed", svc: ptr(restrictedSvc("192.0.2.1", 80, "10.20.0.0/16")),
			want: FilterPlan{DelSources: []SourceRange{{key, pfx("192.168.0.0/24")}}}},
		{name: "range swapped", svc: ptr(restrictedSvc("192.0.2.1", 80, "10.30.0.0/16")),
			want: FilterPlan{AddSources: []SourceRange{{key, pfx("10.30.0.0/16")}}, DelSources: []SourceRange{{key, pfx("10.20.0.0/16")}}}},
		{name: "no range left: no one", svc: ptr(restrictedSvc("192.0.2.1", 80)),
			want: FilterPlan{DelSources: []SourceRange{{key, pfx("10.30.0.0/16")}}}},
		{name: "lifted", svc: ptr(svc("192.0.2.1", 80)), want: FilterPlan{DelRestricted: []Key{key}}},
		{name: "restricted again", svc: ptr(restrictedSvc("192.0.2.1", 80, "10.20.0.0/16")),
			want: FilterPlan{AddRestricted: []Key{key}, AddSources: []SourceRange{{key, pfx("10.20.0.0/16")}}}},
		{name: "deleted", svc: nil, want: FilterPlan{DelAllow: []Key{key}, DelRestricted: []Key{key}, DelSources: []SourceRange{{key, pfx("10.20.0.0/16")}}}},
	}
	have := FilterOf(state(other))
	cur := state(other)
	for _, st := range steps {
		p := Plan{}
		if st.svc == nil {
			delete(cur.Services, key)
		} else {
			cur.Add(*st.svc)
		}
		got := filterStep(key, st.svc, p, have)
		got.AddVIPs, got.DelVIPs = nil, nil // the VIP stays: other is on it
		if !reflect.DeepEqual(got, st.want) {
			t.Errorf("%s: filterStep =\n %+v\nwant\n %+v", st.name, got, st.want)
		}
		got.ApplyTo(&have)
		if full := FilterOf(cur); !reflect.DeepEqual(have.Restricted, full.Restricted) || !reflect.DeepEqual(have.Sources, full.Sources) || !reflect.DeepEqual(have.Allow, full.Allow) {
			t.Errorf("%s: after the step the filter is\n %+v\nFilterOf says\n %+v", st.name, have, full)
		}
		if d := DiffFilter(FilterOf(cur), have); d.Len() != 0 {
			t.Errorf("%s: DiffFilter after the step = %+v, want nothing", st.name, d)
		}
	}
}

func TestDiffFilterSources(t *testing.T) {
	key := Key{VIP: ip("192.0.2.1"), Port: 80, Protocol: TCP}
	want := FilterOf(state(restrictedSvc("192.0.2.1", 80, "10.20.0.0/16")))
	have := FilterOf(state(restrictedSvc("192.0.2.1", 80, "10.20.0.0/16", "10.30.0.0/16")))
	// A range added by hand to another key is taken out too.
	stray := Key{VIP: ip("192.0.2.9"), Port: 22, Protocol: TCP}
	have.Sources[stray] = prefixes("0.0.0.0/0")
	p := DiffFilter(want, have)
	wantDel := []SourceRange{{key, pfx("10.30.0.0/16")}, {stray, pfx("0.0.0.0/0")}}
	if !reflect.DeepEqual(p.DelSources, wantDel) || len(p.AddSources) != 0 || len(p.AddRestricted)+len(p.DelRestricted) != 0 {
		t.Errorf("DiffFilter = %+v, want only DelSources %v", p, wantDel)
	}
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
