package bgp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/server"
	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/bfd"
)

// DefaultASN is the global ASN of the embedded gobgp server when
// Config.ASN is 0. It is never announced: every session uses its own
// Peer.LocalASN.
const DefaultASN = 64512

// connectRetry is the interval, in seconds, between connection attempts
// to a router. gobgp raises it to its floor of 2 s and waits 75–100% of
// that before each attempt; after a session reset it first holds the
// session Idle for 5 s (1 s after an administrative reset, see
// IdleHoldTimeAfterReset).
const connectRetry = 1

// DefaultPrefixLimitRestart is Config.PrefixLimitRestart when unset.
const DefaultPrefixLimitRestart = time.Minute

// Config configures a GoBGP speaker.
type Config struct {
	// RouterID is the BGP identifier (an IPv4 address). Required.
	RouterID netip.Addr
	// ASN is the global ASN of the embedded server (DefaultASN when 0).
	// Sessions announce Peer.LocalASN, not this.
	ASN uint32
	// ListenPort is the TCP port to accept sessions on; -1 (and 0) means
	// do not listen: vipcast only opens sessions.
	ListenPort int32
	// PrefixLimitRestart is how long a session shut down because the
	// router sent more than Peer.MaxPrefixes stays down before it is
	// reopened; the wait doubles with each consecutive shutdown, up to 30
	// minutes (see prefixLimitRestart). 0 means DefaultPrefixLimitRestart.
	// gobgp alone would never reopen such a session.
	PrefixLimitRestart time.Duration
	// Logger receives gobgp's logs (gobgp Debug at V(4), Info at V(2),
	// Warn at V(0)).
	Logger klog.Logger
	// OnSessionChange, when set, is called on every session state change,
	// from one goroutine, in order. It may call GoBGP's methods (gobgp
	// queues events without bound, so a slow callback delays only later
	// callbacks).
	OnSessionChange func(SessionState)
}

// GoBGP is a Speaker backed by an embedded gobgp server. It accepts no
// routes from its peers.
type GoBGP struct {
	srv      *server.BgpServer
	log      klog.Logger
	glog     *gobgpLogger
	onChange func(SessionState)
	cancel   context.CancelFunc
	// restart is Config.PrefixLimitRestart, defaulted.
	restart time.Duration

	// mu serialises SetPeers, Apply and Stop and guards peers and routes.
	mu      sync.Mutex
	peers   map[string]*Peer        // by Name
	routes  map[netip.Prefix]*Route // announced routes, by prefix
	stopped bool

	// smu guards states, which the watch goroutine updates.
	smu    sync.Mutex
	states map[string]*sessionTrack // by neighbor address

	// bfd runs the peers' BFD sessions, keyed by peer name; bfdEvents
	// carries their changes to handleBFD. bfdErr (guarded by mu) says why
	// a peer's BFD session could not start.
	bfd       *bfd.Manager
	bfdEvents eventQueue
	bfdErr    map[string]string
}

// sessionTrack is what the watcher learns about one neighbor address.
type sessionTrack struct {
	peer        string
	state       string
	since       time.Time
	reason      string
	transitions uint64
	// maxPrefixes is the peer's Peer.MaxPrefixes.
	maxPrefixes uint32
	// bfdDown, set when a BFD failure reset the session, is the reason
	// shown until the session is Established again.
	bfdDown string
	// lastDown is why gobgp last ended the session (its disconnect
	// message), kept until the session is Established again.
	lastDown string

	// limitStreak counts the consecutive prefix-limit shutdowns (see
	// prefixLimitRestart), limitShutdowns all of them.
	limitStreak    int
	limitShutdowns uint64
	// reopen, while the session is down for its prefix limit, reopens it
	// at reopenAt.
	reopen   *time.Timer
	reopenAt time.Time
}

var _ Speaker = (*GoBGP)(nil)

