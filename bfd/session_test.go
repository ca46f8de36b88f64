package bfd

import (
	"errors"
	"testing"
	"time"
)

var (
	t0   = time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	fast = Timers{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3}
)

// pair is two sessions that exchange packets through the test.
type pair struct {
	a, b *Session
	now  time.Time
}

func newPair(ta, tb Timers) *pair {
	return &pair{a: NewSession(1, ta), b: NewSession(2, tb), now: t0}
}

// send delivers one packet of from to to and answers a Poll with a Final.
func (p *pair) send(t *testing.T, from, to *Session, final bool) Change {
	t.Helper()
	ch, err := p.deliver(from, to, final)
	if err != nil {
		t.Fatalf("packet of %d refused: %v", from.LocalDiscriminator(), err)
	}
	return ch
}

// deliver sends one packet of from to to through the wire format and
// Accept, and answers a Poll with a Final; it returns Accept's error.
func (p *pair) deliver(from, to *Session, final bool) (Change, error) {
	b := from.AppendPacket(nil, final)
	c, err := Unmarshal(b)
	if err != nil {
		return Change{}, err
	}
	if err := to.Accept(c, b, p.now); err != nil {
		return Change{From: to.State(), To: to.State()}, err
	}
	ch := to.Receive(c, p.now)
	if ch.SendFinal {
		if _, err := p.deliver(to, from, true); err != nil {
			return ch, err
		}
	}
	return ch, nil
}

// exchange sends one periodic packet each way, a then b.
func (p *pair) exchange(t *testing.T) {
	t.Helper()
	p.send(t, p.a, p.b, false)
	p.send(t, p.b, p.a, false)
}

// TestThreeWayHandshake brings two sessions Up: Down/Down, Init, Up
// (RFC 5880 section 6.2), and moves both from the slow one-second
// interval to the configured one with a Poll sequence.
func TestThreeWayHandshake(t *testing.T) {
	p := newPair(fast, fast)
	if p.a.Packet(false).DesiredMinTx != SlowTx {
		t.Fatalf("a session that is not Up advertises %v, want the slow %v", p.a.Packet(false).DesiredMinTx, SlowTx)
	}
	if ch := p.send(t, p.a, p.b, false); ch.To != Init || !ch.SendNow {
		t.Fatalf("b after a's Down: %+v, want Init and a packet at once", ch)
	}
	if ch := p.send(t, p.b, p.a, false); ch.To != Up {
		t.Fatalf("a after b's Init: %+v, want Up", ch)
	}
	if !p.a.Polling() || p.a.Packet(false).DesiredMinTx != fast.MinTx {
		t.Fatalf("a is Up: polling %v advertising %v, want a Poll for %v", p.a.Polling(), p.a.Packet(false).DesiredMinTx, fast.MinTx)
	}
	if ch := p.send(t, p.a, p.b, false); ch.To != Up {
		t.Fatalf("b after a's Up: %+v, want Up", ch)
	}
	// a's Poll was answered with a Final inside send.
	if p.a.Polling() {
		t.Fatal("a still polls after b's Final")
	}
	p.exchange(t)
	if p.b.Polling() {
		t.Fatal("b still polls after a's Final")
	}
	tx, det := p.a.Negotiated()
	if tx != 100*time.Millisecond || det != 300*time.Millisecond {
		t.Fatalf("a negotiated tx %v detect %v, want 100ms and 300ms", tx, det)
	}
}

func upPair(t *testing.T, ta, tb Timers) *pair {
	t.Helper()
	p := newPair(ta, tb)
	for range 4 {
		p.exchange(t)
	}
	if p.a.State() != Up || p.b.State() != Up || p.a.Polling() || p.b.Polling() {
		t.Fatalf("pair not settled Up: %v/%v polling %v/%v", p.a.State(), p.b.State(), p.a.Polling(), p.b.Polling())
	}
	return p
}

