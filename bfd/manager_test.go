package bfd

import (
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/ipv4"
	"k8s.io/klog/v2/ktesting"
)

// recorder keeps a Manager's events.
type recorder struct {
	mu     sync.Mutex
	events []Event
}

func (r *recorder) add(e Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) all() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// waitStatus polls the status of session key until ok holds, and returns
// it; it fails the test after timeout, saying want.
func waitStatus(t testing.TB, m *Manager, key, want string, timeout time.Duration, ok func(Status) bool) Status {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st, found := m.Status(key)
		if found && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %s: %+v after %v, want %s", key, st, timeout, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitState(t testing.TB, m *Manager, key string, want State, timeout time.Duration) Status {
	t.Helper()
	return waitStatus(t, m, key, want.String(), timeout, func(st Status) bool { return st.State == want })
}

// TestManagersOverLoopback runs two Managers against each other on
// 127.0.0.1 and 127.0.0.2: the sessions come Up, a timer change is
// renegotiated without leaving Up, and a removed session's AdminDown
// takes the other Down without counting as a failure. The protocol
// against FRR's bfdd and BIRD is tested in test/routers and test/e2e.
func TestManagersOverLoopback(t *testing.T) {
	a1, a2 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	var ra, rb recorder
	ma := NewManager(ktesting.NewLogger(t, ktesting.NewConfig()), ra.add)
	mb := NewManager(ktesting.NewLogger(t, ktesting.NewConfig()), rb.add)
	t.Cleanup(ma.Close)
	t.Cleanup(mb.Close)
	if err := ma.Set("b", SessionConfig{Peer: a2, Local: a1, Timers: fast}); err != nil {
		t.Fatal(err)
	}
	if err := mb.Set("a", SessionConfig{Peer: a1, Local: a2, Timers: fast}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitState(t, ma, "b", Up, 5*time.Second)
	waitState(t, mb, "a", Up, 5*time.Second)
	t.Logf("both Up %v after start", time.Since(start).Round(time.Millisecond))
	// The Poll that follows Up moves both to the fast timers.
	waitStatus(t, ma, "b", "tx 100ms detect 300ms", 3*time.Second, func(st Status) bool {
		return st.Tx == 100*time.Millisecond && st.Detect == 300*time.Millisecond
	})

	slower := Timers{MinTx: 200 * time.Millisecond, MinRx: 200 * time.Millisecond, Multiplier: 4}
	if err := ma.Set("b", SessionConfig{Peer: a2, Local: a1, Timers: slower}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, mb, "a", "tx 200ms detect 800ms after the other side's change", 3*time.Second, func(st Status) bool {
		return st.Tx == 200*time.Millisecond && st.Detect == 800*time.Millisecond
	})
	// Three detection times of the slowest side with nothing but Up.
	time.Sleep(2400 * time.Millisecond)
	for _, r := range [][]Event{ra.all(), rb.all()} {
		for _, e := range r {
			if e.From == Up {
				t.Fatalf("a session left Up during the renegotiation: %+v", e)
			}
		}
	}
	if st, _ := ma.Status("b"); st.Downs != 0 || st.PacketsIn == 0 || st.PacketsOut == 0 || st.Err != "" {
		t.Fatalf("status %+v", st)
	}
	// The scheduling measures: the longest gap between the peer's
	// packets is at least its interval less the jitter (RFC 5880 6.8.7:
	// 75% of it at the least), and both are below the detection time, or
	// the session would have gone down.
	if st, _ := mb.Status("a"); st.RxGapMax < 150*time.Millisecond || st.RxGapMax >= st.Detect || st.TxLateMax <= 0 || st.TxLateMax >= st.Detect {
		t.Errorf("receive gap %v (want 150ms to the detection time %v), transmit delay %v (want above 0, below it)", st.RxGapMax, st.Detect, st.TxLateMax)
	} else {
		t.Logf("the longest gap between received packets %v, the most a packet went out late %v", st.RxGapMax, st.TxLateMax)
	}

	mb.Remove("a")
	st := waitState(t, ma, "b", Down, 2*time.Second)
	if st.Diag != DiagNeighborDown || st.RemoteState != AdminDown || st.Downs != 1 {
		t.Fatalf("after the peer's removal: %+v, want Down, neighbor signaled down, remote AdminDown", st)
	}
	evs := ra.all()
	last := evs[len(evs)-1]
	if last.From != Up || last.To != Down || last.Failure() {
		t.Fatalf("last event %+v: want Up to Down, not a failure", last)
	}
}

// TestSetRefusesBadTimers checks that bad timers never reach a socket.
func TestSetRefusesBadTimers(t *testing.T) {
	m := NewManager(ktesting.NewLogger(t, ktesting.NewConfig()), nil)
	t.Cleanup(m.Close)
	if err := m.Set("x", SessionConfig{Peer: netip.MustParseAddr("127.0.0.1"), Timers: Timers{MinTx: time.Second, MinRx: time.Second}}); err == nil {
		t.Fatal("multiplier 0 accepted")
	}
	if err := m.Set("x", SessionConfig{Timers: fast}); err == nil {
		t.Fatal("no peer accepted")
	}
	if len(m.Keys()) != 0 {
		t.Fatalf("sessions %v after refusals", m.Keys())
	}
}

// TestSenderSocket checks what every sent packet carries from its socket:
// TTL 255 (RFC 5881's GTSM), DSCP CS6 and a source port in 49152-65535.
func TestSenderSocket(t *testing.T) {
	s, err := openSender(netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	if port := s.conn.LocalAddr().(*net.UDPAddr).Port; port < 49152 || port > 65535 {
		t.Errorf("source port %d outside 49152-65535", port)
	}
	rc, err := s.conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var ttl, tos int
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		if ttl, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_TTL); gerr != nil {
			return
		}
		tos, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_TOS)
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if ttl != 255 || tos != 0xc0 {
		t.Errorf("TTL %d, TOS %#x; want 255 and 0xc0 (CS6)", ttl, tos)
	}
	if a, b := randomDiscriminator(), randomDiscriminator(); a == b {
		t.Errorf("two discriminators in a row are both %d", a)
	}
}