// New starts an embedded gobgp server that accepts no routes from its
// peers. Stop it with Stop.
func New(cfg Config) (*GoBGP, error) {
	if !cfg.RouterID.Is4() {
		return nil, fmt.Errorf("router ID %q is not an IPv4 address", cfg.RouterID)
	}
	asn := cfg.ASN
	if asn == 0 {
		asn = DefaultASN
	}
	port := cfg.ListenPort
	if port <= 0 {
		port = -1
	}
	restart := cfg.PrefixLimitRestart
	if restart <= 0 {
		restart = DefaultPrefixLimitRestart
	}
	glog := newGobgpLogger(cfg.Logger)
	g := &GoBGP{
		restart: restart,
		// No level variable: gobgp's SetLogLevel (a gRPC call vipcast
		// does not serve) has nothing to change, klog's -v decides.
		srv:       server.NewBgpServer(server.LoggerOption(glog.slog(), nil)),
		log:       cfg.Logger,
		glog:      glog,
		onChange:  cfg.OnSessionChange,
		peers:     map[string]*Peer{},
		routes:    map[netip.Prefix]*Route{},
		states:    map[string]*sessionTrack{},
		bfdEvents: eventQueue{wake: make(chan struct{}, 1)},
		bfdErr:    map[string]string{},
	}
	g.bfd = bfd.NewManager(cfg.Logger.WithName("bfd"), g.bfdEvents.push)
	go g.srv.Serve()

	ctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	if err := g.srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn:        asn,
		RouterId:   cfg.RouterID.String(),
		ListenPort: port,
	}}); err != nil {
		cancel()
		return nil, fmt.Errorf("start gobgp: %w", err)
	}
	if err := g.rejectImports(ctx); err != nil {
		g.shutdown()
		return nil, err
	}
	if err := g.srv.WatchEvent(ctx, server.WatchEventMessageCallbacks{OnPeerUpdate: g.onPeerEvent}, server.WatchPeer()); err != nil {
		g.shutdown()
		return nil, fmt.Errorf("watch gobgp peer events: %w", err)
	}
	go g.bfdLoop(ctx)
	return g, nil
}

// shutdown stops the server without closing sessions gracefully.
func (g *GoBGP) shutdown() {
	g.cancel()
	_ = g.srv.StopBgp(context.Background(), &api.StopBgpRequest{})
	g.bfd.Close()
}

// SetPeers makes the configured sessions exactly peers. A new peer is
// added, a changed peer is deleted (Cease) and added again, so only its
// session resets, and a peer no longer listed is deleted with a Cease.
// gobgp identifies neighbors by address: two peers may not share one.
func (g *GoBGP) SetPeers(ctx context.Context, peers []Peer) error {
	want, err := normalizePeers(peers)
	if err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return errors.New("bgp speaker is stopped")
	}
	err = g.executePeers(ctx, planPeers(g.peers, want, g.routes))
	g.syncBFD(want)
	return err
}

// executePeers makes the gobgp calls of p, in order, and stops at the
// first error before the sessions are opened; g.peers follows each
// neighbor deleted or added. The caller holds g.mu.
func (g *GoBGP) executePeers(ctx context.Context, p peerPlan) error {
	if err := g.removePeers(ctx, p); err != nil {
		return err
	}
	for _, a := range p.add {
		if err := g.addPeerFilter(ctx, a.peer, a.deny); err != nil {
			return err
		}
	}
	// The filters are in force before the sessions can come up.
	if err := g.assignExport(ctx, p.export); err != nil {
		return err
	}
	return g.openSessions(ctx, p.add)
}

// removePeers deletes the neighbors of p.remove, then their filters.
func (g *GoBGP) removePeers(ctx context.Context, p peerPlan) error {
	for _, old := range p.remove {
		if err := g.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: old.Address.String()}); err != nil {
			return fmt.Errorf("delete BGP peer %s (%s): %w", old.Name, old.Address, err)
		}
		g.smu.Lock()
		g.states[old.Address.String()].stopReopen()
		delete(g.states, old.Address.String())
		g.smu.Unlock()
		delete(g.peers, old.Name)
		g.log.V(2).Info("Closed BGP session", "peer", old.Name, "address", old.Address)
	}
	if len(p.remove) == 0 {
		return nil
	}
	// Unassign the filters of the deleted peers before deleting them.
	if err := g.assignExport(ctx, p.keep); err != nil {
		return err
	}
	for _, old := range p.remove {
		if err := g.deletePeerFilter(ctx, old); err != nil {
			return err
		}
	}
	return nil
}

