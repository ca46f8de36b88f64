package bfd

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// UDP ports of BFD Control packets.
const (
	// SingleHopPort is the destination port of single-hop sessions (RFC
	// 5881).
	SingleHopPort = 3784
	// MultihopPort is the destination port of multihop sessions (RFC 5883).
	MultihopPort = 4784
)

// TTLs accepted on received packets: single hop accepts only 255, the
// generalized TTL security mechanism RFC 5881 section 5 requires.
// Multihop accepts DefaultMultihopMinTTL unless the session says
// otherwise (RFC 5883 section 5 leaves the check to the configuration):
// FRR's bfdd sends multihop packets with TTL 255 and accepts 254 by
// default; BIRD sends them with the system's default TTL, 64, so a
// session with BIRD sets SessionConfig.MinTTL to 64 or less (one less per
// router between them).
const (
	singleHopMinTTL = 255
	// DefaultMultihopMinTTL is the least TTL a multihop session accepts
	// when SessionConfig.MinTTL is 0: one router between the sides.
	DefaultMultihopMinTTL = 254
)

// shutdownPackets is how many AdminDown packets a removed session sends,
// so that the peer sees the session taken down on purpose even if one is
// lost.
const shutdownPackets = 3

// SessionConfig configures one session.
type SessionConfig struct {
	// Peer is the remote system's address.
	Peer netip.Addr
	// Local is the local address packets are sent from and received on;
	// when zero, the address the kernel routes Peer from.
	Local netip.Addr
	// Multihop selects RFC 5883 instead of RFC 5881.
	Multihop bool
	// MinTTL is the least TTL (IPv6 hop limit) a multihop session accepts,
	// 1 to 255; 0 means DefaultMultihopMinTTL. Packets below it are
	// dropped by the receiving socket's filter in the kernel and checked
	// again per session. Single hop always requires 255.
	MinTTL uint8
	// Timers are the session's timers.
	Timers Timers
	// Auth, when set, authenticates the session's packets.
	Auth *Auth
}

// minTTL returns the least TTL the session accepts.
func (c *SessionConfig) minTTL() uint8 {
	switch {
	case !c.Multihop:
		return singleHopMinTTL
	case c.MinTTL == 0:
		return DefaultMultihopMinTTL
	}
	return c.MinTTL
}

// Event is a session's change of state.
type Event struct {
	// Key names the session (Manager.Set's key).
	Key string
	// From and To are the states before and after.
	From, To State
	// Diag is the local diagnostic after the change.
	Diag Diag
	// RemoteState is the state the peer last reported: AdminDown when the
	// peer took the session down on purpose, which is not a path failure
	// (RFC 5882 section 3.2).
	RemoteState State
	// PeerReset is set when the session went Down because the peer reset
	// it without a path failure (see Change.PeerReset).
	PeerReset bool
}

// Failure reports whether the event is a loss of the path: a session that
// was Up went Down, and not because the peer took it down on purpose or
// reset it.
func (e Event) Failure() bool {
	return e.From == Up && e.To == Down && e.RemoteState != AdminDown && !e.PeerReset
}

// Status is a snapshot of one session.
type Status struct {
	State, RemoteState State
	Diag               Diag
	// Since is when State was entered.
	Since time.Time
	// Tx is the transmit interval in force, Detect the detection time.
	Tx, Detect time.Duration
	// LocalDiscr and RemoteDiscr are the discriminators.
	LocalDiscr, RemoteDiscr uint32
	// Local is the local address in use.
	Local netip.Addr
	// PacketsIn and PacketsOut count Control packets; Downs counts the
	// session's changes from Up to Down; Discarded counts the packets
	// matched to the session and discarded (RFC 5880 section 6.8.6:
	// wrong discriminators for its state, TTL, authentication).
	PacketsIn, PacketsOut, Downs, Discarded uint64
	// TxLateMax is the most a periodic packet went out after its time,
	// and RxGapMax the longest time between two packets the session
	// accepted while Up, since it started: how close the process's own
	// scheduling (its goroutines starved of CPU) came to the detection
	// time, on the sending and on the receiving side. RxGapMax includes
	// the peer's interval and its jitter.
	TxLateMax, RxGapMax time.Duration
	// Err is the last socket error, if any.
	Err string
}

