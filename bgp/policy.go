package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	api "github.com/osrg/gobgp/v4/api"
)

// gobgp only allows per-neighbor policies on route-server clients, which
// would also stop it from prepending our ASN. Route.Peers is therefore
// implemented with the global export policy: each peer has a policy
// "vipcast-peer-NAME" whose statements reject, for that peer's address
// only (a neighbor set), the prefixes it must not receive (one prefix set
// per family, as gobgp's prefix sets are single-family). Without
// restricted routes the sets are empty and cost one failed lookup each.

const (
	globalTable     = "global"
	anyNeighborSet  = "vipcast-any-neighbor"
	rejectImportsPo = "vipcast-reject-imports"
)

type filterNames struct {
	neighbors, deny4, deny6, policy string
}

func filterFor(peer string) filterNames {
	return filterNames{
		neighbors: "vipcast-nbr-" + peer,
		deny4:     "vipcast-deny4-" + peer,
		deny6:     "vipcast-deny6-" + peer,
		policy:    "vipcast-peer-" + peer,
	}
}

// rejectImports installs the global import policy that rejects every
// path received from a neighbor. A plain default-reject import policy
// would also reject the paths vipcast adds itself: gobgp applies the
// global import policy to local paths too. Local paths have no neighbor
// address, so a neighbor-set match on 0.0.0.0/0 and ::/0 skips them.
func (g *GoBGP) rejectImports(ctx context.Context) error {
	if err := g.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: &api.DefinedSet{
		DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: anyNeighborSet, List: []string{"0.0.0.0/0", "::/0"},
	}}); err != nil {
		return fmt.Errorf("add neighbor set %s: %w", anyNeighborSet, err)
	}
	if err := g.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{
		Name: rejectImportsPo,
		Statements: []*api.Statement{{
			Name:       rejectImportsPo,
			Conditions: &api.Conditions{NeighborSet: &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: anyNeighborSet}},
			Actions:    &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_REJECT},
		}},
	}}); err != nil {
		return fmt.Errorf("add policy %s: %w", rejectImportsPo, err)
	}
	if err := g.srv.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name:          globalTable,
		Direction:     api.PolicyDirection_POLICY_DIRECTION_IMPORT,
		Policies:      []*api.Policy{{Name: rejectImportsPo}},
		DefaultAction: api.RouteAction_ROUTE_ACTION_ACCEPT,
	}}); err != nil {
		return fmt.Errorf("assign import policy: %w", err)
	}
	return nil
}

// deniedPrefixes returns the prefixes of routes that peer must not
// receive, sorted.
func deniedPrefixes(routes map[netip.Prefix]*Route, peer string) []netip.Prefix {
	var out []netip.Prefix
	for p, r := range routes {
		if denied(r, peer) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// splitFamilies returns the IPv4 and the IPv6 prefixes of prefixes, in
// their order: gobgp's prefix sets are single-family.
func splitFamilies(prefixes []netip.Prefix) (v4, v6 []netip.Prefix) {
	for _, p := range prefixes {
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	return v4, v6
}

// denied reports whether r must not be sent to peer.
func denied(r *Route, peer string) bool {
	return r.Peers != nil && !slices.Contains(r.Peers, peer)
}

func prefixSet(name string, prefixes []netip.Prefix) *api.DefinedSet {
	ds := &api.DefinedSet{DefinedType: api.DefinedType_DEFINED_TYPE_PREFIX, Name: name}
	for _, p := range prefixes {
		ds.Prefixes = append(ds.Prefixes, &api.Prefix{
			IpPrefix: p.String(), MaskLengthMin: uint32(p.Bits()), MaskLengthMax: uint32(p.Bits()), //nolint:gosec // a valid prefix's length is 0-128
		})
	}
	return ds
}

// addPeerFilter creates the sets and the export policy of peer p, which
// must not receive the prefixes in deny.
func (g *GoBGP) addPeerFilter(ctx context.Context, p *Peer, deny []netip.Prefix) error {
	n := filterFor(p.Name)
	v4, v6 := splitFamilies(deny)
	sets := []*api.DefinedSet{
		{DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: n.neighbors,
			List: []string{netip.PrefixFrom(p.Address, p.Address.BitLen()).String()}},
		prefixSet(n.deny4, v4),
		prefixSet(n.deny6, v6),
	}
	for _, ds := range sets {
		if err := g.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: ds, Replace: true}); err != nil {
			return fmt.Errorf("add defined set %s: %w", ds.Name, err)
		}
	}
	stmt := func(suffix, set string) *api.Statement {
		return &api.Statement{
			Name: n.policy + suffix,
			Conditions: &api.Conditions{
				PrefixSet:   &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: set},
				NeighborSet: &api.MatchSet{Type: api.MatchSet_TYPE_ANY, Name: n.neighbors},
			},
			Actions: &api.Actions{RouteAction: api.RouteAction_ROUTE_ACTION_REJECT},
		}
	}
	if err := g.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: &api.Policy{
		Name:       n.policy,
		Statements: []*api.Statement{stmt("-v4", n.deny4), stmt("-v6", n.deny6)},
	}}); err != nil {
		return fmt.Errorf("add policy %s: %w", n.policy, err)
	}
	return nil
}