// upPairOn starts sessions "b" on ma (local a1, peer a2) and "a" on mb
// (the reverse) with cfg's multihop, minimum TTL and authentication, and
// waits until both are Up.
func upPairOn(t *testing.T, a1, a2 netip.Addr, cfg SessionConfig) (ma, mb *Manager) {
	t.Helper()
	ma = NewManager(ktesting.NewLogger(t, ktesting.NewConfig()), nil)
	mb = NewManager(ktesting.NewLogger(t, ktesting.NewConfig()), nil)
	t.Cleanup(ma.Close)
	t.Cleanup(mb.Close)
	ca, cb := cfg, cfg
	ca.Peer, ca.Local, ca.Timers = a2, a1, fast
	cb.Peer, cb.Local, cb.Timers = a1, a2, fast
	if err := ma.Set("b", ca); err != nil {
		t.Fatal(err)
	}
	if err := mb.Set("a", cb); err != nil {
		t.Fatal(err)
	}
	waitState(t, ma, "b", Up, 5*time.Second)
	waitState(t, mb, "a", Up, 5*time.Second)
	return ma, mb
}

// sendWithTTL sends b from src (any port) to dst with the given TTL.
func sendWithTTL(t *testing.T, src netip.Addr, dst netip.AddrPort, ttl int, b []byte) {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	if err := ipv4.NewPacketConn(c).SetTTL(ttl); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteToUDPAddrPort(b, dst); err != nil {
		t.Fatal(err)
	}
}

