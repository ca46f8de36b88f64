package ipam

import (
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
		return u64(uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3]))
	}
	b := ip.As16()
	var v u128
	for i := 0; i < 8; i++ {
		v.hi = v.hi<<8 | uint64(b[i])
		v.lo = v.lo<<8 | uint64(b[i+8])
	}
	return v
}

// valueAddr is the inverse of addrValue for the given family.
func valueAddr(v u128, f Family) netip.Addr {
	if f == IPv4 {
		x := uint32(v.lo)
		return netip.AddrFrom4([4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)})
	}
	var b [16]byte
	for i := 7; i >= 0; i-- {
		b[i] = byte(v.hi)
		b[i+8] = byte(v.lo)
		v.hi >>= 8
		v.lo >>= 8
	}
	return netip.AddrFrom16(b)
}
