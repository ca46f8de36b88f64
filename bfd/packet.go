// Package bfd implements Bidirectional Forwarding Detection in
// asynchronous mode (RFC 5880) over UDP, single hop (RFC 5881) and
// multihop (RFC 5883). vipcast runs one session beside each BGP session
// that asks for it, so that a dead path or a frozen peer brings the BGP
// session down in a fraction of a second instead of a hold time.
//
// The package is two layers: Session is the protocol's state machine and
// timers as pure logic (packets and clock readings in, packets and state
// changes out); Manager runs sessions over real sockets. Authentication
// is Keyed SHA1 and Meticulous Keyed SHA1 (RFC 5880 section 6.7.4); demand
// mode and the echo function are not implemented, and vipcast never asks
// for them.
//
// A received packet passes the reception rules of RFC 5880 section 6.8.6
// before it touches a session: Unmarshal's checks of the packet alone, the
// session's selection by Your Discriminator (by the peer's address only
// while it is zero, and then only for a session that is Down or AdminDown,
// or from the peer's own discriminator saying Down),
// the TTL (255 for single hop, the session's minimum for multihop), and
// Session.Accept's checks against the session's state and authentication.
// Every discarded packet is counted by reason in
// vipcast_bfd_discarded_packets_total (see Collector).
package bfd