// Manager runs BFD sessions over UDP sockets in the caller's network
// namespace. Packets are received on one socket per local address and
// port, whose kernel filter drops those below the least TTL of its
// sessions, demultiplexed by Your Discriminator (or, while it is zero, by
// the peer's address); each session sends from its own socket, from a
// source port in 49152-65535, with TTL 255.
type Manager struct {
	log      klog.Logger
	onChange func(Event)
	discards *Discards

	mu        sync.Mutex
	sessions  map[string]*runner
	byDiscr   map[uint32]*runner
	listeners map[netip.AddrPort]*listener
	closed    bool
}

// NewManager returns a Manager; onChange, when set, is called on every
// state change, from the session's goroutine: it must not block for long.
func NewManager(log klog.Logger, onChange func(Event)) *Manager {
	return &Manager{
		log:       log,
		onChange:  onChange,
		discards:  newDiscards(),
		sessions:  map[string]*runner{},
		byDiscr:   map[uint32]*runner{},
		listeners: map[netip.AddrPort]*listener{},
	}
}

// Discards returns the Manager's counts of discarded packets.
func (m *Manager) Discards() *Discards { return m.discards }

// Set creates the session key with cfg, or changes its timers. A change of
// the peer, the local address, multihop, the minimum TTL or the
// authentication recreates the session; a change of timers alone
// renegotiates them with a Poll sequence, without a flap.
func (m *Manager) Set(key string, cfg SessionConfig) error {
	if err := cfg.Timers.Validate(); err != nil {
		return err
	}
	if !cfg.Peer.IsValid() {
		return errors.New("bfd: no peer address")
	}
	if cfg.MinTTL != 0 && !cfg.Multihop {
		return errors.New("bfd: a minimum TTL applies to multihop sessions only: single hop accepts TTL 255 alone")
	}
	if cfg.Auth != nil {
		if err := cfg.Auth.Validate(); err != nil {
			return err
		}
	}
	cfg.Peer = cfg.Peer.Unmap()
	cfg.Local = cfg.Local.Unmap()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return errors.New("bfd: manager is closed")
	}
	if r, ok := m.sessions[key]; ok {
		if r.cfg.Peer == cfg.Peer && r.cfg.Local == cfg.Local && r.cfg.Multihop == cfg.Multihop && r.cfg.minTTL() == cfg.minTTL() && r.cfg.Auth.Equal(cfg.Auth) {
			r.cfg.Timers = cfg.Timers
			m.mu.Unlock()
			r.setTimers(cfg.Timers)
			return nil
		}
		m.removeLocked(key)
	}
	m.mu.Unlock()
	return m.add(key, cfg)
}

// add opens the sockets of a new session and starts it.
func (m *Manager) add(key string, cfg SessionConfig) error {
	local := cfg.Local
	if !local.IsValid() {
		var err error
		if local, err = routeSource(cfg.Peer); err != nil {
			return err
		}
	}
	port := uint16(SingleHopPort)
	if cfg.Multihop {
		port = MultihopPort
	}
	tx, err := openSender(local, cfg.Peer)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		_ = tx.Close()
		return errors.New("bfd: manager is closed")
	}
	lk := netip.AddrPortFrom(local, port)
	l := m.listeners[lk]
	if l == nil {
		if l, err = m.listen(lk); err != nil {
			_ = tx.Close()
			return err
		}
		m.listeners[lk] = l
	}
	l.users++
	discr := randomDiscriminator()
	for discr == 0 || m.byDiscr[discr] != nil {
		discr = randomDiscriminator()
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := m.newRunner(key, cfg, local, port, tx, lk, discr, cancel)
	r.status = r.snapshot(time.Now())
	m.sessions[key] = r
	m.byDiscr[discr] = r
	m.filterLocked(lk)
	go r.run(ctx)
	// cfg.Auth's String leaves the key out.
	r.log.V(2).Info("Started BFD session", "local", local, "multihop", cfg.Multihop, "minTTL", r.minTTL, "auth", cfg.Auth.String(),
		"minTx", cfg.Timers.MinTx, "minRx", cfg.Timers.MinRx, "multiplier", cfg.Timers.Multiplier)
	return nil
}