// TestNegotiation checks the agreed intervals: each side sends at the
// greater of its desired and the other's required interval, and detects
// after the other's multiplier times the greater of its required and the
// other's desired interval.
func TestNegotiation(t *testing.T) {
	a := Timers{MinTx: 50 * time.Millisecond, MinRx: 300 * time.Millisecond, Multiplier: 5}
	b := Timers{MinTx: 200 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 2}
	p := upPair(t, a, b)
	for _, tc := range []struct {
		name       string
		s          *Session
		tx, detect time.Duration
	}{
		{"a", p.a, 100 * time.Millisecond, 2 * 300 * time.Millisecond},
		{"b", p.b, 300 * time.Millisecond, 5 * 100 * time.Millisecond},
	} {
		tx, det := tc.s.Negotiated()
		if tx != tc.tx || det != tc.detect {
			t.Errorf("%s: tx %v detect %v, want %v and %v", tc.name, tx, det, tc.tx, tc.detect)
		}
	}
}

// TestDetectionExpiry: no packet for the detection time takes an Up
// session Down with diagnostic 1, forgets the peer's discriminator, and
// returns to the slow interval; an earlier Expire changes nothing.
func TestDetectionExpiry(t *testing.T) {
	p := upPair(t, fast, fast)
	last := p.now
	if ch := p.a.Expire(last.Add(299 * time.Millisecond)); ch.Changed() {
		t.Fatalf("expired before the detection time: %+v", ch)
	}
	if got := p.a.DetectDeadline().Sub(last); got != 300*time.Millisecond {
		t.Fatalf("deadline %v after the last packet, want 300ms", got)
	}
	ch := p.a.Expire(last.Add(300 * time.Millisecond))
	if ch.From != Up || ch.To != Down || !ch.SendNow {
		t.Fatalf("Expire at the deadline: %+v, want Up to Down and a packet", ch)
	}
	if p.a.Diag() != DiagDetectionTimeExpired || p.a.RemoteDiscriminator() != 0 {
		t.Fatalf("diag %v remote discriminator %d, want detection time expired and 0", p.a.Diag(), p.a.RemoteDiscriminator())
	}
	if got := p.a.Packet(false).DesiredMinTx; got != SlowTx {
		t.Fatalf("a Down session advertises %v, want %v", got, SlowTx)
	}
	// b hears a's Down: b goes Down with "neighbor signaled session down".
	if ch := p.send(t, p.a, p.b, false); ch.To != Down || p.b.Diag() != DiagNeighborDown {
		t.Fatalf("b after a's Down: %+v diag %v", ch, p.b.Diag())
	}
	// And they come back through the handshake.
	for range 4 {
		p.exchange(t)
	}
	if p.a.State() != Up || p.b.State() != Up || p.a.Diag() != DiagNone {
		t.Fatalf("not back Up: %v/%v diag %v", p.a.State(), p.b.State(), p.a.Diag())
	}
}

// TestAdminDownIsNotAFailure: a peer's AdminDown takes the session Down
// with "neighbor signaled session down" and the Event says the peer did
// it; packets to an AdminDown session are discarded.
func TestAdminDownIsNotAFailure(t *testing.T) {
	p := upPair(t, fast, fast)
	if ch := p.b.Shutdown(); ch.To != AdminDown || p.b.Diag() != DiagAdminDown {
		t.Fatalf("Shutdown: %+v diag %v", ch, p.b.Diag())
	}
	ch := p.send(t, p.b, p.a, false)
	if ch.From != Up || ch.To != Down || p.a.Diag() != DiagNeighborDown {
		t.Fatalf("a after b's AdminDown: %+v diag %v", ch, p.a.Diag())
	}
	ev := Event{From: ch.From, To: ch.To, RemoteState: p.a.RemoteState()}
	if ev.Failure() {
		t.Fatal("a peer's AdminDown counted as a path failure")
	}
	if (Event{From: Up, To: Down, RemoteState: Up}).Failure() != true {
		t.Fatal("a detection expiry is not a failure")
	}
	if ch := p.send(t, p.a, p.b, false); ch.Changed() || p.b.State() != AdminDown {
		t.Fatalf("an AdminDown session changed on a packet: %+v", ch)
	}
}