import (
	"crypto/sha1" //nolint:gosec // RFC 5880 section 6.7.4 specifies SHA1
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// State is a BFD session state (RFC 5880 section 4.1).
type State uint8

// The session states.
const (
	AdminDown State = 0
	Down      State = 1
	Init      State = 2
	Up        State = 3
)

// String returns the state's name as RFC 5880 writes it.
func (s State) String() string {
	switch s {
	case AdminDown:
		return "AdminDown"
	case Down:
		return "Down"
	case Init:
		return "Init"
	case Up:
		return "Up"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Diag is a diagnostic code: why the session last left Up (RFC 5880
// section 4.1).
type Diag uint8

// The diagnostic codes.
const (
	DiagNone                  Diag = 0
	DiagDetectionTimeExpired  Diag = 1
	DiagEchoFailed            Diag = 2
	DiagNeighborDown          Diag = 3
	DiagForwardingPlaneReset  Diag = 4
	DiagPathDown              Diag = 5
	DiagConcatenatedPathDown  Diag = 6
	DiagAdminDown             Diag = 7
	DiagReverseConcatPathDown Diag = 8
)

// String returns the diagnostic in words.
func (d Diag) String() string {
	switch d {
	case DiagNone:
		return "no diagnostic"
	case DiagDetectionTimeExpired:
		return "control detection time expired"
	case DiagEchoFailed:
		return "echo function failed"
	case DiagNeighborDown:
		return "neighbor signaled session down"
	case DiagForwardingPlaneReset:
		return "forwarding plane reset"
	case DiagPathDown:
		return "path down"
	case DiagConcatenatedPathDown:
		return "concatenated path down"
	case DiagAdminDown:
		return "administratively down"
	case DiagReverseConcatPathDown:
		return "reverse concatenated path down"
	}
	return fmt.Sprintf("diagnostic %d", uint8(d))
}

// Version is the protocol version this package speaks.
const Version = 1

// controlLen is the length of a Control packet without authentication.
const controlLen = 24

// sha1AuthLen is the length of a Keyed SHA1 authentication section, and
// sha1Len the length of a packet with one (RFC 5880 section 4.4).
const (
	sha1AuthLen = 28
	sha1Len     = controlLen + sha1AuthLen
)

// MaxPacketLen is the longest Control packet this package sends or reads:
// one with a Keyed SHA1 section.
const MaxPacketLen = sha1Len

// AuthType is an authentication type (RFC 5880 section 4.1).
type AuthType uint8

// The authentication types; this package implements the SHA1 ones.
const (
	AuthNone                AuthType = 0
	AuthSimplePassword      AuthType = 1
	AuthKeyedMD5            AuthType = 2
	AuthMeticulousKeyedMD5  AuthType = 3
	AuthKeyedSHA1           AuthType = 4
	AuthMeticulousKeyedSHA1 AuthType = 5
)

// String returns the type's name.
func (a AuthType) String() string {
	switch a {
	case AuthNone:
		return "none"
	case AuthSimplePassword:
		return "simple password"
	case AuthKeyedMD5:
		return "keyed MD5"
	case AuthMeticulousKeyedMD5:
		return "meticulous keyed MD5"
	case AuthKeyedSHA1:
		return "keyed SHA1"
	case AuthMeticulousKeyedSHA1:
		return "meticulous keyed SHA1"
	}
	return fmt.Sprintf("auth type %d", uint8(a))
}

// sha1 reports whether the type is one of the two SHA1 types.
func (a AuthType) sha1() bool { return a == AuthKeyedSHA1 || a == AuthMeticulousKeyedSHA1 }

// Control is a BFD Control packet (RFC 5880 section 4.1). Intervals are
// carried in microseconds on the wire.
type Control struct {
	Version uint8
	Diag    Diag
	State   State
	// Poll, Final, ControlPlaneIndependent, AuthPresent, Demand and
	// Multipoint are the P, F, C, A, D and M bits.
	Poll, Final, ControlPlaneIndependent, AuthPresent, Demand, Multipoint bool
	DetectMult                                                            uint8
	// Length is the packet's length as its header says.
	Length            uint8
	MyDiscriminator   uint32
	YourDiscriminator uint32
	// DesiredMinTx, RequiredMinRx and RequiredMinEchoRx are the three
	// intervals.
	DesiredMinTx, RequiredMinRx, RequiredMinEchoRx time.Duration
	// AuthType, AuthKeyID, AuthSeq and AuthDigest are the authentication
	// section when AuthPresent is set: its type and key ID (of any type),
	// and for the SHA1 types the sequence number and the digest as carried.
	AuthType   AuthType
	AuthKeyID  uint8
	AuthSeq    uint32
	AuthDigest [sha1.Size]byte
}

// Errors of Unmarshal, the Manager and Session.Accept: a packet that
// fails with one is discarded (RFC 5880 section 6.8.6) and counted under
// the error's reason (see Reason).
var (
	ErrShort        = errors.New("bfd: packet shorter than 24 bytes")
	ErrVersion      = errors.New("bfd: version is not 1")
	ErrLength       = errors.New("bfd: length field is below the minimum or beyond the packet")
	ErrDetectMult   = errors.New("bfd: detect multiplier is zero")
	ErrMultipoint   = errors.New("bfd: multipoint bit is set")
	ErrMyDiscr      = errors.New("bfd: my discriminator is zero")
	ErrYourDiscr    = errors.New("bfd: your discriminator is zero in a state other than Down or AdminDown")
	ErrAuthLength   = errors.New("bfd: authentication section's length does not fit its type or the packet")
	ErrTTL          = errors.New("bfd: TTL below the session's minimum")
	ErrNoSession    = errors.New("bfd: no session has this your discriminator, or none with this peer is Down")
	ErrSessionUp    = errors.New("bfd: your discriminator is zero and the session is neither Down nor AdminDown")
	ErrPeerDiscr    = errors.New("bfd: my discriminator is not the peer's while the session is Up")
	ErrAuthMissing  = errors.New("bfd: the session authenticates and the packet carries no authentication")
	ErrAuthRequired = errors.New("bfd: authentication is present and the session does not use it")
	ErrAuthKey      = errors.New("bfd: authentication type or key ID is not the session's")
	ErrAuthDigest   = errors.New("bfd: authentication digest does not match")
	ErrAuthSeq      = errors.New("bfd: authentication sequence number outside the accepted window")
)

// reasons are the reason labels of the discard errors.
var reasons = map[error]string{
	ErrShort:        "short",
	ErrVersion:      "version",
	ErrLength:       "length",
	ErrDetectMult:   "detect_mult",
	ErrMultipoint:   "multipoint",
	ErrMyDiscr:      "my_discriminator_zero",
	ErrYourDiscr:    "your_discriminator_zero",
	ErrAuthLength:   "auth_length",
	ErrTTL:          "ttl",
	ErrNoSession:    "no_session",
	ErrSessionUp:    "your_discriminator_zero_session_up",
	ErrPeerDiscr:    "my_discriminator_mismatch",
	ErrAuthMissing:  "auth_missing",
	ErrAuthRequired: "auth_unexpected",
	ErrAuthKey:      "auth_key",
	ErrAuthDigest:   "auth_digest",
	ErrAuthSeq:      "auth_sequence",
}

// Reason returns the label of vipcast_bfd_discarded_packets_total that
// counts packets discarded with err: "other" for an error that is none of
// the Err values.
func Reason(err error) string {
	for e, r := range reasons {
		if errors.Is(err, e) {
			return r
		}
	}
	return "other"
}

// Marshal appends the packet to b: 24 bytes, or 52 with a Keyed SHA1
// section when AuthPresent is set with a SHA1 AuthType (any other type is
// not sent: the A bit is then cleared). The digest is written as
// AuthDigest holds it: Sign computes it.
func (c Control) Marshal(b []byte) []byte {
	auth := c.AuthPresent && c.AuthType.sha1()
	var h [sha1Len]byte
	h[0] = Version<<5 | uint8(c.Diag)&0x1f
	flags := uint8(c.State&3) << 6
	for i, set := range []bool{c.Poll, c.Final, c.ControlPlaneIndependent, auth, c.Demand, c.Multipoint} {
		if set {
			flags |= 1 << (5 - i)
		}
	}
	h[1] = flags
	h[2] = c.DetectMult
	h[3] = controlLen
	binary.BigEndian.PutUint32(h[4:], c.MyDiscriminator)
	binary.BigEndian.PutUint32(h[8:], c.YourDiscriminator)
	binary.BigEndian.PutUint32(h[12:], micros(c.DesiredMinTx))
	binary.BigEndian.PutUint32(h[16:], micros(c.RequiredMinRx))
	binary.BigEndian.PutUint32(h[20:], micros(c.RequiredMinEchoRx))
	if !auth {
		return append(b, h[:controlLen]...)
	}
	h[3] = sha1Len
	h[24] = uint8(c.AuthType)
	h[25] = sha1AuthLen
	h[26] = c.AuthKeyID
	binary.BigEndian.PutUint32(h[28:], c.AuthSeq)
	copy(h[32:], c.AuthDigest[:])
	return append(b, h[:]...)
}

// Sign computes the Keyed SHA1 digest of pkt, a packet Marshal wrote with
// a SHA1 authentication section, with key (at most 20 bytes, padded with
// zeros), and writes it into the packet (RFC 5880 section 6.7.4).
func Sign(pkt, key []byte) {
	if len(pkt) < sha1Len {
		return
	}
	sum := digest(pkt[:sha1Len], key)
	copy(pkt[32:sha1Len], sum[:])
}

// verify reports whether pkt's SHA1 digest is the one key gives.
func verify(pkt, key []byte) bool {
	if len(pkt) < sha1Len {
		return false
	}
	sum := digest(pkt[:sha1Len], key)
	return subtle.ConstantTimeCompare(sum[:], pkt[32:sha1Len]) == 1
}

// digest is the SHA1 of pkt with the key, zero-padded to 20 bytes, in
// place of the digest field.
func digest(pkt, key []byte) [sha1.Size]byte {
	var buf [sha1Len]byte
	copy(buf[:], pkt)
	clear(buf[32:])
	copy(buf[32:], key)
	return sha1.Sum(buf[:]) //nolint:gosec // RFC 5880 section 6.7.4 specifies SHA1
}

// Unmarshal decodes b and applies the checks RFC 5880 section 6.8.6 makes
// before a session is looked up; it returns one of the Err values when the
// packet must be discarded.
func Unmarshal(b []byte) (Control, error) {
	var c Control
	if len(b) < controlLen {
		return c, ErrShort
	}
	c.Version = b[0] >> 5
	c.Diag = Diag(b[0] & 0x1f)
	c.State = State(b[1] >> 6)
	c.Poll = b[1]&0x20 != 0
	c.Final = b[1]&0x10 != 0
	c.ControlPlaneIndependent = b[1]&0x08 != 0
	c.AuthPresent = b[1]&0x04 != 0
	c.Demand = b[1]&0x02 != 0
	c.Multipoint = b[1]&0x01 != 0
	c.DetectMult = b[2]
	c.Length = b[3]
	c.MyDiscriminator = binary.BigEndian.Uint32(b[4:])
	c.YourDiscriminator = binary.BigEndian.Uint32(b[8:])
	c.DesiredMinTx = fromMicros(binary.BigEndian.Uint32(b[12:]))
	c.RequiredMinRx = fromMicros(binary.BigEndian.Uint32(b[16:]))
	c.RequiredMinEchoRx = fromMicros(binary.BigEndian.Uint32(b[20:]))
	switch {
	case c.Version != Version:
		return c, ErrVersion
	case c.AuthPresent && int(c.Length) < controlLen+2, int(c.Length) < controlLen, int(c.Length) > len(b):
		return c, ErrLength
	case c.DetectMult == 0:
		return c, ErrDetectMult
	case c.Multipoint:
		return c, ErrMultipoint
	case c.MyDiscriminator == 0:
		return c, ErrMyDiscr
	case c.YourDiscriminator == 0 && c.State != Down && c.State != AdminDown:
		return c, ErrYourDiscr
	}
	if c.AuthPresent {
		c.AuthType = AuthType(b[24])
		authLen := int(b[25])
		if authLen < 2 || controlLen+authLen > int(c.Length) || c.AuthType.sha1() && authLen != sha1AuthLen {
			return c, ErrAuthLength
		}
		if authLen >= 3 {
			c.AuthKeyID = b[26]
		}
		if c.AuthType.sha1() {
			c.AuthSeq = binary.BigEndian.Uint32(b[28:])
			copy(c.AuthDigest[:], b[32:sha1Len])
		}
	}
	return c, nil
}

// micros converts d to whole microseconds, saturating at the field's
// 32 bits (71 minutes) and at zero.
func micros(d time.Duration) uint32 {
	us := d / time.Microsecond
	switch {
	case us <= 0:
		return 0
	case us > 1<<32-1:
		return 1<<32 - 1
	}
	return uint32(us)
}

func fromMicros(us uint32) time.Duration { return time.Duration(us) * time.Microsecond }
