package ipam

import (
	"math/big"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

func TestParseAddresses(t *testing.T) {
	tests := []struct {
		name    string
		in      []string
		want    []string // Range.First-Last per entry
		reason  Reason
		wantErr string // exact message when set
	}{
		{name: "v4 cidr", in: []string{"192.168.10.0/24"}, want: []string{"192.168.10.0-192.168.10.255"}},
		{name: "v4 range", in: []string{"10.0.0.5-10.0.0.20"}, want: []string{"10.0.0.5-10.0.0.20"}},
		{name: "v4 range spaces", in: []string{" 10.0.0.5 - 10.0.0.20 "}, want: []string{"10.0.0.5-10.0.0.20"}},
		{name: "v4 single-address range", in: []string{"10.0.0.5-10.0.0.5"}, want: []string{"10.0.0.5-10.0.0.5"}},
		{name: "v4 /32", in: []string{"10.0.0.5/32"}, want: []string{"10.0.0.5-10.0.0.5"}},
		{name: "v4 /0", in: []string{"0.0.0.0/0"}, want: []string{"0.0.0.0-255.255.255.255"}},
		{name: "v6 /64", in: []string{"2001:db8::/64"}, want: []string{"2001:db8::-2001:db8::ffff:ffff:ffff:ffff"}},
		{name: "v6 range", in: []string{"2001:db8::10-2001:db8::ff"}, want: []string{"2001:db8::10-2001:db8::ff"}},
		{name: "v6 /0", in: []string{"::/0"}, want: []string{"::-ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"}},
		{name: "mixed list keeps order", in: []string{"2001:db8::/120", "10.0.0.0/30"}, want: []string{"2001:db8::-2001:db8::ff", "10.0.0.0-10.0.0.3"}},
		{name: "adjacent entries are fine", in: []string{"10.0.0.0/25", "10.0.0.128-10.0.0.200"}, want: []string{"10.0.0.0-10.0.0.127", "10.0.0.128-10.0.0.200"}},
		{name: "empty list", in: nil, want: nil},

		{name: "reversed range", in: []string{"10.0.0.0/30", "10.0.0.9-10.0.0.1"}, reason: ReasonInvalid,
			wantErr: `addresses[1] "10.0.0.9-10.0.0.1": range start is after its end; write the lower address first`},
		{name: "mixed families", in: []string{"10.0.0.1-2001:db8::1"}, reason: ReasonInvalid,
			wantErr: `addresses[0] "10.0.0.1-2001:db8::1": range mixes IPv4 and IPv6; both ends must be of the same family, use one entry per family`},
		{name: "host bits", in: []string{"192.168.10.5/24"}, reason: ReasonInvalid,
			wantErr: `addresses[0] "192.168.10.5/24": host bits are set after the /24 prefix; write "192.168.10.0/24", or the range "192.168.10.5-192.168.10.255" to start at 192.168.10.5`},
		{name: "bad cidr", in: []string{"10.0.0.0/33"}, reason: ReasonInvalid, wantErr: `addresses[0] "10.0.0.0/33": not a valid CIDR`},
		{name: "garbage", in: []string{"pool"}, reason: ReasonInvalid, wantErr: `addresses[0] "pool": not a CIDR or an address range`},
		{name: "empty entry", in: []string{""}, reason: ReasonInvalid, wantErr: `addresses[0] "": empty entry`},
		{name: "bare address", in: []string{"10.0.0.1"}, reason: ReasonInvalid,
			wantErr: `addresses[0] "10.0.0.1": a single address is neither a CIDR nor a range; write "10.0.0.1/32" or "10.0.0.1-10.0.0.1"`},
		{name: "bad range start", in: []string{"10.0.0-10.0.0.9"}, reason: ReasonInvalid, wantErr: `addresses[0] "10.0.0-10.0.0.9": range start "10.0.0" is not an IP address`},
		{name: "bad range end", in: []string{"10.0.0.1-x"}, reason: ReasonInvalid, wantErr: `addresses[0] "10.0.0.1-x": range end "x" is not an IP address`},
		{name: "two dashes", in: []string{"10.0.0.1-10.0.0.2-10.0.0.3"}, reason: ReasonInvalid, wantErr: `more than one "-"`},
		{name: "zone", in: []string{"fe80::1%eth0-fe80::9%eth0"}, reason: ReasonInvalid, wantErr: `has a zone`},
		{name: "mapped", in: []string{"::ffff:10.0.0.0/120"}, reason: ReasonInvalid, wantErr: `IPv4-mapped IPv6 address; write it as the plain IPv4 address 10.0.0.0`},
		{name: "overlap within pool", in: []string{"10.0.0.0/24", "10.1.0.0/24", "10.0.0.5-10.0.0.20"}, reason: ReasonOverlap,
			wantErr: `addresses[0] "10.0.0.0/24" overlaps addresses[2] "10.0.0.5-10.0.0.20"; an address may appear only once in a pool, remove or shrink one of them`},
		{name: "duplicate entry", in: []string{"2001:db8::/64", "2001:db8::/64"}, reason: ReasonOverlap, wantErr: `addresses[0] "2001:db8::/64" overlaps addresses[1] "2001:db8::/64"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseAddresses(tt.in)
			if tt.reason != "" {
				if err == nil {
					t.Fatalf("got %v, want error", got)
				}
				if ReasonOf(err) != tt.reason {
					t.Errorf("reason %q, want %q (%v)", ReasonOf(err), tt.reason, err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error\n  %s\nwant it to contain\n  %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i, r := range got {
				if s := r.First.String() + "-" + r.Last.String(); s != tt.want[i] {
					t.Errorf("[%d] = %s, want %s", i, s, tt.want[i])
				}
			}
		})
	}
}

func TestRangeMethods(t *testing.T) {
	var rs []Range
	for _, e := range []string{"10.0.0.0/24", "10.0.1.5-10.0.1.9", "2001:db8::/64", "::/0"} {
		r, err := ParseAddresses([]string{e})
		if err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r...)
	}
	if s := rs[0].String(); s != "10.0.0.0/24" {
		t.Errorf("String = %s", s)
	}
	if s := rs[1].String(); s != "10.0.1.5-10.0.1.9" {
		t.Errorf("String = %s", s)
	}
	if s := rs[3].String(); s != "::/0" {
		t.Errorf("String = %s", s)
	}
	if rs[0].Size().Int64() != 256 || rs[1].Size().Int64() != 5 {
		t.Errorf("sizes %v %v", rs[0].Size(), rs[1].Size())
	}
	if want := new(big.Int).Lsh(big.NewInt(1), 64); rs[2].Size().Cmp(want) != 0 {
		t.Errorf("/64 size %v", rs[2].Size())
	}
	if want := new(big.Int).Lsh(big.NewInt(1), 128); rs[3].Size().Cmp(want) != 0 {
		t.Errorf("::/0 size %v", rs[3].Size())
	}
	if rs[0].Family() != IPv4 || rs[2].Family() != IPv6 {
		t.Error("families")
	}
	if !rs[1].Contains(netip.MustParseAddr("10.0.1.9")) || rs[1].Contains(netip.MustParseAddr("10.0.1.10")) || rs[0].Contains(netip.MustParseAddr("2001:db8::1")) {
		t.Error("Contains")
	}
	if rs[0].Overlaps(rs[1]) || !rs[2].Overlaps(rs[3]) || rs[0].Overlaps(rs[3]) {
		t.Error("Overlaps")
	}
}

func TestU128(t *testing.T) {
	if got := maxU128().inc(); !got.isZero() {
		t.Errorf("max+1 = %v", got)
	}
	if got := (u128{}).dec(); got != maxU128() {
		t.Errorf("0-1 = %v", got)
	}
	if got := (u128{lo: ^uint64(0)}).inc(); got != (u128{hi: 1}) {
		t.Errorf("carry = %v", got)
	}
	if got := (u128{hi: 1}).dec(); got != (u128{lo: ^uint64(0)}) {
		t.Errorf("borrow = %v", got)
	}
	want, _ := new(big.Int).SetString("ffffffffffffffffffffffffffffffff", 16)
	if maxU128().big().Cmp(want) != 0 {
		t.Errorf("big = %v", maxU128().big())
	}
	for _, s := range []string{"::", "::1", "2001:db8::ffff:0:1", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "0.0.0.0", "10.1.2.3", "255.255.255.255"} {
		ip := netip.MustParseAddr(s)
		if got := valueAddr(addrValue(ip), FamilyOf(ip)); got != ip {
			t.Errorf("round trip %s = %s", ip, got)
		}
	}
}

// TestSpaceBijection checks index<->address against a brute-force
// enumeration on small ranges, with and without avoidBuggyIPs.
func TestSpaceBijection(t *testing.T) {
	for _, entry := range []string{
		"10.0.0.0/24", "10.0.0.0/23", "10.0.0.255-10.0.1.0", "10.0.0.254-10.0.2.1", "10.0.0.5-10.0.0.20",
		"0.0.0.0/30", "255.255.255.250-255.255.255.255", "10.0.0.255/32", "10.0.0.0/32", "10.0.1.0-10.0.1.1",
		"2001:db8::fe-2001:db8::101", "2001:db8::/120",
	} {
		for _, avoid := range []bool{false, true} {
			rs, err := ParseAddresses([]string{entry})
			if err != nil {
				t.Fatal(err)
			}
			r := rs[0]
			s := newSpace(r, avoid)
			var want []netip.Addr
			for ip := r.First; ; ip = ip.Next() {
				if !(avoid && isBuggy(ip)) {
					want = append(want, ip)
				}
				if ip == r.Last {
					break
				}
			}
			if got := s.capacity(); got.Int64() != int64(len(want)) {
				t.Errorf("%s avoid=%v: capacity %v, want %d", entry, avoid, got, len(want))
			}
			if len(want) == 0 {
				if !s.empty {
					t.Errorf("%s avoid=%v: want empty space", entry, avoid)
				}
				continue
			}
			if s.last != u64(uint64(len(want)-1)) {
				t.Errorf("%s avoid=%v: last %v, want %d", entry, avoid, s.last, len(want)-1)
			}
			for i, ip := range want {
				if got := s.addr(u64(uint64(i))); got != ip {
					t.Errorf("%s avoid=%v: addr(%d) = %s, want %s", entry, avoid, i, got, ip)
				}
				if got, ok := s.index(ip); !ok || got != u64(uint64(i)) {
					t.Errorf("%s avoid=%v: index(%s) = %v %v, want %d", entry, avoid, ip, got, ok, i)
				}
			}
			if avoid && r.Family() == IPv4 {
				for ip := r.First; ; ip = ip.Next() {
					if _, ok := s.index(ip); ok == isBuggy(ip) {
						t.Errorf("%s: index(%s) usable=%v", entry, ip, ok)
					}
					if ip == r.Last {
						break
					}
				}
			}
			if _, ok := s.index(r.First.Prev()); ok && r.First.Prev().IsValid() {
				t.Errorf("%s: address before the range has an index", entry)
			}
			if _, ok := s.index(r.Last.Next()); ok && r.Last.Next().IsValid() {
				t.Errorf("%s: address after the range has an index", entry)
			}
		}
	}
}

// TestSpaceLarge checks the bijection at random points of huge ranges.
func TestSpaceLarge(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, entry := range []string{"::/0", "2001:db8::/48", "2001:db8::/64", "0.0.0.0/0", "10.0.0.0/8"} {
		for _, avoid := range []bool{false, true} {
			rs, _ := ParseAddresses([]string{entry})
			s := newSpace(rs[0], avoid)
			for range 2000 {
				i := randIndex(rng, s.last)
				ip := s.addr(i)
				if !rs[0].Contains(ip) || (avoid && isBuggy(ip)) {
					t.Fatalf("%s: addr(%v) = %s outside the usable set", entry, i, ip)
				}
				if j, ok := s.index(ip); !ok || j != i {
					t.Fatalf("%s: index(addr(%v)=%s) = %v %v", entry, i, ip, j, ok)
				}
			}
			if got := s.addr(s.last); avoid && entry == "0.0.0.0/0" && got != netip.MustParseAddr("255.255.255.254") {
				t.Errorf("last usable of 0.0.0.0/0 = %s", got)
			}
		}
	}
}

// randIndex returns a random index in [0, last].
func randIndex(rng *rand.Rand, last u128) u128 {
	n := new(big.Int).Add(last.big(), big.NewInt(1))
	v := new(big.Int).Lsh(new(big.Int).SetUint64(rng.Uint64()), 64)
	v.Or(v, new(big.Int).SetUint64(rng.Uint64()))
	v.Mod(v, n)
	lo := new(big.Int).And(v, new(big.Int).SetUint64(^uint64(0))).Uint64()
	return u128{hi: new(big.Int).Rsh(v, 64).Uint64(), lo: lo}
}