// newRunner returns the runner of a new session, not started.
func (m *Manager) newRunner(key string, cfg SessionConfig, local netip.Addr, port uint16, tx *sender, lk netip.AddrPort, discr uint32, cancel context.CancelFunc) *runner {
	r := &runner{
		key: key, cfg: cfg, local: local, port: port, tx: tx, listener: lk, minTTL: int(cfg.minTTL()), discards: m.discards,
		s:      NewSession(discr, cfg.Timers),
		rx:     make(chan received, 16),
		timers: make(chan Timers, 1),
		cancel: cancel, done: make(chan struct{}),
		log:    m.log.WithValues("bfdPeer", cfg.Peer, "key", key),
		notify: m.onChange,
	}
	if cfg.Auth != nil {
		// bfd.XmitAuthSeq starts at a random value (RFC 5880 section
		// 6.8.1), drawn like a discriminator.
		r.s.SetAuth(cfg.Auth, randomDiscriminator())
	}
	return r
}

// Remove takes the session key down: it sends AdminDown packets and
// closes the session. Removing an unknown key does nothing.
func (m *Manager) Remove(key string) {
	m.mu.Lock()
	r := m.removeLocked(key)
	m.mu.Unlock()
	if r != nil {
		<-r.done
	}
}

// removeLocked stops the session key and releases its listener; the
// caller holds m.mu. It returns the runner, whose done closes when its
// AdminDown packets are sent.
func (m *Manager) removeLocked(key string) *runner {
	r := m.sessions[key]
	if r == nil {
		return nil
	}
	delete(m.sessions, key)
	delete(m.byDiscr, r.s.LocalDiscriminator())
	r.cancel()
	if l := m.listeners[r.listener]; l != nil {
		l.users--
		if l.users == 0 {
			delete(m.listeners, r.listener)
			_ = l.conn.Close()
		} else {
			m.filterLocked(r.listener)
		}
	}
	return r
}

// filterLocked sets the kernel filter of listener lk to the least TTL its
// sessions accept; the caller holds m.mu. A filter that cannot be set is
// logged: the sessions check the TTL themselves as well.
func (m *Manager) filterLocked(lk netip.AddrPort) {
	l := m.listeners[lk]
	if l == nil {
		return
	}
	least := 255
	for _, r := range m.sessions {
		if r.listener == lk {
			least = min(least, r.minTTL)
		}
	}
	if least == l.minTTL {
		return
	}
	if err := setTTLFilter(l.conn, lk.Addr().Is4(), least); err != nil {
		m.log.Error(err, "Cannot set the kernel's TTL filter on the BFD socket; sessions still check the TTL", "local", lk, "minTTL", least)
		return
	}
	l.minTTL = least
}

// Status returns a snapshot of the session key.
func (m *Manager) Status(key string) (Status, bool) {
	m.mu.Lock()
	r := m.sessions[key]
	m.mu.Unlock()
	if r == nil {
		return Status{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.status, true
}

// Keys returns the configured sessions' keys.
func (m *Manager) Keys() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := make([]string, 0, len(m.sessions))
	for k := range m.sessions {
		keys = append(keys, k)
	}
	return keys
}

// Close takes every session down (AdminDown) and closes the sockets.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	var runners []*runner
	for k := range m.sessions {
		runners = append(runners, m.removeLocked(k))
	}
	m.mu.Unlock()
	for _, r := range runners {
		<-r.done
	}
}

