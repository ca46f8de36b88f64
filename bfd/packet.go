// Package bfd implements Bidirectional Forwarding Detection in
// asynchronous mode (RFC 5880) over UDP, single hop (RFC 5881) and
// multihop (RFC 5883). vipcast runs one session beside each BGP session
// that asks for it, so that a dead path or a frozen peer brings the BGP
// session down in a fraction of a second instead of a hold time.
//
// The package is two layers: Session is the protocol's state machine and
// timers as pure logic (packets and clock readings in, packets and state
// changes out); Manager runs sessions over real sockets. Demand mode, the
// echo function and authentication are not implemented: a packet that asks
// for authentication is discarded, and vipcast never asks for demand mode
// or echo.
package bfd

import (
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
}

// Errors of Unmarshal; a packet that fails with one is discarded (RFC 5880
// section 6.8.6).
var (
	ErrShort        = errors.New("bfd: packet shorter than 24 bytes")
	ErrVersion      = errors.New("bfd: version is not 1")
	ErrLength       = errors.New("bfd: length field is below 24 or beyond the packet")
	ErrDetectMult   = errors.New("bfd: detect multiplier is zero")
	ErrMultipoint   = errors.New("bfd: multipoint bit is set")
	ErrMyDiscr      = errors.New("bfd: my discriminator is zero")
	ErrYourDiscr    = errors.New("bfd: your discriminator is zero in a state other than Down or AdminDown")
	ErrAuthRequired = errors.New("bfd: authentication is present and this speaker does not use it")
)

// Marshal appends the packet's 24 bytes to b. Length is always written as
// 24: this package sends no authentication section.
func (c Control) Marshal(b []byte) []byte {
	var h [controlLen]byte
	h[0] = Version<<5 | uint8(c.Diag)&0x1f
	flags := uint8(c.State&3) << 6
	for i, set := range []bool{c.Poll, c.Final, c.ControlPlaneIndependent, c.AuthPresent, c.Demand, c.Multipoint} {
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
	return append(b, h[:]...)
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
	case int(c.Length) < controlLen || int(c.Length) > len(b):
		return c, ErrLength
	case c.AuthPresent:
		return c, ErrAuthRequired
	case c.DetectMult == 0:
		return c, ErrDetectMult
	case c.Multipoint:
		return c, ErrMultipoint
	case c.MyDiscriminator == 0:
		return c, ErrMyDiscr
	case c.YourDiscriminator == 0 && c.State != Down && c.State != AdminDown:
		return c, ErrYourDiscr
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