// openSessions adds the neighbors of adds, whose filters are in force. It
// goes on past a failure, and drops the filters of the peers that could
// not be added, so that the next SetPeers creates them afresh.
func (g *GoBGP) openSessions(ctx context.Context, adds []peerAdd) error {
	var errs []error
	var failed []*Peer
	for _, a := range adds {
		p := a.peer
		addr := p.Address.String()
		g.smu.Lock()
		g.states[addr].stopReopen()
		g.states[addr] = &sessionTrack{peer: p.Name, state: "Idle", since: time.Now(), maxPrefixes: p.MaxPrefixes}
		g.smu.Unlock()
		g.glog.clearReason(addr)
		if err := g.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: toAPIPeer(p)}); err != nil {
			errs = append(errs, fmt.Errorf("add BGP peer %s (%s): %w", p.Name, p.Address, err))
			failed = append(failed, p)
			continue
		}
		g.peers[p.Name] = p
		g.log.V(2).Info("Opening BGP session", "peer", p.Name, "address", p.Address, "port", p.Port, "asn", p.ASN, "localASN", p.LocalASN)
	}
	if len(failed) > 0 {
		if err := g.assignExport(ctx, slices.Collect(maps.Keys(g.peers))); err != nil {
			errs = append(errs, err)
		} else {
			for _, p := range failed {
				errs = append(errs, g.deletePeerFilter(ctx, p))
			}
		}
	}
	return errors.Join(errs...)
}

// Stop closes every session with a Cease notification (gobgp's "peer
// deconfigured") and stops the server. vipcast does not negotiate RFC 8538
// (the graceful-restart N bit), so a router drops the routes at once on a
// notification even with graceful restart; only a session lost without
// one (a crash, a cut link) leaves them stale for RestartTime.
//
// gobgp's BFD server, which vipcast does not use (see toAPIPeer), leaves
// one idle goroutine behind.
func (g *GoBGP) Stop(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return nil
	}
	g.stopped = true
	g.smu.Lock()
	for _, t := range g.states {
		t.stopReopen()
	}
	g.smu.Unlock()
	done := make(chan error, 1)
	// StopBgp runs to its end even when ctx ends first: a half-stopped
	// server would keep sessions open.
	go func() { done <- g.srv.StopBgp(context.WithoutCancel(ctx), &api.StopBgpRequest{}) }()
	defer g.cancel()
	// The BFD sessions go after the BGP sessions' Cease, with AdminDown,
	// which routers do not count as a failure.
	defer g.bfd.Close()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("stop gobgp: %w", err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop gobgp: %w", ctx.Err())
	}
}

// normalizePeers validates peers and returns them by name with defaults
// applied and families sorted.
func normalizePeers(peers []Peer) (map[string]*Peer, error) {
	out := make(map[string]*Peer, len(peers))
	addrs := map[netip.Addr]string{}
	for i := range peers {
		p := peers[i]
		switch {
		case p.Name == "":
			return nil, fmt.Errorf("BGP peer %d has no name", i)
		case !p.Address.IsValid():
			return nil, fmt.Errorf("BGP peer %s has no address", p.Name)
		case p.ASN == 0 || p.LocalASN == 0:
			return nil, fmt.Errorf("BGP peer %s: ASN and local ASN are required", p.Name)
		case p.SourceAddress.IsValid() && p.SourceAddress.Is4() != p.Address.Is4():
			return nil, fmt.Errorf("BGP peer %s: source address %s and address %s differ in family", p.Name, p.SourceAddress, p.Address)
		case p.HoldTime != 0 && p.HoldTime < 3*time.Second:
			return nil, fmt.Errorf("BGP peer %s: hold time %s is below 3s", p.Name, p.HoldTime)
		case p.KeepaliveTime < 0:
			return nil, fmt.Errorf("BGP peer %s: keepalive %s is negative", p.Name, p.KeepaliveTime)
		case p.RestartTime < 0:
			return nil, fmt.Errorf("BGP peer %s: restart time %s is negative", p.Name, p.RestartTime)
		case p.HoldTime != 0 && p.KeepaliveTime >= p.HoldTime:
			return nil, fmt.Errorf("BGP peer %s: keepalive %s is not below the hold time %s", p.Name, p.KeepaliveTime, p.HoldTime)
		case p.BFD != nil:
			if err := bfdTimers(p.BFD).Validate(); err != nil {
				return nil, fmt.Errorf("BGP peer %s: %w", p.Name, err)
			}
		}
		if _, dup := out[p.Name]; dup {
			return nil, fmt.Errorf("BGP peer %s is listed twice", p.Name)
		}
		p.Address = p.Address.Unmap()
		if other, dup := addrs[p.Address]; dup {
			return nil, fmt.Errorf("BGP peers %s and %s have the same address %s", other, p.Name, p.Address)
		}
		addrs[p.Address] = p.Name
		if p.Port == 0 {
			p.Port = 179
		}
		if p.MaxPrefixes == 0 {
			p.MaxPrefixes = DefaultMaxPrefixes
		}
		if len(p.Families) == 0 {
			p.Families = []Family{IPv4Unicast, IPv6Unicast}
		}
		p.Families = slices.Clone(p.Families)
		slices.Sort(p.Families)
		p.Families = slices.Compact(p.Families)
		if p.BFD != nil {
			b := *p.BFD
			p.BFD = &b
		}
		out[p.Name] = &p
	}
	return out, nil
}

