package speaker

import (
	"strings"
	"testing"
	"time"
)

// TestReady: the speaker is ready once its first table is in BGP and every
// session it should have has come up once (so a DaemonSet rollout moves on
// only when this node announces again), or ReadyGrace after the table when
// a router never answers; a session going down later does not take the
// readiness back.
func TestReady(t *testing.T) {
	c := &Controller{}
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	check := func(now time.Time, want bool, why string) {
		t.Helper()
		got, msg := c.Ready(now)
		if got != want || !strings.Contains(msg, why) {
			t.Fatalf("Ready = %v (%q), want %v (%q)", got, msg, want, why)
		}
	}
	check(t0, false, "routes not computed yet")
	c.setSynced(t0, []string{"tor-a", "tor-b"})
	check(t0.Add(time.Second), false, "waiting for BGP sessions: tor-a, tor-b")
	c.sessionUp("tor-a", true)
	c.sessionUp("tor-b", false)
	check(t0.Add(2*time.Second), false, "waiting for BGP sessions: tor-b")
	check(t0.Add(ReadyGrace), true, "not established after 1m0s (ready anyway): tor-b")
	c.sessionUp("tor-b", true)
	check(t0.Add(3*time.Second), true, "every session established")
	c.sessionUp("tor-b", false)
	check(t0.Add(4*time.Second), true, "every session established")
	// A node without peers is ready with its first table.
	c = &Controller{}
	c.setSynced(t0, nil)
	check(t0, true, "every session established")
}
