package ipvs

import (
	"net/netip"
	"testing"
)

// bigState is n virtual servers × m real servers on n IPv4 VIPs.
func bigState(n, m int) State {
	st := NewState()
	for i := 0; i < n; i++ {
		s := Service{VIP: netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), Port: 80, Protocol: TCP}
		for j := 0; j < m; j++ {
			k := (i*7 + j*131) % 5000
			s.Backends = append(s.Backends, Backend{Addr: netip.AddrFrom4([4]byte{10, 244, byte(k / 250), byte(k%250 + 1)}), Port: 8080, Weight: 1})
		}
		st.Add(s)
	}
	return st
}

// BenchmarkDiff: the pure part of a full resync of 10,000 × 10 that finds
// nothing to change.
func BenchmarkDiff(b *testing.B) {
	desired, actual := bigState(10000, 10), bigState(10000, 10)
	b.ResetTimer()
	for b.Loop() {
		if p := Diff(desired, actual); !p.Empty() {
			b.Fatal(p)
		}
	}
}

// BenchmarkDiffService: the pure part of one endpoint change among 10,000
// virtual servers.
func BenchmarkDiffService(b *testing.B) {
	actual := bigState(10000, 10)
	s := actual.Services[Key{VIP: netip.AddrFrom4([4]byte{198, 18, 0, 7}), Port: 80, Protocol: TCP}]
	s.Backends = append([]Backend{{Addr: netip.MustParseAddr("10.245.0.1"), Port: 8080, Weight: 1}}, s.Backends[1:]...)
	b.ResetTimer()
	for b.Loop() {
		if p := DiffService(s.Key(), &s, actual); p.Len() != 2 {
			b.Fatal(p)
		}
	}
}
