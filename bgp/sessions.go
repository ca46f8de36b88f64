package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"time"

	api "github.com/osrg/gobgp/v3/api"
)

// stateName maps gobgp's session states to the names in SessionState.
var stateName = map[api.PeerState_SessionState]string{
	api.PeerState_UNKNOWN:     "Idle",
	api.PeerState_IDLE:        "Idle",
	api.PeerState_CONNECT:     "Connect",
	api.PeerState_ACTIVE:      "Active",
	api.PeerState_OPENSENT:    "OpenSent",
	api.PeerState_OPENCONFIRM: "OpenConfirm",
	api.PeerState_ESTABLISHED: "Established",
}

// onEvent handles a gobgp peer event: it records the new state and calls
// OnSessionChange. gobgp calls it from one goroutine.
func (g *GoBGP) onEvent(ev *api.WatchEventResponse) {
	pe := ev.GetPeer()
	if pe == nil || pe.Type != api.WatchEventResponse_PeerEvent_STATE || pe.Peer.GetState() == nil {
		return
	}
	addr := pe.Peer.State.NeighborAddress
	state := stateName[pe.Peer.State.SessionState]
	now := time.Now()

	g.smu.Lock()
	t, ok := g.states[addr]
	if !ok {
		// A deleted peer's last event.
		g.smu.Unlock()
		return
	}
	if t.state != state {
		t.state, t.since = state, now
		t.transitions++
	}
	if state == "Established" {
		t.reason = ""
		g.glog.clearReason(addr)
	} else if r := g.glog.reason(addr); r != "" {
		t.reason = r
	}
	ss := SessionState{Peer: t.peer, State: t.state, Reason: t.reason, Since: t.since, Transitions: t.transitions}
	g.smu.Unlock()

	if g.onChange != nil {
		ss.Address, _ = netip.ParseAddr(addr)
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
			if t.state != ss.State {
				// The watcher has not seen this change yet.
				ss.Since = time.Time{}
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