// randomDiscriminator returns a random local discriminator: RFC 5880
// section 6.8.1 asks for one an attacker cannot guess, so that a spoofed
// packet does not match the session.
func randomDiscriminator() uint32 {
	var b [4]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails on Linux
	return binary.BigEndian.Uint32(b[:])
}

// routeSource returns the address the kernel sends to peer from.
func routeSource(peer netip.Addr) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer, SingleHopPort)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("bfd: no route to %s: %w", peer, err)
	}
	defer func() { _ = c.Close() }()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// sender is a session's socket: bound to the local address and a source
// port in 49152-65535 (RFC 5881 section 4), TTL 255, DSCP CS6.
type sender struct {
	conn *net.UDPConn
}

// openSender binds a sender from local toward peer; the destination port
// is set per packet.
func openSender(local, peer netip.Addr) (*sender, error) {
	var lastErr error
	for range 32 {
		port := 49152 + rand.IntN(16384)                                                                 //nolint:gosec // a source port, not a secret
		c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(local, uint16(port)))) //nolint:gosec // within 49152-65535
		if err != nil {
			lastErr = err
			continue
		}
		if err := setTTLAndClass(c, local.Is4()); err != nil {
			_ = c.Close()
			return nil, err
		}
		return &sender{conn: c}, nil
	}
	return nil, fmt.Errorf("bfd: no free source port on %s for peer %s: %w", local, peer, lastErr)
}

func setTTLAndClass(c *net.UDPConn, v4 bool) error {
	if v4 {
		p := ipv4.NewPacketConn(c)
		if err := p.SetTTL(255); err != nil {
			return fmt.Errorf("bfd: set TTL 255: %w", err)
		}
		if err := p.SetTOS(0xc0); err != nil {
			return fmt.Errorf("bfd: set DSCP CS6: %w", err)
		}
		return nil
	}
	p := ipv6.NewPacketConn(c)
	if err := p.SetHopLimit(255); err != nil {
		return fmt.Errorf("bfd: set hop limit 255: %w", err)
	}
	if err := p.SetTrafficClass(0xc0); err != nil {
		return fmt.Errorf("bfd: set DSCP CS6: %w", err)
	}
	return nil
}

// Close closes the socket.
func (s *sender) Close() error { return s.conn.Close() }

// listener receives the packets sent to one local address and port.
type listener struct {
	conn  *net.UDPConn
	users int
	// minTTL is the TTL its kernel filter accepts from (0: no filter yet).
	minTTL int
}

// received is a packet handed to a session.
type received struct {
	p   Control
	raw []byte
	ttl int
	at  time.Time
}

// listen opens the receiving socket of la and starts its reader. The
// socket reports each packet's TTL (hop limit) and the kernel's count of
// packets it dropped (its filter's, see setTTLFilter).
func (m *Manager) listen(la netip.AddrPort) (*listener, error) {
	v4 := la.Addr().Is4()
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = listenOptions(int(fd), v4)
		}); err != nil {
			return err
		}
		return serr
	}}
	network := "udp6"
	if v4 {
		network = "udp4"
	}
	pc, err := lc.ListenPacket(context.Background(), network, la.String())
	if err != nil {
		return nil, fmt.Errorf("bfd: listen on %s: %w", la, err)
	}
	l := &listener{conn: pc.(*net.UDPConn)}
	go m.readLoop(la, l.conn)
	return l, nil
}

// listenOptions sets a listening socket's options: shared address,
// received TTLs or hop limits, and the kernel's drop count.
func listenOptions(fd int, v4 bool) error {
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return fmt.Errorf("bfd: SO_REUSEADDR: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1); err != nil {
		return fmt.Errorf("bfd: SO_RXQ_OVFL: %w", err)
	}
	if v4 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVTTL, 1); err != nil {
			return fmt.Errorf("bfd: receive TTLs: %w", err)
		}
		return nil
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, 1); err != nil {
		return fmt.Errorf("bfd: receive hop limits: %w", err)
	}
	return nil
}