// TestMultihopMinTTL runs multihop sessions over loopback (addresses of
// their own, so that other tests' sessions do not share the sockets): a
// Down packet with the session's own discriminators and a TTL below the
// minimum leaves the session Up. Below the least minimum of the socket's
// sessions the kernel's filter drops it (counted "kernel"); between that
// and a session's own minimum the session drops it (counted "ttl"). At or
// above the minimum the same packet takes the session Down, so the
// discriminators were right.
func TestMultihopMinTTL(t *testing.T) {
	a1, a2, a3 := netip.MustParseAddr("127.0.0.41"), netip.MustParseAddr("127.0.0.42"), netip.MustParseAddr("127.0.0.43")
	ma, _ := upPairOn(t, a1, a2, SessionConfig{Multihop: true})
	// A second multihop session on a's socket, toward a silent peer,
	// accepting TTL 64: the kernel filter now passes 64 and up.
	if err := ma.Set("bird", SessionConfig{Peer: a3, Local: a1, Multihop: true, MinTTL: 64, Timers: fast}); err != nil {
		t.Fatal(err)
	}
	st, _ := ma.Status("b")
	forged := Control{State: Down, Diag: DiagDetectionTimeExpired, DetectMult: 3, MyDiscriminator: st.RemoteDiscr, YourDiscriminator: st.LocalDiscr,
		DesiredMinTx: time.Second, RequiredMinRx: time.Second}.Marshal(nil)
	dst := netip.AddrPortFrom(a1, MultihopPort)
	for _, tc := range []struct {
		ttl    int
		reason string
	}{{1, reasonKernel}, {63, reasonKernel}, {64, "ttl"}, {253, "ttl"}} {
		kernel, ttl := ma.Discards().Discarded(reasonKernel), ma.Discards().Discarded("ttl")
		before, _ := ma.Status("b")
		sendWithTTL(t, a2, dst, tc.ttl, forged)
		// The kernel's count arrives with the next packet the socket
		// receives (the peer sends every 100ms).
		time.Sleep(400 * time.Millisecond)
		after, _ := ma.Status("b")
		if after.State != Up || after.Downs != before.Downs {
			t.Fatalf("TTL %d: session %+v, want it Up", tc.ttl, after)
		}
		gotKernel, gotTTL := ma.Discards().Discarded(reasonKernel)-kernel, ma.Discards().Discarded("ttl")-ttl
		if tc.reason == reasonKernel && (gotKernel != 1 || gotTTL != 0) || tc.reason == "ttl" && (gotKernel != 0 || gotTTL != 1 || after.Discarded != before.Discarded+1) {
			t.Fatalf("TTL %d: %d kernel and %d ttl discards (session's %d), want one, %s", tc.ttl, gotKernel, gotTTL, after.Discarded-before.Discarded, tc.reason)
		}
	}
	// The silent peer's session goes: the filter is back at 254.
	ma.Remove("bird")
	kernel := ma.Discards().Discarded(reasonKernel)
	sendWithTTL(t, a2, dst, 64, forged)
	time.Sleep(400 * time.Millisecond)
	if got := ma.Discards().Discarded(reasonKernel) - kernel; got != 1 {
		t.Fatalf("TTL 64 after the TTL 64 session left: %d kernel discards, want 1", got)
	}
	sendWithTTL(t, a2, dst, 254, forged)
	waitStatus(t, ma, "b", "one down transition (it comes back Up at once)", 2*time.Second, func(st Status) bool { return st.Downs == 1 })
}

// TestAuthenticatedManagers runs two Managers with Keyed SHA1 over
// loopback: Up; a packet without authentication, or signed with another
// key, is discarded and counted, and the session stays Up.
func TestAuthenticatedManagers(t *testing.T) {
	a1, a2 := netip.MustParseAddr("127.0.0.44"), netip.MustParseAddr("127.0.0.45")
	auth := &Auth{Type: AuthMeticulousKeyedSHA1, KeyID: 7, Key: []byte("a shared secret")}
	ma, _ := upPairOn(t, a1, a2, SessionConfig{Auth: auth})
	st, _ := ma.Status("b")
	p := Control{State: Down, Diag: DiagDetectionTimeExpired, DetectMult: 3, MyDiscriminator: st.RemoteDiscr, YourDiscriminator: st.LocalDiscr,
		DesiredMinTx: time.Second, RequiredMinRx: time.Second}
	dst := netip.AddrPortFrom(a1, SingleHopPort)
	// The attacker does not know the sequence number: its packet fails the
	// sequence window or the digest, whichever comes first.
	missing, wrongKey := ma.Discards().Discarded("auth_missing"), ma.Discards().Discarded("auth_digest")+ma.Discards().Discarded("auth_sequence")
	sendWithTTL(t, a2, dst, 255, p.Marshal(nil))
	p.AuthPresent, p.AuthType, p.AuthKeyID, p.AuthSeq = true, auth.Type, auth.KeyID, 1<<31
	wrong := p.Marshal(nil)
	Sign(wrong, []byte("a guessed secret"))
	sendWithTTL(t, a2, dst, 255, wrong)
	time.Sleep(300 * time.Millisecond)
	if st, _ := ma.Status("b"); st.State != Up || st.Downs != 0 {
		t.Fatalf("session %+v after forged packets, want Up", st)
	}
	if got := ma.Discards().Discarded("auth_digest") + ma.Discards().Discarded("auth_sequence") - wrongKey; ma.Discards().Discarded("auth_missing") != missing+1 || got != 1 {
		t.Fatalf("auth_missing +%d, auth_digest and auth_sequence +%d; want one each", ma.Discards().Discarded("auth_missing")-missing, got)
	}
	if err := ma.Set("c", SessionConfig{Peer: a2, Local: a1, Timers: fast, Auth: &Auth{Type: AuthKeyedMD5, Key: []byte("k")}}); err == nil {
		t.Fatal("keyed MD5 accepted")
	}
	if err := ma.Set("c", SessionConfig{Peer: a2, Local: a1, Timers: fast, MinTTL: 64}); err == nil {
		t.Fatal("a minimum TTL accepted on a single-hop session")
	}
}
