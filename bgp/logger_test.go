package bgp

import (
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
)

// lines collects what a funcr logger writes.
type lines struct {
	mu sync.Mutex
	l  []string
}

func (c *lines) add(_, args string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.l = append(c.l, args)
}

func (c *lines) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.l...)
}

// newTestLogger returns a gobgpLogger writing at verbosity v, and what it
// writes.
func newTestLogger(v int) (*gobgpLogger, *lines) {
	c := &lines{}
	return newGobgpLogger(funcr.New(c.add, funcr.Options{Verbosity: v})), c
}

// TestLoggerConnectFailures checks that gobgp's "failed to connect" debug
// messages, which gobgp's per-peer logger tags with the neighbor's
// address, become the peer's reason and one line per distinct error at the
// default verbosity.
func TestLoggerConnectFailures(t *testing.T) {
	l, c := newTestLogger(0)
	// As gobgp's FSM logs: a logger With the topic and the neighbor.
	peer := l.slog().With("Topic", "Peer", "Key", "192.0.2.1")
	for range 3 {
		peer.Debug("failed to connect", "Error", "dial tcp 192.0.2.1:179: connect: connection refused") // gobgp retries
	}
	peer.Debug("failed to connect", "Error", "dial tcp 192.0.2.1:179: i/o timeout")
	peer.Debug("failed to connect", "Error", "dial tcp 192.0.2.1:179: i/o timeout")

	var said []string
	for _, line := range c.all() {
		if strings.Contains(line, "Cannot connect to BGP peer") {
			said = append(said, line)
		}
	}
	if len(said) != 2 || !strings.Contains(said[0], "connection refused") || !strings.Contains(said[1], "i/o timeout") {
		t.Fatalf("want one line per distinct error at verbosity 0, got %q (all: %q)", said, c.all())
	}
	if got := l.reason("192.0.2.1"); !strings.Contains(got, "i/o timeout") {
		t.Errorf("reason = %q, want the last error", got)
	}
	// Debug messages themselves stay at V(4).
	for _, line := range c.all() {
		if strings.Contains(line, `"msg"="failed to connect"`) {
			t.Errorf("gobgp's debug message was written at verbosity 0: %s", line)
		}
	}
}

// TestLoggerStateReasons checks which of gobgp's state-change and
// Peer Down messages set a peer's reason: failures do, progress does not.
func TestLoggerStateReasons(t *testing.T) {
	l, _ := newTestLogger(0)
	peer := l.slog().With("Topic", "Peer", "Key", "192.0.2.1")
	peer.Debug("state changed", "old", "BGP_FSM_ESTABLISHED", "new", "BGP_FSM_IDLE", "reason", "hold-timer-expired")
	if got := l.reason("192.0.2.1"); got != "hold-timer-expired" {
		t.Errorf("after a hold timer expiry, reason = %q", got)
	}
	peer.Debug("state changed", "old", "BGP_FSM_IDLE", "new", "BGP_FSM_ACTIVE", "reason", "idle-hold-timer-expired")
	peer.Debug("state changed", "old", "BGP_FSM_ACTIVE", "new", "BGP_FSM_OPENSENT", "reason", "new-connection")
	if got := l.reason("192.0.2.1"); got != "hold-timer-expired" {
		t.Errorf("progress replaced the reason: %q", got)
	}
	peer.Info("Peer Down", "State", "BGP_FSM_ESTABLISHED", "Reason", "notification-received code 6(cease) subcode 2(administrative shutdown)")
	if got := l.reason("192.0.2.1"); !strings.Contains(got, "administrative shutdown") {
		t.Errorf("after Peer Down, reason = %q", got)
	}
	l.slog().Info("Peer Down", "Reason", "read-failed") // no neighbor: nobody's reason
	if got := l.reason(""); got != "" {
		t.Errorf("a message without Key set reason %q", got)
	}
}

// TestLoggerLevels checks where gobgp's levels go: errors are errors,
// warnings are written at the default verbosity, info at 2, debug at 4,
// with the attributes of the logger's With and groups; and that an error
// (gobgp v4 logs, and goes on, where v3 called its fatal and panic
// levels) does not end anything.
func TestLoggerLevels(t *testing.T) {
	for v, want := range map[int][]string{
		0: {"AS4_PATH must be converted", "sent notification"},
		2: {"AS4_PATH must be converted", "sent notification", "Add a peer configuration"},
		4: {"AS4_PATH must be converted", "sent notification", "Add a peer configuration", "received update"},
	} {
		l, c := newTestLogger(v)
		g := l.slog().With("Topic", "Table").WithGroup("table")
		g.Error("AS4_PATH must be converted to AS_PATH", "Key", "ipv4-unicast")
		peer := l.slog().With("Topic", "Peer", "Key", "192.0.2.1")
		peer.Warn("sent notification", "Data", "cease")
		peer.Info("Add a peer configuration")
		peer.Debug("received update")
		got := c.all()
		if len(got) != len(want) {
			t.Fatalf("verbosity %d: wrote %q, want %d lines", v, got, len(want))
		}
		for i, w := range want {
			if !strings.Contains(got[i], w) {
				t.Errorf("verbosity %d: line %d = %q, want %q", v, i, got[i], w)
			}
		}
		if !strings.Contains(got[0], `"error"=null`) || !strings.Contains(got[0], `"table.Key"="ipv4-unicast"`) || !strings.Contains(got[0], `"Topic"="Table"`) {
			t.Errorf("verbosity %d: error line %q lacks the error marker or the grouped attributes", v, got[0])
		}
		if !strings.Contains(got[1], `"Key"="192.0.2.1"`) {
			t.Errorf("verbosity %d: warning %q lacks the neighbor", v, got[1])
		}
	}
}

// TestLoggerPrefixLimitQuiet checks that gobgp's repeated "prefix limit
// reached" warning stays below the default verbosity.
func TestLoggerPrefixLimitQuiet(t *testing.T) {
	l, c := newTestLogger(0)
	peer := l.slog().With("Topic", "Peer", "Key", "192.0.2.1")
	for range 100 {
		peer.Warn("prefix limit reached", "Family", "ipv4-unicast")
	}
	peer.Warn("sent notification")
	if got := c.all(); len(got) != 1 || !strings.Contains(got[0], "sent notification") {
		t.Errorf("at verbosity 0 got %q, want only the other warning", got)
	}
}
