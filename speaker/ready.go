package speaker

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// ReadyGrace bounds how long Ready waits for the BGP sessions after the
// first table is computed: a router that never answers must not hold a
// DaemonSet rollout forever.
const ReadyGrace = time.Minute

// readiness is what Ready decides from; guarded by Controller.mu.
type readiness struct {
	synced time.Time       // when the first table was handed to BGP; zero before
	wanted []string        // the BGPPeers this node has sessions with
	everUp map[string]bool // peers whose session has been Established since start
}

// Ready reports whether the speaker is ready, and why not: the first full
// set of routes is in BGP and every session this node should have has been
// Established once (so its routes reached the router), or ReadyGrace has
// passed since the first table. It is the speaker's readiness probe: a
// DaemonSet rolls the next node only once this one announces again, so the
// routers never lose every next hop of a VIP in an upgrade.
func (c *Controller) Ready(now time.Time) (bool, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := &c.ready
	if r.synced.IsZero() {
		return false, "routes not computed yet"
	}
	var waiting []string
	for _, p := range r.wanted {
		if !r.everUp[p] {
			waiting = append(waiting, p)
		}
	}
	if len(waiting) == 0 {
		return true, "routes computed and every session established"
	}
	if wait := now.Sub(r.synced); wait >= ReadyGrace {
		return true, fmt.Sprintf("sessions not established after %v (ready anyway): %s", wait.Round(time.Second), strings.Join(waiting, ", "))
	}
	return false, "waiting for BGP sessions: " + strings.Join(waiting, ", ")
}

// HasSynced reports whether the first full set of routes has been handed to
// BGP and the sessions configured.
func (c *Controller) HasSynced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.ready.synced.IsZero()
}

// setSynced records the first table and the peers this node has sessions
// with (each config sync).
func (c *Controller) setSynced(now time.Time, peers []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ready.synced.IsZero() {
		c.ready.synced = now
	}
	c.ready.wanted = slices.Clone(peers)
}

// sessionUp records a session's state for Ready.
func (c *Controller) sessionUp(peer string, up bool) {
	if !up {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ready.everUp == nil {
		c.ready.everUp = map[string]bool{}
	}
	c.ready.everUp[peer] = true
}
