package bfd

import (
	"crypto/sha1" //nolint:gosec // RFC 5880 section 6.7.4 specifies SHA1
	"crypto/subtle"
	"errors"
	"fmt"
	"time"
)

// SlowTx is the least transmit interval a session advertises while it is
// not Up (RFC 5880 section 6.8.3: "not less than one second").
const SlowTx = time.Second

// Timers are the configurable parameters of a session.
type Timers struct {
	// MinTx is the desired minimum transmit interval once the session is
	// Up (bfd.DesiredMinTxInterval).
	MinTx time.Duration
	// MinRx is the required minimum receive interval
	// (bfd.RequiredMinRxInterval): the fastest this side accepts packets.
	MinRx time.Duration
	// Multiplier is the detect multiplier (bfd.DetectMult).
	Multiplier uint8
}

// Validate reports timers no session can run with.
func (t Timers) Validate() error {
	switch {
	case t.MinTx < time.Millisecond || t.MinTx > time.Minute:
		return fmt.Errorf("bfd minTx %v is outside 1ms to 60s", t.MinTx)
	case t.MinRx < time.Millisecond || t.MinRx > time.Minute:
		return fmt.Errorf("bfd minRx %v is outside 1ms to 60s", t.MinRx)
	case t.Multiplier == 0:
		return errors.New("bfd multiplier is 0; use 1 to 255 (3 is usual)")
	}
	return nil
}

// Session is the state of one BFD session (the state variables of RFC 5880
// section 6.8.1) and the rules that change it. It does no I/O and reads no
// clock: the caller passes the time of each event, sends the packets
// Packet builds every TxInterval (jittered, see Jitter), and calls Expire
// at DetectDeadline. It is not safe for concurrent use.
type Session struct {
	state       State
	remoteState State
	localDiscr  uint32
	remoteDiscr uint32
	localDiag   Diag

	timers Timers
	// desiredTx and requiredRx are the intervals advertised now:
	// desiredTx is at least SlowTx while the session is not Up.
	desiredTx, requiredRx time.Duration
	// txInForce and rxInForce are the values the transmit interval and the
	// detection time are computed from: during a Poll sequence an
	// increased desiredTx, or a reduced requiredRx, takes effect only when
	// the Final arrives (RFC 5880 section 6.8.3).
	txInForce, rxInForce time.Duration

	remoteMinRx     time.Duration
	remoteDesiredTx time.Duration
	remoteMult      uint8

	// polling is true while a Poll sequence is in progress; repoll when
	// the parameters changed again during it.
	polling, repoll bool

	// deadline is when the detection time runs out; zero when no packet
	// has been received since the session last went Down.
	deadline time.Time

	// auth is the authentication in use (nil: none); xmitSeq is
	// bfd.XmitAuthSeq, rcvSeq bfd.RcvAuthSeq, valid while seqKnown
	// (bfd.AuthSeqKnown); lastRx is when the last packet was accepted.
	auth     *Auth
	xmitSeq  uint32
	rcvSeq   uint32
	seqKnown bool
	lastRx   time.Time
}

// Auth is a session's authentication (RFC 5880 section 6.7).
type Auth struct {
	// Type is AuthKeyedSHA1 or AuthMeticulousKeyedSHA1.
	Type AuthType
	// KeyID is the key's ID, which both sides configure.
	KeyID uint8
	// Key is the secret, 1 to 20 bytes. It is never logged: it prints
	// and marshals as "(redacted)".
	Key Key
}

// Key is an authentication key: bytes that fmt, klog and JSON print as
// "(redacted)", so that a logged configuration never shows them.
type Key []byte

// String returns "(redacted)".
func (Key) String() string { return "(redacted)" }

// GoString returns "(redacted)", for %#v.
func (Key) GoString() string { return "(redacted)" }

// MarshalJSON returns "(redacted)" as a JSON string.
func (Key) MarshalJSON() ([]byte, error) { return []byte(`"(redacted)"`), nil }

// Validate reports an authentication this package cannot run.
func (a *Auth) Validate() error {
	switch {
	case !a.Type.sha1():
		return fmt.Errorf("bfd authentication type %v is not supported; use keyed SHA1 or meticulous keyed SHA1", a.Type)
	case len(a.Key) == 0 || len(a.Key) > sha1.Size:
		return fmt.Errorf("bfd authentication key is %d bytes; use 1 to 20", len(a.Key))
	}
	return nil
}

// Equal reports whether a and b are the same authentication (both nil, or
// the same type, key ID and key).
func (a *Auth) Equal(b *Auth) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Type == b.Type && a.KeyID == b.KeyID && subtle.ConstantTimeCompare(a.Key, b.Key) == 1
}

