package bfd

import (
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

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
func waitStatus(t *testing.T, m *Manager, key, want string, timeout time.Duration, ok func(Status) bool) Status {
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

func waitState(t *testing.T, m *Manager, key string, want State, timeout time.Duration) Status {
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
