package bgp

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
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
// the BFD session): see resetAfterBFD. Every change is reported through
// OnSessionChange.
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
		go g.resetAfterBFD(ctx, ev.Key, p, reason)
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

// bfdResetGrace is how long resetAfterBFD waits to see how the session
// ended.
const bfdResetGrace = 100 * time.Millisecond

// resetAfterBFD ends the BGP session of peer key (configuration p) after
// its BFD failure so that it starts again at once. While gobgp has it
// Established it sends a Cease "Administrative Reset" carrying the reason;
// gobgp then holds the session Idle for a second and connects again (2.5–3
// s in all). When the session ended otherwise (the router's NOTIFICATION,
// which arrives together with the local detection when a frozen node
// thaws, won the race or came first), gobgp holds it Idle for 5 s, and a
// reset asked for meanwhile stays queued and ends the next session the
// moment it comes up (a withdrawal at the router and 3 s more); so
// bfdResetGrace later, a session that did not end with that Cease is
// recreated (the neighbor deleted and added again, with the same
// configuration and filters): nothing stays queued, and gobgp connects
// within 2 s. A session held down for its prefix limit is left alone.
func (g *GoBGP) resetAfterBFD(ctx context.Context, key string, p *Peer, reason string) {
	addr := p.Address.String()
	state, err := g.sessionState(ctx, addr)
	if err != nil {
		g.log.Error(err, "Cannot read the BGP session's state after BFD went down", "peer", p.Name, "address", p.Address)
		return
	}
	if state == api.PeerState_SESSION_STATE_ESTABLISHED {
		if err := g.srv.ResetPeer(ctx, &api.ResetPeerRequest{Address: addr, Communication: reason}); err != nil {
			g.log.Error(err, "Cannot reset the BGP session after BFD went down", "peer", p.Name, "address", p.Address)
		}
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(bfdResetGrace):
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.peers[key] != p || g.stopped {
		return // reconfigured or stopped meanwhile
	}
	g.smu.Lock()
	t := g.states[addr]
	clean := t == nil || t.state == "Established" || t.reopen != nil || resetSent(t.lastDown)
	g.smu.Unlock()
	if clean {
		return
	}
	g.log.Info("The BGP session ended before the reset BFD asked for: recreating it", "peer", p.Name, "address", p.Address, "ended", t.lastDown)
	if err := g.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: addr}); err != nil {
		g.log.Error(err, "Cannot recreate the BGP session after BFD went down", "peer", p.Name, "address", p.Address)
		return
	}
	if err := g.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: toAPIPeer(p)}); err != nil {
		// The next SetPeers adds it again: g.peers no longer has it.
		delete(g.peers, key)
		g.log.Error(err, "Cannot add the BGP session again after BFD went down", "peer", p.Name, "address", p.Address)
	}
}

// resetSent reports whether gobgp's disconnect message says it ended the
// session with a Cease "Administrative Reset" of its own.
func resetSent(msg string) bool {
	return strings.Contains(msg, "notification-sent") && strings.Contains(msg, "administrative reset")
}

// sessionState is gobgp's state of the session with addr.
func (g *GoBGP) sessionState(ctx context.Context, addr string) (api.PeerState_SessionState, error) {
	var state api.PeerState_SessionState
	err := g.srv.ListPeer(ctx, &api.ListPeerRequest{Address: addr}, func(ap *api.Peer) { state = ap.GetState().GetSessionState() })
	return state, err
}

// BFDDiscards returns the counts of BFD packets the speaker's sessions
// discarded, by reason (bfd.Discards.Collector exports them).
func (g *GoBGP) BFDDiscards() *bfd.Discards { return g.bfd.Discards() }

// fillBFD sets ss's BFD state from the session of peer name, if it has
// one.
func (g *GoBGP) fillBFD(ss *SessionState, name string) {
	st, ok := g.bfd.Status(name)
	if !ok {
		return
	}
	ss.BFD = st.State.String()
	ss.BFDDowns = st.Downs
	ss.BFDTxLateMax, ss.BFDRxGapMax = st.TxLateMax, st.RxGapMax
	if st.Diag != bfd.DiagNone {
		ss.BFDDiag = st.Diag.String()
	}
}
