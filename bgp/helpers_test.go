package bgp_test

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/vipcast/vipcast/bgp"
)

const (
	localASN  = 64512
	routerASN = 65000
)

var (
	ip   = netip.MustParseAddr
	pfx  = netip.MustParsePrefix
	ctxT = context.Background
)

// events records the session changes reported to OnSessionChange.
type events struct {
	mu sync.Mutex
	l  []bgp.SessionState
}

func (e *events) add(s bgp.SessionState) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.l = append(e.l, s)
}

func (e *events) all() []bgp.SessionState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]bgp.SessionState(nil), e.l...)
}

// newSpeaker starts a GoBGP speaker stopped at the end of the test.
func newSpeaker(t testing.TB, routerID string) (*bgp.GoBGP, *events) {
	t.Helper()
	ev := &events{}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2)))
	s, err := bgp.New(bgp.Config{
		RouterID:        ip(routerID),
		ListenPort:      -1,
		Logger:          logger,
		OnSessionChange: ev.add,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return s, ev
}

// eventually polls cond every 20 ms until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func u32(v uint32) *uint32 { return &v }

// onlySession returns the state of s's one session, failing the test when
// there is not exactly one.
func onlySession(t testing.TB, s *bgp.GoBGP) bgp.SessionState {
	t.Helper()
	ss, err := s.Sessions(ctxT())
	if err != nil || len(ss) != 1 {
		t.Fatalf("Sessions: %v, %v", ss, err)
	}
	return ss[0]
}
