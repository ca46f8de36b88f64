// Package bgptest holds what benchmarks need from GoBGP directly: a plain
// gobgp server driven by bare AddPath/DeletePath calls, the floor that
// vipcast's announcements are measured against. It lives under bgp/ so
// that bgp/ stays the only place that imports gobgp.
package bgptest

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
	"github.com/osrg/gobgp/v3/pkg/packet/bgp"
	"github.com/osrg/gobgp/v3/pkg/server"
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
	s := server.NewBgpServer(server.LoggerOption(quietLogger{}))
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
		if _, err := p.srv.AddPath(ctx, &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: path}); err != nil {
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
		if err := p.srv.DeletePath(ctx, &api.DeletePathRequest{TableType: api.TableType_GLOBAL, Path: path}); err != nil {
			return fmt.Errorf("DeletePath %s: %w", pfx, err)
		}
	}
	return nil
}

func hostPath(p netip.Prefix, nextHop netip.Addr, withdraw bool) (*api.Path, error) {
	if !p.Addr().Is4() || !nextHop.Is4() {
		return nil, fmt.Errorf("plain gobgp announces IPv4 only, not %s via %s", p, nextHop)
	}
	path, err := apiutil.NewPath(bgp.NewIPAddrPrefix(uint8(p.Bits()), p.Addr().String()), withdraw, []bgp.PathAttributeInterface{ //nolint:gosec // a valid prefix's length is 0-32
		bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP),
		bgp.NewPathAttributeNextHop(nextHop.String()),
	}, time.Now())
	if err != nil {
		return nil, fmt.Errorf("path %s: %w", p, err)
	}
	return path, nil
}

// quietLogger drops gobgp's logs.
type quietLogger struct{}

func (quietLogger) Panic(string, gobgplog.Fields) {}
func (quietLogger) Fatal(string, gobgplog.Fields) {}
func (quietLogger) Error(string, gobgplog.Fields) {}
func (quietLogger) Warn(string, gobgplog.Fields)  {}
func (quietLogger) Info(string, gobgplog.Fields)  {}
func (quietLogger) Debug(string, gobgplog.Fields) {}
func (quietLogger) SetLevel(gobgplog.LogLevel)    {}
func (quietLogger) GetLevel() gobgplog.LogLevel   { return gobgplog.InfoLevel }
