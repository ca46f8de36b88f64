package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"

	"github.com/vipcast/vipcast/bfd"
)

// stateName maps gobgp's session states, as ListPeer reports them, to
// the names in SessionState.
var stateName = map[api.PeerState_SessionState]string{
	api.PeerState_SESSION_STATE_UNSPECIFIED: "Idle",
	api.PeerState_SESSION_STATE_IDLE:        "Idle",
	api.PeerState_SESSION_STATE_CONNECT:     "Connect",
	api.PeerState_SESSION_STATE_ACTIVE:      "Active",
	api.PeerState_SESSION_STATE_OPENSENT:    "OpenSent",
	api.PeerState_SESSION_STATE_OPENCONFIRM: "OpenConfirm",
	api.PeerState_SESSION_STATE_ESTABLISHED: "Established",
}

// fsmStateName maps gobgp's FSM states, as its peer events report them,
// to the names in SessionState.
var fsmStateName = map[bgp.FSMState]string{
	bgp.BGP_FSM_IDLE:        "Idle",
	bgp.BGP_FSM_CONNECT:     "Connect",
	bgp.BGP_FSM_ACTIVE:      "Active",
	bgp.BGP_FSM_OPENSENT:    "OpenSent",
	bgp.BGP_FSM_OPENCONFIRM: "OpenConfirm",
	bgp.BGP_FSM_ESTABLISHED: "Established",
}

// onPeerEvent handles a gobgp peer event: it records the new state, and
// why the session left Established or failed to reach it, and calls
// OnSessionChange. gobgp calls it from one goroutine.
func (g *GoBGP) onPeerEvent(ev *apiutil.WatchEventMessage_PeerEvent, _ time.Time) {
	if ev == nil || ev.Type != apiutil.PEER_EVENT_STATE {
		return
	}
	addr := ev.Peer.State.NeighborAddress.String()
	state, ok := fsmStateName[ev.Peer.State.SessionState]
	if !ok {
		state = "Idle"
	}
	// The event says why gobgp entered the state (the reason of its
	// "state changed" log); a connection attempt's failure is in the
	// logs only.
	if r := ev.Peer.State.DisconnectMessage; state != "Established" && !notFailures[r] {
		g.glog.setReason(addr, r)
	}
	now := time.Now()

	g.smu.Lock()
	t, ok := g.states[addr]
	if !ok {
		// A deleted peer's last event.
		g.smu.Unlock()
		return
	}
	wasUp, upSince := t.state == "Established", t.since
	if wasUp && state != "Established" {
		t.lastDown = ev.Peer.State.DisconnectMessage
	}
	if t.state != state {
		t.state, t.since = state, now
		t.transitions++
	}
	switch {
	case state == "Established":
		t.reason, t.bfdDown = "", ""
		g.glog.clearReason(addr)
	case t.bfdDown != "":
		t.reason = t.bfdDown
	default:
		if r := g.glog.reason(addr); r != "" {
			t.reason = r
		}
	}
	if ev.Peer.State.AdminState == api.PeerState_ADMIN_STATE_PFX_CT && t.reopen == nil {
		uptime := time.Duration(0)
		if wasUp {
			uptime = now.Sub(upSince)
		}
		g.prefixLimitShutdown(addr, t, uptime, now)
	}
	ss := t.sessionState()
	g.smu.Unlock()

	if g.onChange != nil {
		ss.Address, _ = netip.ParseAddr(addr)
		g.fillBFD(&ss, ss.Peer)
		g.onChange(ss)
	}
}

