package ipam

import (
	"encoding/binary"
	"math/big"
	"math/bits"
	"net/netip"
)

// u128 is an unsigned 128-bit integer used for address arithmetic: an IPv6
// address, or an index into a range of up to 2^128 addresses.
type u128 struct {
	hi, lo uint64
}

// maxU128 returns 2^128-1.
func maxU128() u128 { return u128{hi: ^uint64(0), lo: ^uint64(0)} }

func u64(v uint64) u128 { return u128{lo: v} }

func (a u128) cmp(b u128) int {
	switch {
	case a.hi < b.hi:
		return -1
	case a.hi > b.hi:
		return 1
	case a.lo < b.lo:
		return -1
	case a.lo > b.lo:
		return 1
	}
	return 0
}

func (a u128) less(b u128) bool {
	return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo)
}

func (a u128) isZero() bool { return a.hi == 0 && a.lo == 0 }

// add returns a+b modulo 2^128.
func (a u128) add(b u128) u128 {
	lo, c := bits.Add64(a.lo, b.lo, 0)
	hi, _ := bits.Add64(a.hi, b.hi, c)
	return u128{hi: hi, lo: lo}
}

// sub returns a-b modulo 2^128.
func (a u128) sub(b u128) u128 {
	lo, c := bits.Sub64(a.lo, b.lo, 0)
	hi, _ := bits.Sub64(a.hi, b.hi, c)
	return u128{hi: hi, lo: lo}
}

func (a u128) inc() u128 { return a.add(u64(1)) }
func (a u128) dec() u128 { return a.sub(u64(1)) }

// big returns a as a new big.Int.
func (a u128) big() *big.Int {
	v := new(big.Int).SetUint64(a.hi)
	v.Lsh(v, 64)
	return v.Or(v, new(big.Int).SetUint64(a.lo))
}

// addrValue returns the numeric value of ip (an IPv4 address fits in lo).
func addrValue(ip netip.Addr) u128 {
	if ip.Is4() {
		b := ip.As4()
		return u64(uint64(binary.BigEndian.Uint32(b[:])))
	}
	b := ip.As16()
	return u128{hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:])}
}

// valueAddr is the inverse of addrValue for the given family.
func valueAddr(v u128, f Family) netip.Addr {
	if f == IPv4 {
		var b [4]byte
		// Callers pass an IPv4 address's value or one between a range's
		// first and last, so it is below 2^32 and fits.
		binary.BigEndian.PutUint32(b[:], uint32(v.lo)) //nolint:gosec // see above
		return netip.AddrFrom4(b)
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], v.hi)
	binary.BigEndian.PutUint64(b[8:], v.lo)
	return netip.AddrFrom16(b)
}
