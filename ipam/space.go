package ipam

import (
	"math/big"
	"net/netip"
)

// space maps the usable addresses of one range onto the index space
// [0, last] and back, in O(1).
//
// Without avoidBuggyIPs the index of an address is its offset from the
// range's first address. With avoidBuggyIPs (IPv4 only) addresses are first
// compressed by the bijection c(v) = (v>>8)*254 + (v&0xff) - 1, defined for
// last octets 1..254, which numbers the non-buggy addresses consecutively;
// the index is then the offset from the compressed first usable address.
// Buggy addresses have no index, so they never fragment the allocated runs.
type space struct {
	fam   Family
	buggy bool
	base  u128 // value (compressed when buggy) of index 0
	last  u128 // largest index; meaningless when empty
	empty bool // no usable address
}

func newSpace(r Range, avoidBuggy bool) space {
	s := space{fam: r.Family(), buggy: avoidBuggy && r.Family() == IPv4}
	first, last := addrValue(r.First), addrValue(r.Last)
	if !s.buggy {
		s.base = first
		s.last = last.sub(first)
		return s
	}
	lo, hi := first.lo, last.lo // IPv4 values fit in 32 bits
	switch lo & 0xff {
	case 0:
		lo++
	case 0xff:
		lo += 2
	}
	switch hi & 0xff {
	case 0xff:
		hi--
	case 0:
		if hi < 2 {
			s.empty = true
			return s
		}
		hi -= 2
	}
	if lo > hi || lo > 0xffffffff {
		s.empty = true
		return s
	}
	s.base = u64(compress(lo))
	s.last = u64(compress(hi) - compress(lo))
	return s
}

// compress numbers IPv4 addresses whose last octet is 1..254 consecutively.
func compress(v uint64) uint64 { return (v>>8)*254 + (v & 0xff) - 1 }

// expand is the inverse of compress.
func expand(c uint64) uint64 { return (c/254)<<8 | (c%254 + 1) }

// isBuggy reports whether an IPv4 address ends in .0 or .255.
func isBuggy(ip netip.Addr) bool {
	if !ip.Is4() {
		return false
	}
	b := ip.As4()[3]
	return b == 0 || b == 0xff
}

// capacity returns the number of usable addresses.
func (s *space) capacity() *big.Int {
	if s.empty {
		return new(big.Int)
	}
	n := s.last.big()
	return n.Add(n, big.NewInt(1))
}

// index returns the index of ip, or false if ip is outside the space or not
// usable (a buggy address under avoidBuggyIPs). ip must belong to the range
// the space was built from, or lie outside it.
func (s *space) index(ip netip.Addr) (u128, bool) {
	if s.empty || FamilyOf(ip) != s.fam {
		return u128{}, false
	}
	v := addrValue(ip)
	if s.buggy {
		if isBuggy(ip) {
			return u128{}, false
		}
		v = u64(compress(v.lo))
	}
	if v.less(s.base) {
		return u128{}, false
	}
	i := v.sub(s.base)
	if s.last.less(i) {
		return u128{}, false
	}
	return i, true
}

// addr returns the address with index i (i <= last).
func (s *space) addr(i u128) netip.Addr {
	v := s.base.add(i)
	if s.buggy {
		v = u64(expand(v.lo))
	}
	return valueAddr(v, s.fam)
}