// String describes the authentication without its key.
func (a *Auth) String() string {
	if a == nil {
		return "none"
	}
	return fmt.Sprintf("%v key ID %d", a.Type, a.KeyID)
}

// NewSession returns a session in state Down with the given (nonzero,
// unique on this system) local discriminator.
func NewSession(localDiscr uint32, t Timers) *Session {
	s := &Session{state: Down, remoteState: Down, localDiscr: localDiscr, timers: t, remoteMinRx: time.Microsecond}
	s.desiredTx = max(t.MinTx, SlowTx)
	s.requiredRx = t.MinRx
	s.txInForce, s.rxInForce = s.desiredTx, s.requiredRx
	return s
}

// SetAuth makes the session authenticate its packets and require
// authenticated ones with a (nil: none, the default), starting its
// transmit sequence number at seq (RFC 5880 section 6.8.1 asks for a
// random start). The key is copied.
func (s *Session) SetAuth(a *Auth, seq uint32) {
	s.seqKnown = false
	s.xmitSeq = seq
	if a == nil {
		s.auth = nil
		return
	}
	s.auth = &Auth{Type: a.Type, KeyID: a.KeyID, Key: append(Key(nil), a.Key...)}
}

// State returns the local session state.
func (s *Session) State() State { return s.state }

// RemoteState returns the state the peer last reported.
func (s *Session) RemoteState() State { return s.remoteState }

// Diag returns the local diagnostic: why the session last went Down.
func (s *Session) Diag() Diag { return s.localDiag }

// LocalDiscriminator returns bfd.LocalDiscr.
func (s *Session) LocalDiscriminator() uint32 { return s.localDiscr }

// RemoteDiscriminator returns bfd.RemoteDiscr (0 until the peer is heard).
func (s *Session) RemoteDiscriminator() uint32 { return s.remoteDiscr }

// Polling reports whether a Poll sequence is in progress.
func (s *Session) Polling() bool { return s.polling }

// Timers returns the configured timers.
func (s *Session) Timers() Timers { return s.timers }

// Negotiated returns the transmit interval in force (before jitter) and
// the detection time, 0 while unknown.
func (s *Session) Negotiated() (tx, detect time.Duration) {
	return s.TxInterval(), s.detectTime()
}

// TxInterval is the interval between periodic packets before jitter: the
// greater of this side's desired and the peer's required interval. It is
// 0 when the peer asked for no packets (Required Min RX Interval 0).
func (s *Session) TxInterval() time.Duration {
	if s.remoteMinRx == 0 {
		return 0
	}
	return max(s.txInForce, s.remoteMinRx)
}

// Jitter returns the interval to wait before the next periodic packet,
// given a uniform random fraction r in [0, 1): 75 to 100% of TxInterval,
// or 75 to 90% when the detect multiplier is 1 (RFC 5880 section 6.8.7).
func (s *Session) Jitter(r float64) time.Duration {
	hi, lo := 1.0, 0.75
	if s.timers.Multiplier == 1 {
		hi = 0.9
	}
	return time.Duration(float64(s.TxInterval()) * (hi - (hi-lo)*r))
}

// detectTime is the peer's detect multiplier times the greater of this
// side's required interval and the peer's desired one (asynchronous
// mode); 0 until the peer is heard.
func (s *Session) detectTime() time.Duration {
	if s.remoteMult == 0 {
		return 0
	}
	return time.Duration(s.remoteMult) * max(s.rxInForce, s.remoteDesiredTx)
}

// DetectDeadline is when the session goes Down unless a packet arrives;
// zero when there is nothing to detect.
func (s *Session) DetectDeadline() time.Time { return s.deadline }

// Packet returns the Control packet to send now; final answers a Poll.
// A Poll sequence sets the P bit on every periodic packet until the Final
// arrives; a Final never carries P (RFC 5880 section 6.5). With
// authentication the packet carries the next sequence number (each call
// takes one: RFC 5880 section 6.7.4 lets Keyed SHA1 and requires
// Meticulous Keyed SHA1 to increase it on every packet) and no digest yet:
// AppendPacket signs it.
func (s *Session) Packet(final bool) Control {
	c := s.packet(final)
	if s.auth != nil {
		c.AuthPresent, c.AuthType, c.AuthKeyID = true, s.auth.Type, s.auth.KeyID
		s.xmitSeq++
		c.AuthSeq = s.xmitSeq
	}
	return c
}

