// Package bgptest holds what benchmarks need from GoBGP directly: a plain
// gobgp server driven by bare AddPath/DeletePath calls, the floor that
// vipcast's announcements are measured against. It lives under bgp/ so
// that bgp/ stays the only place that imports gobgp.
package bgptest

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"
)

// Plain is a gobgp server with default settings and one peer.
type Plain struct {
	srv *server.BgpServer
}

// StartPlain starts a gobgp server with ASN localASN that opens a session
// from src to the router at addr:port (ASN peerASN). It is stopped at the
// end of the test.
func StartPlain(tb testing.TB, src, addr netip.Addr, port int, localASN, peerASN uint32) *Plain {
	tb.Helper()
	s := server.NewBgpServer(server.LoggerOption(slog.New(slog.DiscardHandler), nil))
	go s.Serve()
	ctx := context.Background()
	if err := s.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{Asn: localASN, RouterId: src.String(), ListenPort: -1}}); err != nil {
		tb.Fatalf("plain gobgp: %v", err)
	}
	tb.Cleanup(func() { _ = s.StopBgp(context.Background(), &api.StopBgpRequest{}) })
	if err := s.AddPeer(ctx, &api.AddPeerRequest{Peer: &api.Peer{
		Conf:      &api.PeerConf{NeighborAddress: addr.String(), PeerAsn: peerASN},
		Transport: &api.Transport{LocalAddress: src.String(), RemotePort: uint32(port)}, //nolint:gosec // a TCP port the caller got from a listener
		Timers:    &api.Timers{Config: &api.TimersConfig{ConnectRetry: 1}},
	}}); err != nil {
		tb.Fatalf("plain gobgp peer: %v", err)
	}
	return &Plain{srv: s}
}

// Announce adds one IPv4 host route per prefix with a bare AddPath call
// each: origin IGP and nextHop, nothing else.
func (p *Plain) Announce(ctx context.Context, prefixes []netip.Prefix, nextHop netip.Addr) error {
	for _, pfx := range prefixes {
		path, err := hostPath(pfx, nextHop, false)
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := p.srv.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{path}}); err != nil {
			return fmt.Errorf("AddPath %s: %w", pfx, err)
		}
	}
	return nil
}

// Withdraw deletes the routes Announce added, one DeletePath call each.
func (p *Plain) Withdraw(ctx context.Context, prefixes []netip.Prefix, nextHop netip.Addr) error {
	for _, pfx := range prefixes {
		path, err := hostPath(pfx, nextHop, true)
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := p.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{path}}); err != nil {
			return fmt.Errorf("DeletePath %s: %w", pfx, err)
		}
	}
	return nil
}

func hostPath(p netip.Prefix, nextHop netip.Addr, withdraw bool) (*apiutil.Path, error) {
	if !p.Addr().Is4() || !nextHop.Is4() {
		return nil, fmt.Errorf("plain gobgp announces IPv4 only, not %s via %s", p, nextHop)
	}
	nlri, err := bgp.NewIPAddrPrefix(p)
	if err != nil {
		return nil, fmt.Errorf("path %s: %w", p, err)
	}
	nh, err := bgp.NewPathAttributeNextHop(nextHop)
	if err != nil {
		return nil, fmt.Errorf("path %s: %w", p, err)
	}
	return &apiutil.Path{
		Family:     bgp.RF_IPv4_UC,
		Nlri:       nlri,
		Attrs:      []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP), nh},
		Withdrawal: withdraw,
		Age:        time.Now().Unix(),
	}, nil
}
