package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	api "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
)

// Apply withdraws the prefixes in withdraw and announces the routes in
// announce; a route re-announced with other attributes replaces the old
// one, an unchanged one is not sent again. A prefix in both lists is
// announced.
//
// LOCAL_PREF is put on the path; gobgp strips it towards eBGP peers.
// Route.Peers is enforced with per-peer deny sets in the global export
// policy (see policy.go). When a peer that had received a route is no
// longer in its Peers, the route is withdrawn and announced again (a
// brief flap at the peers that keep it): gobgp sends no withdrawal for a
// path that a changed export policy now rejects, not even on a soft
// reset. A peer newly allowed to receive an otherwise unchanged route gets
// it through a soft reset out.
func (g *GoBGP) Apply(ctx context.Context, announce []Route, withdraw []netip.Prefix) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return errors.New("bgp speaker is stopped")
	}
	news, order, err := normalizeRoutes(announce)
	if err != nil {
		return err
	}
	plan := planRoutes(g.routes, g.peers, news, order, withdraw)
	if err := g.executeRoutes(ctx, plan); err != nil {
		// Some changes may be half done: make the filters match the
		// routes gobgp holds, so that a retry starts from a true state.
		return errors.Join(err, g.resyncFilters(ctx))
	}
	return nil
}

// normalizeRoutes validates and normalizes announce and returns the routes
// by prefix (the last one of a prefix listed twice wins) and the prefixes
// in the order of their first appearance.
func normalizeRoutes(announce []Route) (map[netip.Prefix]*Route, []netip.Prefix, error) {
	news := make(map[netip.Prefix]*Route, len(announce))
	order := make([]netip.Prefix, 0, len(announce))
	for i := range announce {
		r, err := normalizeRoute(announce[i])
		if err != nil {
			return nil, nil, err
		}
		if _, dup := news[r.Prefix]; !dup {
			order = append(order, r.Prefix)
		}
		news[r.Prefix] = r
	}
	return news, order, nil
}

// executeRoutes makes the gobgp calls of p, in order, and stops at the
// first error. g.routes follows each successful withdrawal and
// announcement, so that it always holds what gobgp holds; the caller holds
// g.mu.
func (g *GoBGP) executeRoutes(ctx context.Context, p routePlan) error {
	for _, r := range p.withdraw {
		if err := g.deletePath(ctx, r); err != nil {
			return err
		}
		delete(g.routes, r.Prefix)
	}
	for _, c := range p.deny {
		if err := g.changeDenied(ctx, c.peer, c.prefixes, true); err != nil {
			return err
		}
	}
	for _, c := range p.allow {
		if err := g.changeDenied(ctx, c.peer, c.prefixes, false); err != nil {
			return err
		}
	}
	for _, r := range p.announce {
		if err := g.addPath(ctx, r); err != nil {
			return err
		}
		g.routes[r.Prefix] = r
	}
	for _, name := range p.resetOut {
		peer, ok := g.peers[name]
		if !ok {
			return fmt.Errorf("soft reset out %s: no such peer", name)
		}
		if err := g.srv.ResetPeer(ctx, &api.ResetPeerRequest{Address: peer.Address.String(), Soft: true, Direction: api.ResetPeerRequest_DIRECTION_OUT}); err != nil {
			return fmt.Errorf("soft reset out %s: %w", name, err)
		}
	}
	return nil
}

// resyncFilters rewrites every peer's deny sets from g.routes. (An
// AddDefinedSet with Replace would not do: gobgp swaps the set object,
// and existing policy statements keep matching the old one.)
func (g *GoBGP) resyncFilters(ctx context.Context) error {
	var errs []error
	for name := range g.peers {
		n := filterFor(name)
		v4, v6 := splitFamilies(deniedPrefixes(g.routes, name))
		for _, want := range []*api.DefinedSet{prefixSet(n.deny4, v4), prefixSet(n.deny6, v6)} {
			var have *api.DefinedSet
			err := g.srv.ListDefinedSet(ctx, &api.ListDefinedSetRequest{DefinedType: api.DefinedType_DEFINED_TYPE_PREFIX, Name: want.Name},
				func(ds *api.DefinedSet) { have = ds })
			if err == nil && have != nil && len(have.Prefixes) > 0 {
				err = g.srv.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{DefinedSet: have})
			}
			if err == nil && len(want.Prefixes) > 0 {
				err = g.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: want})
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("resync prefix set %s: %w", want.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// addPath announces r, replacing the path of its prefix.
func (g *GoBGP) addPath(ctx context.Context, r *Route) error {
	path, err := toAPIPath(r, false)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("announce %s: %w", r.Prefix, err)
	}
	// gobgp's native AddPath takes no context: it returns once its
	// server loop has taken the path.
	if _, err := g.srv.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{path}}); err != nil {
		return fmt.Errorf("announce %s: %w", r.Prefix, err)
	}
	return nil
}