// Sessions returns the state of every configured session, sorted by
// peer name. Announced counts the routes sent to an established peer (in
// its families and allowed by Route.Peers).
func (g *GoBGP) Sessions(ctx context.Context) ([]SessionState, error) {
	byAddr := map[string]*api.Peer{}
	if err := g.srv.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
		byAddr[p.GetConf().GetNeighborAddress()] = p
	}); err != nil {
		return nil, fmt.Errorf("list BGP peers: %w", err)
	}

	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]SessionState, 0, len(g.peers))
	for _, p := range g.peers {
		addr := p.Address.String()
		ss := SessionState{Peer: p.Name, Address: p.Address, State: "Idle"}
		ap := byAddr[addr]
		if st := ap.GetState(); st != nil {
			ss.State = stateName[st.SessionState]
			ss.UpdatesSent = st.GetMessages().GetSent().GetUpdate()
			ss.UpdatesReceived = st.GetMessages().GetReceived().GetUpdate()
		}
		g.smu.Lock()
		if t := g.states[addr]; t != nil {
			ss.Reason, ss.Since, ss.Transitions = t.reason, t.since, t.transitions
			ss.PrefixLimitShutdowns, ss.ReopenAt = t.limitShutdowns, t.reopenAt
			if t.state != ss.State {
				// The watcher has not seen this change yet. A session
				// that left Established after a BFD failure went down
				// for BFD, whatever gobgp's log says of its Cease.
				ss.Since = time.Time{}
				if ss.State != "Established" && t.bfdDown != "" {
					ss.Reason = t.bfdDown
				}
			}
		}
		g.smu.Unlock()
		if ss.State != "Established" && ss.Reason == "" {
			ss.Reason = g.glog.reason(addr)
		}
		if ss.Since.IsZero() {
			if ts := ap.GetTimers().GetState(); ts != nil {
				if ss.State == "Established" && ts.Uptime != nil {
					ss.Since = ts.Uptime.AsTime()
				} else if ts.Downtime != nil {
					ss.Since = ts.Downtime.AsTime()
				}
			}
		}
		if p.BFD != nil {
			ss.BFD = bfd.Down.String()
			ss.BFDDiag = g.bfdErr[p.Name]
			g.fillBFD(&ss, p.Name)
		}
		if ss.State == "Established" {
			for _, r := range g.routes {
				if p.hasFamily(r.family()) && !denied(r, p.Name) {
					ss.Announced++
				}
			}
		}
		out = append(out, ss)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Peer < out[j].Peer })
	return out, nil
}

// sessionState returns what t knows of its session (not its address).
func (t *sessionTrack) sessionState() SessionState {
	return SessionState{Peer: t.peer, State: t.state, Reason: t.reason, Since: t.since,
		Transitions: t.transitions, PrefixLimitShutdowns: t.limitShutdowns, ReopenAt: t.reopenAt}
}

// stopReopen cancels t's pending reopening, if any; t may be nil.
func (t *sessionTrack) stopReopen() {
	if t != nil && t.reopen != nil {
		t.reopen.Stop()
		t.reopen, t.reopenAt = nil, time.Time{}
	}
}

// prefixLimitShutdown records that gobgp shut the session of addr down
// because the router sent more prefixes than its limit (gobgp then holds
// it Idle, admin state PFX_CT, for good), and schedules its reopening,
// after a wait that grows while the router keeps doing so. gobgp has
// already sent the Cease and dropped the paths the router had sent. The
// caller holds g.smu; uptime is how long the session had been up.
func (g *GoBGP) prefixLimitShutdown(addr string, t *sessionTrack, uptime time.Duration, now time.Time) {
	var wait time.Duration
	wait, t.limitStreak = prefixLimitRestart(t.limitStreak, uptime, g.restart)
	t.limitShutdowns++
	t.reopenAt = now.Add(wait)
	t.reopen = time.AfterFunc(wait, func() { g.reopen(addr, t) })
	t.reason = fmt.Sprintf("the router sent more prefixes than the limit in one address family "+
		"(Cease: maximum number of prefixes reached); reopening at %s", t.reopenAt.Format(time.RFC3339))
	g.log.Info("BGP peer sent more prefixes than its limit; session shut down, received routes dropped",
		"peer", t.peer, "address", addr, "maxPrefixes", t.maxPrefixes, "uptime", uptime.Round(time.Millisecond),
		"consecutive", t.limitStreak, "reopenIn", wait)
}

// reopen lets gobgp open the session of addr again after a prefix-limit
// shutdown, unless the peer was deleted, reconfigured or stopped since.
func (g *GoBGP) reopen(addr string, t *sessionTrack) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.smu.Lock()
	current := g.states[addr] == t && t.reopen != nil
	if current {
		t.reopen, t.reopenAt = nil, time.Time{}
	}
	g.smu.Unlock()
	if !current || g.stopped {
		return
	}
	g.log.Info("Reopening BGP session after a prefix-limit shutdown", "peer", t.peer, "address", addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.srv.EnablePeer(ctx, &api.EnablePeerRequest{Address: addr}); err != nil {
		g.log.Error(err, "Cannot reopen BGP session after a prefix-limit shutdown", "peer", t.peer, "address", addr)
	}
}