// peerEqual reports whether a and b configure the same BGP session. BFD
// is left out: a change of BFD alone does not reset the BGP session
// (syncBFD applies it).
func peerEqual(a, b *Peer) bool {
	return a.Address == b.Address && a.Port == b.Port && a.ASN == b.ASN &&
		a.LocalASN == b.LocalASN && a.SourceAddress == b.SourceAddress &&
		a.HoldTime == b.HoldTime && a.KeepaliveTime == b.KeepaliveTime &&
		a.EBGPMultiHop == b.EBGPMultiHop && a.Password == b.Password &&
		a.GracefulRestart == b.GracefulRestart && a.RestartTime == b.RestartTime &&
		a.MaxPrefixes == b.MaxPrefixes && slices.Equal(a.Families, b.Families)
}

// hasFamily reports whether p negotiates f.
func (p *Peer) hasFamily(f Family) bool { return slices.Contains(p.Families, f) }

// toAPIPeer converts p to gobgp's neighbor configuration.
//
// Two settings are gobgp's defaults for every neighbor added through its
// API, and the API has no field to change them: RFC 7606 error handling
// (treat-as-withdraw: an UPDATE with a malformed attribute withdraws its
// NLRI, or the attribute is discarded, instead of resetting the session;
// TestTreatAsWithdraw pins it), and no BFD. vipcast runs its own BFD (see
// bfd.go): Bfd stays nil, so gobgp's BFD server never opens a socket.
func toAPIPeer(p *Peer) *api.Peer {
	// normalizePeers refused negative durations.
	hold := uint64(p.HoldTime / time.Second)           //nolint:gosec // not negative
	keepalive := uint64(p.KeepaliveTime / time.Second) //nolint:gosec // not negative
	if keepalive == 0 {
		keepalive = hold / 3
	}
	ap := &api.Peer{
		Conf: &api.PeerConf{
			NeighborAddress: p.Address.String(),
			PeerAsn:         p.ASN,
			LocalAsn:        p.LocalASN,
			AuthPassword:    p.Password,
			Description:     p.Name,
		},
		Timers: &api.Timers{Config: &api.TimersConfig{
			ConnectRetry:           connectRetry,
			HoldTime:               hold,
			KeepaliveInterval:      keepalive,
			IdleHoldTimeAfterReset: 1,
		}},
		Transport: &api.Transport{
			RemotePort:  uint32(p.Port),
			PassiveMode: false,
		},
	}
	if p.SourceAddress.IsValid() {
		ap.Transport.LocalAddress = p.SourceAddress.String()
	}
	if p.EBGPMultiHop > 1 && !p.IBGP() {
		ap.EbgpMultihop = &api.EbgpMultihop{Enabled: true, MultihopTtl: uint32(p.EBGPMultiHop)}
	}
	if p.GracefulRestart {
		ap.GracefulRestart = &api.GracefulRestart{
			Enabled:     true,
			RestartTime: uint32(p.RestartTime / time.Second), //nolint:gosec // not negative (normalizePeers); gobgp takes seconds in 32 bits
		}
	}
	for _, f := range p.Families {
		as := &api.AfiSafi{
			Config: &api.AfiSafiConfig{Family: apiFamily(f), Enabled: true},
			// gobgp keeps every received path in the peer's Adj-RIB-In,
			// before the import policy rejects it: the limit is what
			// bounds that memory.
			PrefixLimits: &api.PrefixLimit{Family: apiFamily(f), MaxPrefixes: p.MaxPrefixes},
		}
		if p.GracefulRestart {
			as.MpGracefulRestart = &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}}
		}
		ap.AfiSafis = append(ap.AfiSafis, as)
	}
	return ap
}

func apiFamily(f Family) *api.Family {
	if f == IPv6Unicast {
		return &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
	}
	return &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
}
