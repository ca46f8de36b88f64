package bgp

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v4/api"

	"github.com/vipcast/vipcast/bfd"
)

// bfdTimers converts a peer's BFD settings.
func bfdTimers(b *BFD) bfd.Timers {
	return bfd.Timers{MinTx: b.MinTx, MinRx: b.MinRx, Multiplier: b.Multiplier}
}

// syncBFD makes the BFD sessions those of the peers in want that ask for
// one, and records want's BFD settings on the configured peers (planPeers
// leaves a peer whose BFD alone changed in place). A session that cannot
// start (its port is taken, no route to the peer) is retried at the next
// SetPeers and reported in the peer's SessionState.BFDDiag; the BGP session
// runs without it. The caller holds g.mu.
func (g *GoBGP) syncBFD(want map[string]*Peer) {
	for _, key := range g.bfd.Keys() {
		if p := want[key]; p == nil || p.BFD == nil {
			g.bfd.Remove(key)
			g.log.V(2).Info("Stopped BFD session", "peer", key)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(g.bfdErr)) {
		if p := want[name]; p == nil || p.BFD == nil {
			delete(g.bfdErr, name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		w := want[name]
		cur := g.peers[name]
		if cur == nil {
			continue // not configured: its AddPeer failed
		}
		cur.BFD = w.BFD
		if w.BFD == nil {
			continue
		}
		err := g.bfd.Set(name, bfd.SessionConfig{Peer: w.Address, Local: w.SourceAddress, Multihop: w.BFD.Multihop, MinTTL: w.BFD.MinTTL,
			Timers: bfdTimers(w.BFD), Auth: w.BFD.Auth})
		if err != nil {
			g.bfdErr[name] = fmt.Sprintf("cannot run BFD: %v", err)
			g.log.Error(err, "Cannot run the BFD session; the BGP session runs without it", "peer", name, "address", w.Address)
			continue
		}
		delete(g.bfdErr, name)
	}
}

// eventQueue is an unbounded queue of BFD events: a BFD session's
// goroutine never waits on it (the sessions are removed under GoBGP.mu,
// which handleBFD takes).
type eventQueue struct {
	mu     sync.Mutex
	events []bfd.Event
	wake   chan struct{}
}

// push appends ev.
func (q *eventQueue) push(ev bfd.Event) {
	q.mu.Lock()
	q.events = append(q.events, ev)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take returns the queued events.
func (q *eventQueue) take() []bfd.Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	evs := q.events
	q.events = nil
	return evs
}

// bfdLoop handles the BFD sessions' changes in order until ctx ends.
func (g *GoBGP) bfdLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.bfdEvents.wake:
			for _, ev := range g.bfdEvents.take() {
				g.handleBFD(ctx, ev)
			}
		}
	}
}

// handleBFD resets the BGP session of a peer whose BFD session failed
// (went from Up to Down, not by the router's AdminDown nor its reset of
// the BFD session), bfdResetGrace later and only if the session is still
// Established then (resetAfterBFD), with a Cease "Administrative Reset"
// carrying the reason; gobgp reopens it after a second's idle hold and its
// connection wait (2.5–3 s in all). When the router ends the session
// first, gobgp holds it Idle for 5 s before it connects again. Every
// change is reported through OnSessionChange.
func (g *GoBGP) handleBFD(ctx context.Context, ev bfd.Event) {
	g.mu.Lock()
	p := g.peers[ev.Key]
	stopped := g.stopped
	g.mu.Unlock()
	if p == nil || stopped {
		return
	}
	addr := p.Address.String()
	switch {
	case ev.Failure():
		reason := "BFD session down: " + ev.Diag.String()
		g.smu.Lock()
		if t := g.states[addr]; t != nil {
			t.bfdDown = reason
			if t.state != "Established" {
				t.reason = reason
			}
		}
		g.smu.Unlock()
		g.log.Info("BFD session went down: resetting the BGP session", "peer", p.Name, "address", p.Address, "diag", ev.Diag.String())
		time.AfterFunc(bfdResetGrace, func() { g.resetAfterBFD(ctx, ev.Key, p, reason) })
	case ev.PeerReset:
		g.log.Info("The router reset its BFD session without a path failure: the BGP session is kept", "peer", p.Name, "address", p.Address)
	default:
		g.log.V(2).Info("BFD session changed state", "peer", p.Name, "address", p.Address, "from", ev.From.String(), "to", ev.To.String(), "diag", ev.Diag.String(), "remoteState", ev.RemoteState.String())
	}
	if g.onChange == nil {
		return
	}
	g.smu.Lock()
	t := g.states[addr]
	var ss SessionState
	if t != nil {
		ss = t.sessionState()
	}
	g.smu.Unlock()
	if t == nil {
		return
	}
	ss.Address = p.Address
	g.fillBFD(&ss, p.Name)
	g.onChange(ss)
}

// bfdResetGrace is how long handleBFD waits before it resets a session
// whose BFD failed. gobgp queues a reset for the session's Established
// state and keeps it when the session ends first: a reset asked for just
// before the router's own NOTIFICATION (both arrive together when a frozen
// node thaws) would end the next session the moment it comes up, a
// withdrawal and an extra 3 s at the router. Within the grace the router's
// NOTIFICATION, if it sent one, has ended the session; a path that failed
// one way only is reset bfdResetGrace later than BFD saw it.
const bfdResetGrace = 100 * time.Millisecond

// resetAfterBFD resets peer key's BGP session after its BFD failure if p
// is still that peer's configuration and gobgp still has the session
// Established.
func (g *GoBGP) resetAfterBFD(ctx context.Context, key string, p *Peer, reason string) {
	g.mu.Lock()
	current := g.peers[key] == p && !g.stopped
	g.mu.Unlock()
	if !current || ctx.Err() != nil {
		return
	}
	addr := p.Address.String()
	var state api.PeerState_SessionState
	if err := g.srv.ListPeer(ctx, &api.ListPeerRequest{Address: addr}, func(ap *api.Peer) { state = ap.GetState().GetSessionState() }); err != nil {
		g.log.Error(err, "Cannot read the BGP session's state after BFD went down", "peer", p.Name, "address", p.Address)
		return
	}
	if state != api.PeerState_SESSION_STATE_ESTABLISHED {
		g.log.V(2).Info("The BGP session ended before the reset BFD asked for", "peer", p.Name, "address", p.Address, "state", state.String())
		return
	}
	if err := g.srv.ResetPeer(ctx, &api.ResetPeerRequest{Address: addr, Communication: reason}); err != nil {
		g.log.Error(err, "Cannot reset the BGP session after BFD went down", "peer", p.Name, "address", p.Address)
	}
}

// fillBFD sets ss's BFD state from the session of peer name, if it has
// one.
func (g *GoBGP) fillBFD(ss *SessionState, name string) {
	st, ok := g.bfd.Status(name)
	if !ok {
		return
	}
	ss.BFD = st.State.String()
	ss.BFDDowns = st.Downs
	if st.Diag != bfd.DiagNone {
		ss.BFDDiag = st.Diag.String()
	}
}