// TestTimerChangeWithoutFlap changes the timers of an Up session: a Poll
// sequence runs, an increased transmit interval takes effect only after
// the Final, a reduced receive interval keeps the old detection time
// until then, and the session never leaves Up.
func TestTimerChangeWithoutFlap(t *testing.T) {
	p := upPair(t, fast, fast)
	slower := Timers{MinTx: 300 * time.Millisecond, MinRx: 50 * time.Millisecond, Multiplier: 3}
	if ch := p.a.SetTimers(slower); !ch.SendNow || ch.Changed() || !p.a.Polling() {
		t.Fatalf("SetTimers on Up: %+v polling %v, want a Poll sent at once and no state change", ch, p.a.Polling())
	}
	if tx := p.a.TxInterval(); tx != 100*time.Millisecond {
		t.Fatalf("tx interval %v during the Poll, want the old 100ms", tx)
	}
	if _, det := p.a.Negotiated(); det != 300*time.Millisecond {
		t.Fatalf("detect %v during the Poll, want the old 300ms", det)
	}
	pk := p.a.Packet(false)
	if !pk.Poll || pk.DesiredMinTx != 300*time.Millisecond || pk.RequiredMinRx != 50*time.Millisecond {
		t.Fatalf("poll packet %+v", pk)
	}
	// A second change during the Poll waits for it to end.
	p.a.SetTimers(Timers{MinTx: 200 * time.Millisecond, MinRx: 50 * time.Millisecond, Multiplier: 4})
	if ch := p.send(t, p.a, p.b, false); ch.Changed() {
		t.Fatalf("b changed state on the Poll: %+v", ch)
	}
	// The Final ended the first Poll and started the queued one.
	if !p.a.Polling() {
		t.Fatal("the queued Poll did not start")
	}
	p.send(t, p.a, p.b, false)
	if p.a.Polling() {
		t.Fatal("the second Poll did not end")
	}
	p.exchange(t)
	if tx, det := p.a.Negotiated(); tx != 200*time.Millisecond || det != 3*100*time.Millisecond {
		t.Fatalf("after the Polls a has tx %v detect %v, want 200ms and 300ms (b sends every 100ms, x3)", tx, det)
	}
	if tx, det := p.b.Negotiated(); tx != 100*time.Millisecond || det != 4*200*time.Millisecond {
		t.Fatalf("after the Polls b has tx %v detect %v, want 100ms and 800ms", tx, det)
	}
	if p.a.State() != Up || p.b.State() != Up {
		t.Fatalf("states %v/%v, want Up/Up", p.a.State(), p.b.State())
	}
}

// TestPeerStopsPolling: a peer that asks for no packets (Required Min RX
// 0) gets none.
func TestPeerStopsPolling(t *testing.T) {
	s := NewSession(1, fast)
	s.Receive(Control{Version: 1, State: Down, DetectMult: 3, MyDiscriminator: 9, DesiredMinTx: time.Second}, t0)
	if s.TxInterval() != 0 || s.Jitter(0.5) != 0 {
		t.Fatalf("tx interval %v, want 0 for a peer that asks for none", s.TxInterval())
	}
}

// TestJitter checks the jitter bounds of RFC 5880 section 6.8.7.
func TestJitter(t *testing.T) {
	s := upPair(t, Timers{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 1}, fast).a
	if lo, hi := s.Jitter(0.9999), s.Jitter(0); lo < 75*time.Millisecond || hi > 90*time.Millisecond {
		t.Fatalf("multiplier 1: jitter %v to %v, want 75ms to 90ms", lo, hi)
	}
	s = upPair(t, fast, fast).a
	if lo, hi := s.Jitter(0.9999), s.Jitter(0); lo < 75*time.Millisecond || hi != 100*time.Millisecond {
		t.Fatalf("jitter %v to %v, want 75ms to 100ms", lo, hi)
	}
}