// AppendPacket appends the packet to send now (see Packet), signed when
// the session authenticates.
func (s *Session) AppendPacket(b []byte, final bool) []byte {
	start := len(b)
	b = s.Packet(final).Marshal(b)
	if s.auth != nil {
		Sign(b[start:], s.auth.Key)
	}
	return b
}

// packet is the packet to send now, without authentication.
func (s *Session) packet(final bool) Control {
	return Control{
		Version:           Version,
		Diag:              s.localDiag,
		State:             s.state,
		Poll:              s.polling && !final,
		Final:             final,
		DetectMult:        s.timers.Multiplier,
		Length:            controlLen,
		MyDiscriminator:   s.localDiscr,
		YourDiscriminator: s.remoteDiscr,
		DesiredMinTx:      s.desiredTx,
		RequiredMinRx:     s.requiredRx,
	}
}

// Change is what an event did to a session.
type Change struct {
	// From and To are the states before and after; equal when the state
	// did not change.
	From, To State
	// SendFinal is set when the packet polled: the caller sends a packet
	// with the F bit at once, whatever the transmit interval.
	SendFinal bool
	// SendNow is set when the caller should send a periodic packet at
	// once: a Poll sequence started or the state changed.
	SendNow bool
	// PeerReset is set when an Up session went Down because the peer
	// reset its session without a path failure: its Down says "no
	// diagnostic" (a new session, as FRR's bfdd starts when bgpd
	// re-registers it with its local address once BGP is up) or
	// "neighbor signaled session down" (which this side never did while
	// Up: FRR's bfdd says so when it deletes a session).
	PeerReset bool
}

// Changed reports whether the state changed.
func (c Change) Changed() bool { return c.From != c.To }

// Accept applies the reception rules of RFC 5880 section 6.8.6 that
// depend on the session to p, a packet Unmarshal accepted, as received
// (raw) at now; it returns nil when the packet is the session's, or one
// of the Err values when it must be discarded. The rules:
//
//   - a nonzero Your Discriminator must be this session's;
//   - a zero Your Discriminator (the peer does not know this session yet)
//     is accepted while the session is Down or AdminDown; while it is
//     Init or Up only from the peer's own session telling it is Down or
//     AdminDown, known by its My Discriminator (FRR 8.4's bfdd sends its
//     last packet that way when it replaces a session as BGP comes up;
//     discarding it reset BGP on every BGP up). Forging it needs the
//     peer's random discriminator, which only an attacker who sees the
//     session's packets has. Without the rule, a packet forged with the
//     peer's address alone took an Up session down;
//   - while Up, My Discriminator must be the peer's: it does not change
//     during a session;
//   - the A bit must match the session's authentication, and with
//     authentication the type, key ID, digest and sequence number must
//     pass (RFC 5880 section 6.7.4).
//
// A packet that passes moves the receive sequence number; call Receive
// next.
func (s *Session) Accept(p Control, raw []byte, now time.Time) error {
	up := s.state == Init || s.state == Up
	switch {
	case p.YourDiscriminator != 0 && p.YourDiscriminator != s.localDiscr:
		return ErrNoSession
	case p.YourDiscriminator == 0 && up && (p.MyDiscriminator != s.remoteDiscr || p.State != Down && p.State != AdminDown):
		return ErrSessionUp
	case s.state == Up && p.MyDiscriminator != s.remoteDiscr:
		return ErrPeerDiscr
	}
	if s.auth == nil {
		if p.AuthPresent {
			return ErrAuthRequired
		}
		s.lastRx = now
		return nil
	}
	if !p.AuthPresent {
		return ErrAuthMissing
	}
	if p.AuthType != s.auth.Type || p.AuthKeyID != s.auth.KeyID {
		return ErrAuthKey
	}
	// bfd.AuthSeqKnown lapses after two detection times without a packet.
	if s.seqKnown && (s.lastRx.IsZero() || now.Sub(s.lastRx) > 2*max(s.detectTime(), time.Duration(s.timers.Multiplier)*SlowTx)) {
		s.seqKnown = false
	}
	if s.seqKnown {
		// Modular distance from the last accepted number: within 3 x
		// bfd.DetectMult, at least 1 for Meticulous Keyed SHA1.
		d := p.AuthSeq - s.rcvSeq
		least := uint32(0)
		if s.auth.Type == AuthMeticulousKeyedSHA1 {
			least = 1
		}
		if d < least || d > 3*uint32(s.timers.Multiplier) {
			return ErrAuthSeq
		}
	}
	if !verify(raw, s.auth.Key) {
		return ErrAuthDigest
	}
	s.rcvSeq, s.seqKnown, s.lastRx = p.AuthSeq, true, now
	return nil
}

