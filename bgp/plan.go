package bgp

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// The functions in this file are pure: they work out which gobgp calls
// bring the engine from what it holds to what is wanted, and make none.
// GoBGP's execute methods make the calls, in the order of the plan.

// denyChange is a change to one peer's deny sets (see policy.go): the
// prefixes to add to them or to remove from them, in the order the routes
// were considered.
type denyChange struct {
	peer     string
	prefixes []netip.Prefix
}

// routePlan is the gobgp calls that turn the announced routes into the
// wanted ones, in the order executeRoutes makes them: withdraw paths,
// add prefixes to deny sets, remove prefixes from deny sets, announce
// paths, soft reset out. Deny changes are one per peer, sorted by peer;
// resetOut is sorted.
//
// Denials are added before any path is announced, so a peer never
// receives a route it must not have, and the denials of a withdrawn route
// are removed only once its path is gone.
type routePlan struct {
	// withdraw holds the announced routes to delete: the withdrawn ones,
	// then those that must flap (a peer that had received one may no
	// longer do so; see GoBGP.Apply).
	withdraw []*Route
	// deny and allow are the prefixes peers must newly not receive, and
	// those they may newly receive or that are no longer announced.
	deny, allow []denyChange
	// announce holds the routes to add or replace, in Apply's order.
	announce []*Route
	// resetOut names the peers newly allowed to receive a route whose
	// path did not change: gobgp sends them nothing without a soft reset
	// out.
	resetOut []string
}

// Len is the number of steps of p (a deny change counts once per peer).
func (p routePlan) Len() int {
	return len(p.withdraw) + len(p.deny) + len(p.allow) + len(p.announce) + len(p.resetOut)
}

// Empty reports whether p changes nothing.
func (p routePlan) Empty() bool { return p.Len() == 0 }

// String summarises p, e.g. "-path 1, +deny 2, +path 3".
func (p routePlan) String() string {
	return summary([]string{"-path", "+deny", "-deny", "+path", "reset-out"},
		[]int{len(p.withdraw), len(p.deny), len(p.allow), len(p.announce), len(p.resetOut)})
}

// summary joins "name count" for the non-zero counts, or says "no changes".
func summary(names []string, counts []int) string {
	var parts []string
	for i, n := range counts {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", names[i], n))
		}
	}
	if len(parts) == 0 {
		return "no changes"
	}
	return strings.Join(parts, ", ")
}

// planRoutes returns the gobgp calls that withdraw the prefixes in
// withdraw (masked; those not in current, or also in news, are skipped)
// and announce the routes of news in order, given the announced routes
// current and the configured peers. news holds normalized routes, by
// prefix; order lists each of its prefixes once. A route equal to the
// announced one is not sent again.
func planRoutes(current map[netip.Prefix]*Route, peers map[string]*Peer, news map[netip.Prefix]*Route, order, withdraw []netip.Prefix) routePlan {
	var (
		p        routePlan
		denyAdd  = map[string][]netip.Prefix{}
		denyDel  = map[string][]netip.Prefix{}
		resetOut = map[string]bool{}
	)
	for _, pfx := range withdraw {
		pfx = pfx.Masked()
		old, ok := current[pfx]
		if !ok || news[pfx] != nil {
			continue
		}
		p.withdraw = append(p.withdraw, old)
		for name := range peers {
			if denied(old, name) {
				denyDel[name] = append(denyDel[name], pfx)
			}
		}
	}
	for _, pfx := range order {
		r, old := news[pfx], current[pfx]
		if old != nil && routeEqual(old, r) {
			continue
		}
		flap := false
		var allowed []string // peers newly allowed to receive r
		for name := range peers {
			was, is := old != nil && denied(old, name), denied(r, name)
			switch {
			case !was && is:
				denyAdd[name] = append(denyAdd[name], pfx)
				flap = flap || old != nil
			case was && !is:
				denyDel[name] = append(denyDel[name], pfx)
				allowed = append(allowed, name)
			}
		}
		switch {
		case flap:
			// Withdrawn and announced again: every allowed peer gets it.
			p.withdraw = append(p.withdraw, old)
		case old != nil && sameAttrs(old, r):
			// gobgp does not propagate a path equal to the one it
			// replaces: the newly allowed peers need a soft reset out.
			for _, name := range allowed {
				resetOut[name] = true
			}
		}
		p.announce = append(p.announce, r)
	}
	p.deny, p.allow = byPeer(denyAdd), byPeer(denyDel)
	p.resetOut = slices.Sorted(maps.Keys(resetOut))
	return p
}