// deletePath withdraws the path of r.
func (g *GoBGP) deletePath(ctx context.Context, r *Route) error {
	path, err := toAPIPath(r, true)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("withdraw %s: %w", r.Prefix, err)
	}
	if err := g.srv.DeletePath(apiutil.DeletePathRequest{Paths: []*apiutil.Path{path}}); err != nil {
		return fmt.Errorf("withdraw %s: %w", r.Prefix, err)
	}
	return nil
}

// normalizeRoute validates r and returns a copy with a masked prefix and
// unmapped next hop.
func normalizeRoute(r Route) (*Route, error) {
	if !r.Prefix.IsValid() {
		return nil, errors.New("route without a valid prefix")
	}
	r.Prefix = r.Prefix.Masked()
	r.NextHop = r.NextHop.Unmap()
	if !r.NextHop.IsValid() || r.NextHop.Is4() != r.Prefix.Addr().Is4() {
		return nil, fmt.Errorf("route %s: next hop %q is not an address of the same family", r.Prefix, r.NextHop)
	}
	r.Communities = slices.Clone(r.Communities)
	r.LargeCommunities = slices.Clone(r.LargeCommunities)
	if r.Peers != nil {
		r.Peers = slices.Compact(slices.Sorted(slices.Values(r.Peers)))
		if r.Peers == nil {
			r.Peers = []string{} // no peer at all, not every peer
		}
	}
	if r.LocalPref != nil {
		lp := *r.LocalPref
		r.LocalPref = &lp
	}
	return &r, nil
}

// sameAttrs reports whether a and b produce the same BGP path.
func sameAttrs(a, b *Route) bool {
	return a.Prefix == b.Prefix && a.NextHop == b.NextHop &&
		slices.Equal(a.Communities, b.Communities) &&
		slices.Equal(a.LargeCommunities, b.LargeCommunities) &&
		(a.LocalPref == nil) == (b.LocalPref == nil) &&
		(a.LocalPref == nil || *a.LocalPref == *b.LocalPref)
}

// routeEqual reports whether a and b are the same announcement.
func routeEqual(a, b *Route) bool {
	return sameAttrs(a, b) && (a.Peers == nil) == (b.Peers == nil) && slices.Equal(a.Peers, b.Peers)
}

// family returns the address family of r.
func (r *Route) family() Family {
	if r.Prefix.Addr().Is4() {
		return IPv4Unicast
	}
	return IPv6Unicast
}

// toAPIPath builds the gobgp path of r: origin IGP, the next hop (in
// MP_REACH_NLRI for IPv6), communities, large communities and LOCAL_PREF.
func toAPIPath(r *Route, withdraw bool) (*apiutil.Path, error) {
	nlri, err := bgp.NewIPAddrPrefix(r.Prefix)
	if err != nil {
		return nil, fmt.Errorf("encode route %s: %w", r.Prefix, err)
	}
	family := bgp.RF_IPv4_UC
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	var nh bgp.PathAttributeInterface
	if r.Prefix.Addr().Is4() {
		nh, err = bgp.NewPathAttributeNextHop(r.NextHop)
	} else {
		family = bgp.RF_IPv6_UC
		nh, err = bgp.NewPathAttributeMpReachNLRI(family, []bgp.PathNLRI{{NLRI: nlri}}, r.NextHop)
	}
	if err != nil {
		return nil, fmt.Errorf("encode route %s: next hop %s: %w", r.Prefix, r.NextHop, err)
	}
	attrs = append(attrs, nh)
	if len(r.Communities) > 0 {
		attrs = append(attrs, bgp.NewPathAttributeCommunities(r.Communities))
	}
	if len(r.LargeCommunities) > 0 {
		lcs := make([]*bgp.LargeCommunity, 0, len(r.LargeCommunities))
		for _, c := range r.LargeCommunities {
			lcs = append(lcs, bgp.NewLargeCommunity(c.Global, c.Local1, c.Local2))
		}
		attrs = append(attrs, bgp.NewPathAttributeLargeCommunities(lcs))
	}
	if r.LocalPref != nil {
		attrs = append(attrs, bgp.NewPathAttributeLocalPref(*r.LocalPref))
	}
	return &apiutil.Path{Family: family, Nlri: nlri, Attrs: attrs, Withdrawal: withdraw, Age: time.Now().Unix()}, nil
}