// Receive applies a valid packet (one Unmarshal accepted, the caller
// matched to this session, and Accept accepted) received at now: the
// reception rules of RFC 5880 section 6.8.6 that change the session.
func (s *Session) Receive(p Control, now time.Time) Change {
	ch := Change{From: s.state}
	s.remoteDiscr = p.MyDiscriminator
	s.remoteState = p.State
	s.remoteMinRx = p.RequiredMinRx
	s.remoteDesiredTx = p.DesiredMinTx
	s.remoteMult = p.DetectMult
	if p.Final && s.polling {
		s.endPoll()
		if s.repoll {
			s.repoll = false
			s.startPoll()
			ch.SendNow = true
		}
	}
	ch.SendFinal = p.Poll
	if s.state == AdminDown {
		ch.To = s.state
		return ch
	}
	s.deadline = now.Add(s.detectTime())
	switch {
	case p.State == AdminDown:
		if s.state != Down {
			s.goDown(DiagNeighborDown)
		}
	case s.state == Down:
		switch p.State {
		case Down:
			s.state = Init
		case Init:
			s.goUp()
		}
	case s.state == Init:
		if p.State == Init || p.State == Up {
			s.goUp()
		}
	case s.state == Up:
		if p.State == Down {
			s.goDown(DiagNeighborDown)
			ch.PeerReset = p.Diag == DiagNone || p.Diag == DiagNeighborDown
		}
	}
	ch.To = s.state
	if ch.Changed() {
		ch.SendNow = true
	}
	return ch
}

// Expire applies the end of the detection time at now, if it has come:
// an Init or Up session goes Down with "control detection time expired",
// and the peer's discriminator is forgotten.
func (s *Session) Expire(now time.Time) Change {
	ch := Change{From: s.state, To: s.state}
	if s.deadline.IsZero() || now.Before(s.deadline) {
		return ch
	}
	s.deadline = time.Time{}
	s.remoteDiscr = 0
	s.remoteState = Down
	s.remoteMult = 0
	if s.state == Init || s.state == Up {
		s.goDown(DiagDetectionTimeExpired)
	}
	ch.To = s.state
	ch.SendNow = ch.Changed()
	return ch
}

// SetTimers changes the configured timers. While the session is Up a
// change of an advertised interval starts a Poll sequence (or queues one
// behind the running one); the multiplier is sent in the next packet.
func (s *Session) SetTimers(t Timers) Change {
	ch := Change{From: s.state, To: s.state}
	s.timers = t
	desired, required := t.MinTx, t.MinRx
	if s.state != Up {
		desired = max(desired, SlowTx)
	}
	ch.SendNow = s.advertise(desired, required)
	return ch
}

// Shutdown puts the session in AdminDown (diagnostic "administratively
// down"), the state its last packets tell the peer that the session was
// taken down on purpose, not lost.
func (s *Session) Shutdown() Change {
	ch := Change{From: s.state}
	s.state = AdminDown
	s.localDiag = DiagAdminDown
	s.polling, s.repoll = false, false
	s.deadline = time.Time{}
	ch.To = s.state
	ch.SendNow = true
	return ch
}

// advertise sets the advertised intervals; it returns true when a Poll
// sequence started.
func (s *Session) advertise(desired, required time.Duration) bool {
	if desired == s.desiredTx && required == s.requiredRx {
		return false
	}
	up := s.state == Up
	s.desiredTx, s.requiredRx = desired, required
	if !up || desired < s.txInForce {
		s.txInForce = desired
	}
	if !up || required > s.rxInForce {
		s.rxInForce = required
	}
	if !up {
		return false
	}
	if s.polling {
		s.repoll = true
		return false
	}
	s.startPoll()
	return true
}

func (s *Session) startPoll() { s.polling = true }

// endPoll ends a Poll sequence: the advertised values are now in force.
func (s *Session) endPoll() {
	s.polling = false
	s.txInForce, s.rxInForce = s.desiredTx, s.requiredRx
}

// goUp enters Up and moves from the slow transmit interval to the
// configured one with a Poll sequence.
func (s *Session) goUp() {
	s.state = Up
	s.localDiag = DiagNone
	s.advertise(s.timers.MinTx, s.timers.MinRx)
}

// goDown enters Down with diag and returns to the slow transmit interval.
func (s *Session) goDown(diag Diag) {
	s.state = Down
	s.localDiag = diag
	s.polling, s.repoll = false, false
	s.advertise(max(s.timers.MinTx, SlowTx), s.timers.MinRx)
}