// byPeer returns the changes of m, by peer name, sorted by peer.
func byPeer(m map[string][]netip.Prefix) []denyChange {
	var out []denyChange
	for _, name := range slices.Sorted(maps.Keys(m)) {
		out = append(out, denyChange{peer: name, prefixes: m[name]})
	}
	return out
}

// peerAdd is a session to open, with the prefixes its deny sets start
// with: those of the announced routes it must not receive.
type peerAdd struct {
	peer *Peer
	deny []netip.Prefix
}

// peerPlan is the gobgp calls that turn the configured peers into the
// wanted ones, in the order executePeers makes them:
//
//  1. delete the neighbors in remove (each gets a Cease);
//  2. when remove is not empty, assign the export policies of keep only,
//     so that no policy about to be deleted is assigned;
//  3. delete the export policies and sets of remove;
//  4. create those of add;
//  5. assign the export policies of export, before any new session can
//     come up (made even when nothing else changes);
//  6. add the neighbors in add.
//
// A changed peer is in remove with its old configuration and in add with
// the new one, which resets its session and no other. Every slice is
// sorted by peer name.
type peerPlan struct {
	remove []*Peer
	// keep names the peers that stay as they are.
	keep []string
	add  []peerAdd
	// export names every wanted peer: keep and add.
	export []string
}

// Len is the number of sessions p closes or opens.
func (p peerPlan) Len() int { return len(p.remove) + len(p.add) }

// Empty reports whether p changes no session (its only call then assigns
// the export policies already assigned).
func (p peerPlan) Empty() bool { return p.Len() == 0 }

// String summarises p, e.g. "-peer 1, +peer 2".
func (p peerPlan) String() string {
	return summary([]string{"-peer", "+peer"}, []int{len(p.remove), len(p.add)})
}

// planPeers returns the gobgp calls that turn the configured peers current
// into want (normalized, see normalizePeers), both by name, given the
// announced routes.
func planPeers(current, want map[string]*Peer, routes map[netip.Prefix]*Route) peerPlan {
	var p peerPlan
	for _, name := range slices.Sorted(maps.Keys(current)) {
		if w, ok := want[name]; ok && peerEqual(current[name], w) {
			p.keep = append(p.keep, name)
		} else {
			p.remove = append(p.remove, current[name])
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if old, ok := current[name]; ok && peerEqual(old, want[name]) {
			continue
		}
		p.add = append(p.add, peerAdd{peer: want[name], deny: deniedPrefixes(routes, name)})
	}
	p.export = slices.Sorted(maps.Keys(want))
	return p
}

// maxPrefixLimitRestart caps the wait before a session shut down for
// exceeding its prefix limit is reopened.
const maxPrefixLimitRestart = 30 * time.Minute

// prefixLimitRestart returns how long a session shut down for exceeding
// its prefix limit stays down, and the new count of consecutive such
// shutdowns, given the previous count streak, how long the session had
// been Established before this shutdown, and the first wait base. The
// wait doubles with each consecutive shutdown, up to
// maxPrefixLimitRestart (or base, when longer); a session that had stayed
// up that long counts as well-behaved, and starts again from base.
func prefixLimitRestart(streak int, uptime, base time.Duration) (time.Duration, int) {
	limit := max(base, maxPrefixLimitRestart)
	if uptime >= limit {
		streak = 0
	}
	streak++
	wait := base
	for i := 1; i < streak && wait < limit; i++ {
		wait *= 2
	}
	return min(wait, limit), streak
}