// deletePeerFilter removes the export policy and sets of peer p; its
// policy must no longer be assigned.
func (g *GoBGP) deletePeerFilter(ctx context.Context, p *Peer) error {
	n := filterFor(p.Name)
	if err := g.srv.DeletePolicy(ctx, &api.DeletePolicyRequest{Policy: &api.Policy{Name: n.policy}, All: true}); err != nil {
		return fmt.Errorf("delete policy %s: %w", n.policy, err)
	}
	for _, ds := range []*api.DefinedSet{
		{DefinedType: api.DefinedType_DEFINED_TYPE_NEIGHBOR, Name: n.neighbors},
		{DefinedType: api.DefinedType_DEFINED_TYPE_PREFIX, Name: n.deny4},
		{DefinedType: api.DefinedType_DEFINED_TYPE_PREFIX, Name: n.deny6},
	} {
		if err := g.srv.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{DefinedSet: ds, All: true}); err != nil {
			return fmt.Errorf("delete defined set %s: %w", ds.Name, err)
		}
	}
	return nil
}

// assignExport sets the global export policies to those of names (the
// peers whose filters exist), accepting everything else.
func (g *GoBGP) assignExport(ctx context.Context, names []string) error {
	slices.Sort(names)
	policies := make([]*api.Policy, 0, len(names))
	for _, name := range names {
		policies = append(policies, &api.Policy{Name: filterFor(name).policy})
	}
	if err := g.srv.SetPolicyAssignment(ctx, &api.SetPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name:          globalTable,
		Direction:     api.PolicyDirection_POLICY_DIRECTION_EXPORT,
		Policies:      policies,
		DefaultAction: api.RouteAction_ROUTE_ACTION_ACCEPT,
	}}); err != nil {
		return fmt.Errorf("assign export policies: %w", err)
	}
	return nil
}

// changeDenied adds (add) or removes prefixes to or from peer's deny sets.
func (g *GoBGP) changeDenied(ctx context.Context, peer string, prefixes []netip.Prefix, add bool) error {
	v4, v6 := splitFamilies(prefixes)
	n := filterFor(peer)
	for _, ds := range []*api.DefinedSet{prefixSet(n.deny4, v4), prefixSet(n.deny6, v6)} {
		if len(ds.Prefixes) == 0 {
			continue
		}
		var err error
		if add {
			err = g.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: ds})
		} else {
			err = g.srv.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{DefinedSet: ds})
		}
		if err != nil {
			return fmt.Errorf("update prefix set %s: %w", ds.Name, err)
		}
	}
	return nil
}