// setTTLFilter attaches to c a socket filter that drops, in the kernel,
// every packet whose TTL (IPv6 hop limit) is below minTTL. Linux applies
// IP_MINTTL and IPV6_MINHOPCOUNT to TCP only: a UDP socket with them set
// still receives a TTL 1 datagram, so the check is a classic BPF program
// reading the IP header (SKF_NET_OFF). The kernel counts what it drops
// in the socket's drop counter, which the reader reports (reason
// "kernel").
func setTTLFilter(c *net.UDPConn, v4 bool, minTTL int) error {
	field := int32(skfNetOff + 7) // IPv6 hop limit
	if v4 {
		field = skfNetOff + 8 // IPv4 TTL
	}
	off := uint32(field) //nolint:gosec // the negative offset's two's complement, as the kernel reads it
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: off},
		{Code: unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K, Jt: 0, Jf: 1, K: uint32(minTTL)}, //nolint:gosec // 1 to 255
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffffffff},
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return fmt.Errorf("bfd: TTL filter: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}) //nolint:gosec // four instructions
	}); err != nil {
		return fmt.Errorf("bfd: TTL filter: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("bfd: TTL filter %d: %w", minTTL, serr)
	}
	return nil
}

// skfNetOff is SKF_NET_OFF: a classic BPF load at this offset plus n reads
// byte n of the network header.
const skfNetOff = -0x100000

// readMeta is what a received packet's control messages say.
type readMeta struct {
	// ttl is the TTL or hop limit, -1 when unknown.
	ttl int
	// drops is the socket's drop count, when hasDrops.
	drops    uint32
	hasDrops bool
}

// parseControl reads the TTL or hop limit and the drop count from oob.
func parseControl(oob []byte) readMeta {
	meta := readMeta{ttl: -1}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return meta
	}
	for _, msg := range msgs {
		h := msg.Header
		switch {
		case len(msg.Data) < 4:
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TTL, h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_HOPLIMIT:
			meta.ttl = int(int32(binary.NativeEndian.Uint32(msg.Data))) //nolint:gosec // the kernel's int
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_RXQ_OVFL:
			meta.drops, meta.hasDrops = binary.NativeEndian.Uint32(msg.Data), true
		}
	}
	return meta
}

// readLoop reads la's packets until its socket closes and hands each one
// that passes the packet's own checks to its session; it counts the
// others, and the kernel's drops, by reason.
func (m *Manager) readLoop(la netip.AddrPort, conn *net.UDPConn) {
	buf := make([]byte, 512)
	oob := make([]byte, 128)
	var drops uint32
	for {
		n, oobn, _, from, err := conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			m.log.V(4).Info("BFD read failed", "local", la, "err", err)
			continue
		}
		now := time.Now()
		src := from.Addr().Unmap()
		meta := parseControl(oob[:oobn])
		if meta.hasDrops && meta.drops != drops {
			m.discards.count(reasonKernel, uint64(meta.drops-drops))
			drops = meta.drops
		}
		p, err := Unmarshal(buf[:n])
		if err != nil {
			m.discard(la, src, err)
			continue
		}
		r := m.demux(p, src, la)
		if r == nil {
			m.discard(la, src, ErrNoSession)
			continue
		}
		select {
		case r.rx <- received{p: p, raw: append([]byte(nil), buf[:min(n, MaxPacketLen)]...), ttl: meta.ttl, at: now}:
		default:
			// The session is behind; its next packet tells the same.
		}
	}
}

// discard counts a discarded packet and logs it at level 4.
func (m *Manager) discard(la netip.AddrPort, src netip.Addr, err error) {
	m.discards.count(Reason(err), 1)
	m.log.V(4).Info("Discarded a BFD packet", "local", la, "from", src, "reason", Reason(err), "err", err)
}

