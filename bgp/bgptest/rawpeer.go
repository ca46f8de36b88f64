package bgptest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// BGP message types (RFC 4271 section 4.1).
const (
	MsgOpen         = 1
	MsgUpdate       = 2
	MsgNotification = 3
	MsgKeepalive    = 4
)

// headerLen is the length of a BGP message header: marker, length, type.
const headerLen = 19

// rawHoldTime is the hold time a RawPeer proposes; it sends a KEEPALIVE
// every third of it.
const rawHoldTime = 9 * time.Second

// Notification is a BGP NOTIFICATION message a RawPeer received.
type Notification struct {
	Code, Subcode uint8
	Data          []byte
}

// String names the error code and subcode.
func (n Notification) String() string {
	return fmt.Sprintf("NOTIFICATION %d/%d data %x", n.Code, n.Subcode, n.Data)
}

// RawPeer is a BGP router written from scratch for attack tests. It imports
// nothing from gobgp, so what it sends is not shaped by the engine under
// test. It listens on a loopback address for the speaker's connection,
// answers its OPEN with one of its own (4-octet AS numbers, multiprotocol
// IPv4 and IPv6 unicast), keeps the session up with KEEPALIVEs and sends
// whatever messages a test gives it. A new connection replaces the
// current one, so a session the speaker resets comes back on its own.
type RawPeer struct {
	// Addr and Port are where it listens; ASN is its AS number.
	Addr netip.Addr
	Port int
	ASN  uint32

	ln *net.TCPListener
	wg sync.WaitGroup

	mu            sync.Mutex
	cur           *rawSession
	established   int
	notifications []Notification
	changed       chan struct{} // closed and replaced on every change
}

// rawSession is one TCP connection of a RawPeer.
type rawSession struct {
	conn   net.Conn
	wmu    sync.Mutex // serialises writes
	up     bool       // the speaker's KEEPALIVE after the OPENs arrived
	closed chan struct{}
	once   sync.Once
	// notification is what the speaker sent before closing, if anything.
	notification *Notification
}

// StartRawPeer listens on addr (a loopback address) at a free port as a
// router of AS asn, until the end of the test.
func StartRawPeer(tb testing.TB, addr netip.Addr, asn uint32) *RawPeer {
	tb.Helper()
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
	if err != nil {
		tb.Fatalf("raw BGP peer: listen on %s: %v", addr, err)
	}
	p := &RawPeer{Addr: addr, Port: ln.Addr().(*net.TCPAddr).Port, ASN: asn, ln: ln, changed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(p.close)
	return p
}

// close stops listening, closes the session and waits for its goroutines.
func (p *RawPeer) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	s := p.cur
	p.mu.Unlock()
	if s != nil {
		s.shut()
	}
	p.wg.Wait()
}

// accept serves each connection the speaker opens, one at a time.
func (p *RawPeer) accept() {
	defer p.wg.Done()
	for {
		conn, err := p.ln.Accept()
		if err != nil {
			return
		}
		s := &rawSession{conn: conn, closed: make(chan struct{})}
		p.mu.Lock()
		old := p.cur
		p.cur = s
		p.notifyLocked()
		p.mu.Unlock()
		if old != nil {
			old.shut()
		}
		p.wg.Add(2)
		go p.serve(s)
		go p.keepalive(s)
	}
}

// notifyLocked wakes the waiters; the caller holds p.mu.
func (p *RawPeer) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (s *rawSession) shut() {
	s.once.Do(func() {
		_ = s.conn.Close()
		close(s.closed)
	})
}

func (s *rawSession) write(msg []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_ = s.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err := s.conn.Write(msg)
	return err
}

// serve runs the session: the OPEN exchange, then every message the
// speaker sends, until the connection ends.
func (p *RawPeer) serve(s *rawSession) {
	defer p.wg.Done()
	defer func() {
		s.shut()
		p.mu.Lock()
		p.notifyLocked()
		p.mu.Unlock()
	}()
	typ, _, err := readMessage(s.conn, 3*rawHoldTime)
	if err != nil || typ != MsgOpen {
		return
	}
	if s.write(p.open()) != nil || s.write(Message(MsgKeepalive, nil)) != nil {
		return
	}
	for {
		typ, body, err := readMessage(s.conn, 3*rawHoldTime)
		if err != nil {
			return
		}
		switch typ {
		case MsgKeepalive:
			p.mu.Lock()
			if !s.up {
				s.up = true
				p.established++
				p.notifyLocked()
			}
			p.mu.Unlock()
		case MsgNotification:
			n := Notification{}
			if len(body) >= 2 {
				n = Notification{Code: body[0], Subcode: body[1], Data: append([]byte(nil), body[2:]...)}
			}
			p.mu.Lock()
			s.notification = &n
			p.notifications = append(p.notifications, n)
			p.mu.Unlock()
			return
		}
	}
}