// TestTimersValidate checks the refused timers.
func TestTimersValidate(t *testing.T) {
	for _, bad := range []Timers{{MinTx: 0, MinRx: time.Second, Multiplier: 3}, {MinTx: time.Second, MinRx: 2 * time.Minute, Multiplier: 3}, {MinTx: time.Second, MinRx: time.Second}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	if err := fast.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestPeerResetIsNotAFailure: an Up session that hears the peer's own
// session (its discriminator) say Down with "neighbor signaled session
// down" (FRR's bfdd deleting a session, with Your Discriminator 0 as
// bfdd sends it) or "no diagnostic" goes Down marked PeerReset, and comes
// back Up with the peer's new session; a Down after the peer's detection
// time expired is a failure. A new session of the peer (another
// discriminator, Your Discriminator 0) is not heard while Up: only the
// detection time ends the old one.
func TestPeerResetIsNotAFailure(t *testing.T) {
	p := upPair(t, fast, fast)
	old := p.b
	p.b = NewSession(99, fast)
	if _, err := p.deliver(p.b, p.a, false); !errors.Is(err, ErrSessionUp) || p.a.State() != Up {
		t.Fatalf("a (%v) heard the peer's new session while Up: %v, want ErrSessionUp", p.a.State(), err)
	}
	// The peer deletes its old session: Down, "neighbor signaled session
	// down", Your Discriminator 0.
	bye := old.Packet(false)
	bye.State, bye.Diag, bye.YourDiscriminator = Down, DiagNeighborDown, 0
	if err := p.a.Accept(bye, bye.Marshal(nil), p.now); err != nil {
		t.Fatalf("the peer's deletion refused: %v", err)
	}
	ch := p.a.Receive(bye, p.now)
	if ch.From != Up || ch.To != Down || !ch.PeerReset {
		t.Fatalf("a after the peer's deletion: %+v, want Up to Down with PeerReset", ch)
	}
	if (Event{From: ch.From, To: ch.To, RemoteState: Down, PeerReset: true}).Failure() {
		t.Fatal("a peer's reset counted as a path failure")
	}
	// a still names the old session (2) until the new one speaks: the new
	// one discards those packets, as the peer's would.
	for range 4 {
		for _, d := range [][2]*Session{{p.b, p.a}, {p.a, p.b}} {
			if _, err := p.deliver(d[0], d[1], false); err != nil && !errors.Is(err, ErrNoSession) {
				t.Fatal(err)
			}
		}
	}
	if p.a.State() != Up || p.a.RemoteDiscriminator() != 99 {
		t.Fatalf("a: %v with remote discriminator %d, want Up with the new session 99", p.a.State(), p.a.RemoteDiscriminator())
	}
	// The new session restarts with "no diagnostic", its discriminator.
	again := p.b.Packet(false)
	again.State, again.Diag = Down, DiagNone
	if err := p.a.Accept(again, again.Marshal(nil), p.now); err != nil {
		t.Fatal(err)
	}
	if ch := p.a.Receive(again, p.now); ch.To != Down || !ch.PeerReset {
		t.Fatalf("a after the peer's reset: %+v, want Down with PeerReset", ch)
	}
	for range 4 {
		p.exchange(t)
	}

	// The peer's detection time expires: its Down says so: a failure.
	p.b.Expire(p.now.Add(time.Hour))
	ch = p.send(t, p.b, p.a, false)
	if ch.To != Down || ch.PeerReset {
		t.Fatalf("a after the peer's detection expired: %+v, want Down, not PeerReset", ch)
	}
}