// demux finds the session of a packet from src to local address and port
// la: by Your Discriminator when it is nonzero (the session must be the
// peer's and this socket's), else by the peer's address.
func (m *Manager) demux(p Control, src netip.Addr, la netip.AddrPort) *runner {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p.YourDiscriminator != 0 {
		r := m.byDiscr[p.YourDiscriminator]
		if r == nil || r.cfg.Peer != src || r.listener != la {
			return nil
		}
		return r
	}
	for _, r := range m.sessions {
		if r.cfg.Peer == src && r.listener == la {
			return r
		}
	}
	return nil
}

// runner runs one Session: its timers, its sends and its received packets.
type runner struct {
	key      string
	cfg      SessionConfig
	local    netip.Addr
	port     uint16
	tx       *sender
	listener netip.AddrPort
	// minTTL is the least TTL the session accepts.
	minTTL int
	log    klog.Logger
	notify func(Event)
	// discards is the Manager's.
	discards *Discards

	// s and lastRx (when the last accepted packet came) are owned by the
	// run goroutine.
	s      *Session
	lastRx time.Time
	rx     chan received
	timers chan Timers
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	status Status
}

// setTimers hands new timers to the run goroutine, replacing any not yet
// taken.
func (r *runner) setTimers(t Timers) {
	for {
		select {
		case r.timers <- t:
			return
		default:
		}
		select {
		case <-r.timers:
		default:
		}
	}
}

// run is the session's goroutine.
func (r *runner) run(ctx context.Context) {
	defer close(r.done)
	defer func() { _ = r.tx.Close() }()
	txTimer := time.NewTimer(0)
	defer txTimer.Stop()
	detect := time.NewTimer(time.Hour)
	detect.Stop()
	defer detect.Stop()
	armDetect := func() {
		detect.Stop()
		if d := r.s.DetectDeadline(); !d.IsZero() {
			detect.Reset(time.Until(d))
		}
	}
	// nextTx is when the armed periodic packet goes out (zero: none).
	var nextTx time.Time
	armTx := func() {
		txTimer.Stop()
		nextTx = time.Time{}
		if iv := r.s.Jitter(rand.Float64()); iv > 0 { //nolint:gosec // jitter, not a secret
			txTimer.Reset(iv)
			nextTx = time.Now().Add(iv)
		}
	}
	for {
		var ch Change
		now := time.Now()
		txBefore := r.s.TxInterval()
		select {
		case <-ctx.Done():
			r.shutdown()
			return
		case <-txTimer.C:
			r.sendPeriodic(nextTx)
			armTx()
			continue
		case <-detect.C:
			ch = r.s.Expire(time.Now())
			armDetect()
		case p := <-r.rx:
			var ok bool
			if ch, ok = r.receive(p); !ok {
				continue
			}
			armDetect()
			if ch.SendFinal {
				r.send(true)
			}
		case t := <-r.timers:
			ch = r.s.SetTimers(t)
			r.log.V(2).Info("Changed BFD timers", "minTx", t.MinTx, "minRx", t.MinRx, "multiplier", t.Multiplier, "poll", r.s.Polling())
		}
		r.record(ch, now)
		switch tx := r.s.TxInterval(); {
		case ch.SendNow:
			r.send(false)
			armTx()
		case tx != txBefore && (nextTx.IsZero() || time.Until(nextTx) > tx):
			// A faster interval (the peer lowered its Required Min RX,
			// or a Poll ended) takes effect now, not after the slower
			// packet already scheduled: the peer's detection time
			// already counts on it.
			armTx()
		}
	}
}