// keepalive sends a KEEPALIVE every third of the hold time.
func (p *RawPeer) keepalive(s *rawSession) {
	defer p.wg.Done()
	t := time.NewTicker(rawHoldTime / 3)
	defer t.Stop()
	for {
		select {
		case <-s.closed:
			return
		case <-t.C:
			if s.write(Message(MsgKeepalive, nil)) != nil {
				s.shut()
				return
			}
		}
	}
}

// open builds the peer's OPEN: version 4, its AS (AS_TRANS when it needs
// four octets), the hold time, its address as BGP identifier, and the
// multiprotocol IPv4 and IPv6 unicast and 4-octet AS capabilities.
func (p *RawPeer) open() []byte {
	as2 := uint16(23456) // AS_TRANS
	if p.ASN <= 0xffff {
		as2 = uint16(p.ASN)
	}
	caps := []byte{
		1, 4, 0, 1, 0, 1, // multiprotocol IPv4 unicast
		1, 4, 0, 2, 0, 1, // multiprotocol IPv6 unicast
		65, 4, 0, 0, 0, 0, // 4-octet AS number
	}
	binary.BigEndian.PutUint32(caps[14:], p.ASN)
	id := p.Addr.As4()
	body := []byte{4, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(body[1:], as2)
	binary.BigEndian.PutUint16(body[3:], uint16(rawHoldTime/time.Second))
	body = append(body, id[:]...)
	body = append(body, low8(2+len(caps)), 2, low8(len(caps)))
	body = append(body, caps...)
	return Message(MsgOpen, body)
}

// readMessage reads one BGP message within timeout and returns its type
// and body.
func readMessage(conn net.Conn, timeout time.Duration) (byte, []byte, error) {
	_ = conn.SetReadDeadline(time.Now().Add(timeout))
	hdr := make([]byte, headerLen)
	if _, err := io.ReadFull(conn, hdr); err != nil {
		return 0, nil, fmt.Errorf("read BGP header: %w", err)
	}
	n := int(binary.BigEndian.Uint16(hdr[16:18]))
	if n < headerLen {
		return 0, nil, fmt.Errorf("BGP message length %d is below the header's", n)
	}
	body := make([]byte, n-headerLen)
	if _, err := io.ReadFull(conn, body); err != nil {
		return 0, nil, fmt.Errorf("read BGP message body: %w", err)
	}
	return hdr[18], body, nil
}

// WaitEstablished waits until a session is Established: the speaker has
// sent its KEEPALIVE after the OPENs, and the connection is still open.
func (p *RawPeer) WaitEstablished(timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		p.mu.Lock()
		up := p.cur != nil && p.cur.up && !isClosed(p.cur.closed)
		changed := p.changed
		p.mu.Unlock()
		if up {
			return nil
		}
		select {
		case <-changed:
		case <-deadline.C:
			return fmt.Errorf("raw BGP peer %s: no established session after %s", p.Addr, timeout)
		}
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// Drop closes the current session's connection without a NOTIFICATION,
// as a router that lost its TCP state does; the speaker connects again.
func (p *RawPeer) Drop() {
	p.mu.Lock()
	s := p.cur
	p.mu.Unlock()
	if s != nil {
		s.shut()
	}
}

// Established returns how many sessions have reached Established.
func (p *RawPeer) Established() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.established
}

// Notifications returns the NOTIFICATIONs the speaker sent, in order.
func (p *RawPeer) Notifications() []Notification {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Notification(nil), p.notifications...)
}

// Outcome is what became of the session after a message was sent on it.
type Outcome struct {
	// Kept is set when the session was still open after the wait.
	Kept bool
	// Notification is what the speaker sent before it closed the
	// session, if it did.
	Notification *Notification
}

// String says whether the session was kept, reset with a NOTIFICATION or
// closed without one.
func (o Outcome) String() string {
	switch {
	case o.Kept:
		return "session kept"
	case o.Notification != nil:
		return "session reset with " + o.Notification.String()
	default:
		return "connection closed without a NOTIFICATION"
	}
}

// Send writes msg on the established session, then waits up to settle for
// the speaker to close it, and says what happened. It fails when no
// session is established.
func (p *RawPeer) Send(msg []byte, settle time.Duration) (Outcome, error) {
	p.mu.Lock()
	s := p.cur
	p.mu.Unlock()
	if s == nil || !s.up || isClosed(s.closed) {
		return Outcome{}, errors.New("raw BGP peer: no established session")
	}
	if err := s.write(msg); err != nil {
		return Outcome{}, fmt.Errorf("raw BGP peer: send: %w", err)
	}
	select {
	case <-s.closed:
	case <-time.After(settle):
		return Outcome{Kept: true}, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return Outcome{Notification: s.notification}, nil
}

// Message builds a BGP message of type typ around body: the marker, the
// length and the type. A body too long for the length field is still
// written whole, with the length truncated, as a malformed message would
// be.
func Message(typ byte, body []byte) []byte {
	msg := make([]byte, headerLen, headerLen+len(body))
	for i := range 16 {
		msg[i] = 0xff
	}
	binary.BigEndian.PutUint16(msg[16:], uint16(headerLen+len(body))) //nolint:gosec // truncation is the point for malformed messages
	msg[18] = typ
	return append(msg, body...)
}