// receive checks p against the session, its TTL first (Accept moves the
// authentication sequence), and applies it; ok is false when p was
// discarded, which changes nothing but the counters.
func (r *runner) receive(p received) (ch Change, ok bool) {
	err := ErrTTL
	if p.ttl >= r.minTTL {
		err = r.s.Accept(p.p, p.raw, p.at)
	}
	if err != nil {
		r.discards.count(Reason(err), 1)
		r.count(func(s *Status) { s.Discarded++ })
		r.log.V(4).Info("Discarded a BFD packet", "reason", Reason(err), "err", err, "ttl", p.ttl, "state", p.p.State,
			"myDiscriminator", p.p.MyDiscriminator, "yourDiscriminator", p.p.YourDiscriminator)
		return Change{}, false
	}
	up := r.s.State() == Up
	ch = r.s.Receive(p.p, p.at)
	r.count(func(s *Status) {
		if up && !r.lastRx.IsZero() {
			s.RxGapMax = max(s.RxGapMax, p.at.Sub(r.lastRx))
		}
	})
	r.lastRx = p.at
	if ch.Changed() {
		r.log.V(4).Info("BFD packet changed the session's state", "state", p.p.State, "diag", p.p.Diag, "myDiscriminator", p.p.MyDiscriminator, "yourDiscriminator", p.p.YourDiscriminator)
	}
	r.count(func(s *Status) { s.PacketsIn++ })
	return ch, true
}

// shutdown sends the AdminDown packets of a removed session.
func (r *runner) shutdown() {
	ch := r.s.Shutdown()
	for i := range shutdownPackets {
		if i > 0 {
			time.Sleep(10 * time.Millisecond)
		}
		r.send(false)
	}
	r.record(ch, time.Now())
	r.log.V(2).Info("Stopped BFD session")
}

// sendPeriodic sends the periodic packet due at due (zero: the first,
// sent at once), recording how late it goes (Status.TxLateMax).
func (r *runner) sendPeriodic(due time.Time) {
	if !due.IsZero() {
		late := time.Since(due)
		r.count(func(s *Status) { s.TxLateMax = max(s.TxLateMax, late) })
	}
	r.send(false)
}

// send sends one packet.
func (r *runner) send(final bool) {
	b := r.s.AppendPacket(make([]byte, 0, MaxPacketLen), final)
	_, err := r.tx.conn.WriteToUDPAddrPort(b, netip.AddrPortFrom(r.cfg.Peer, r.port))
	r.count(func(s *Status) {
		if err != nil {
			s.Err = err.Error()
			return
		}
		s.Err = ""
		s.PacketsOut++
	})
}

func (r *runner) count(f func(*Status)) {
	r.mu.Lock()
	f(&r.status)
	r.mu.Unlock()
}

// record updates the status after ch and reports a change of state.
func (r *runner) record(ch Change, now time.Time) {
	snap := r.snapshot(now)
	r.mu.Lock()
	snap.PacketsIn, snap.PacketsOut, snap.Downs, snap.Discarded, snap.Err = r.status.PacketsIn, r.status.PacketsOut, r.status.Downs, r.status.Discarded, r.status.Err
	snap.TxLateMax, snap.RxGapMax = r.status.TxLateMax, r.status.RxGapMax
	if !ch.Changed() {
		snap.Since = r.status.Since
	}
	if ch.From == Up && ch.To != Up {
		snap.Downs++
	}
	r.status = snap
	r.mu.Unlock()
	if !ch.Changed() {
		return
	}
	ev := Event{Key: r.key, From: ch.From, To: ch.To, Diag: r.s.Diag(), RemoteState: r.s.RemoteState(), PeerReset: ch.PeerReset}
	r.log.V(2).Info("BFD session changed state", "from", ch.From, "to", ch.To, "diag", ev.Diag, "remoteState", ev.RemoteState, "peerReset", ev.PeerReset)
	if r.notify != nil {
		r.notify(ev)
	}
}

func (r *runner) snapshot(now time.Time) Status {
	tx, det := r.s.Negotiated()
	return Status{
		State: r.s.State(), RemoteState: r.s.RemoteState(), Diag: r.s.Diag(), Since: now,
		Tx: tx, Detect: det, LocalDiscr: r.s.LocalDiscriminator(), RemoteDiscr: r.s.RemoteDiscriminator(),
		Local: r.local,
	}
}
