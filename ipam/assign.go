package ipam

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Assign returns the owner's assignment, allocating as needed.
//
// It is idempotent: if the owner already holds addresses compatible with
// req they are returned unchanged. Compatible means: if req.IPs is set the
// held set equals it; if req.Pool is set every held address lies in that
// pool; the held families cover what req wants (a PreferDualStack request
// gets a missing family added when the pool of its held address has one
// free; a held address that is still wanted is never dropped, one of a
// family no longer wanted is released); and the ports still don't clash
// with the sharers. An orphan address (no longer in any pool) stays with
// its owner unless the request explicitly asks for something else.
//
// If the request needs different addresses, the new ones are obtained
// first and the old ones released only on success. On error the owner
// keeps its previous addresses and is described by req from then on, with
// one exception: an address it may no longer share with its other holders
// under req (its sharing key, ports, traffic policy or pod selector
// changed) it gives up even so, and the other holders keep it. So two
// owners that may not share an address never hold it together, and an
// owner that changed never takes an address from one that did not. With a
// SharingKey and no requested IP, an
// address already used under the same key with compatible ports and
// selector, in an eligible pool, is preferred over a fresh one. Otherwise
// the lowest free address of the first eligible pool is handed out.
func (a *Allocator) Assign(req Request) (Assignment, error) {
	var n normReq
	nr := &n
	if err := normalize(req, nr); err != nil {
		return Assignment{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()

	o := a.owners[nr.Owner]
	ips, err := a.pick(nr, o)
	if err != nil {
		if o != nil {
			a.keepCompatible(o, nr)
		}
		return Assignment{}, err
	}
	if o = a.commit(o, nr.Owner, nr.attrs, ips); o == nil {
		// Unreachable: every successful pick holds at least one address.
		return Assignment{}, newError(ReasonInvalid, "%s: the request resolves to no address; request at least one family", nr.Owner)
	}
	// ips is a fresh slice in the owner's family order, see the pickers.
	return Assignment{Pool: o.pool(), IPs: ips}, nil
}

// pick chooses the addresses the owner o (nil if it holds nothing) gets
// for nr, without changing anything.
func (a *Allocator) pick(nr *normReq, o *owner) ([]netip.Addr, error) {
	var explicit *pool
	if nr.Pool != "" {
		explicit = a.pools[nr.Pool]
		if explicit == nil {
			return nil, newError(ReasonUnknownPool, "%s: pool %q does not exist; name an existing pool, or remove the pool request to choose one automatically", nr.Owner, nr.Pool)
		}
		if why := explicit.refuses(nr); why != "" {
			return nil, newError(ReasonNoPool, "%s: %s; use a pool that admits this Service", nr.Owner, why)
		}
	}
	if len(nr.IPs) > 0 {
		return a.pickRequested(nr, o, explicit)
	}
	return a.pickAuto(nr, o, explicit)
}

// keepCompatible is what a failed request leaves its owner: the addresses
// it may still hold beside their other holders under nr, described by nr
// from now on, so no newcomer joins it on what it asked before.
func (a *Allocator) keepCompatible(o *owner, nr *normReq) {
	var buf [2]netip.Addr
	keep := buf[:0]
	for _, st := range o.held {
		if canShare(st, nr.Owner, &nr.attrs) == nil {
			keep = append(keep, st.addr)
		}
	}
	a.commit(o, nr.Owner, nr.attrs, keep)
}

// pickRequested checks that the owner may hold exactly the requested
// addresses.
func (a *Allocator) pickRequested(nr *normReq, o *owner, explicit *pool) ([]netip.Addr, error) {
	for _, ip := range nr.IPs {
		st := a.ips[ip]
		self := st != nil && st.heldBy(o)
		r, _, usable := a.locate(ip)
		switch {
		case r == nil || !usable:
			if self && explicit == nil {
				// An orphan (or restored) address its owner keeps.
				break
			}
			return nil, a.notInPool(nr, ip, r, explicit)
		case explicit != nil && r.pool != explicit:
			return nil, newError(ReasonNotInPool, "%s: requested address %s is in pool %q, not in the requested pool %q; request an address of pool %q or drop the pool request",
				nr.Owner, ip, r.pool.name(), explicit.name(), explicit.name())
		case explicit == nil && !self:
			if why := r.pool.refuses(nr); why != "" {
				return nil, newError(ReasonNoPool, "%s: requested address %s is in pool %q, but %s; request an address of a pool that admits this Service", nr.Owner, ip, r.pool.name(), why)
			}
		}
		if st != nil {
			if err := canShare(st, nr.Owner, &nr.attrs); err != nil {
				return nil, err
			}
		}
	}
	return nr.IPs, nil // a fresh slice, see checkIPs
}

func (a *Allocator) notInPool(nr *normReq, ip netip.Addr, r *prange, explicit *pool) *Error {
	switch {
	case r != nil:
		return newError(ReasonNotInPool, "%s: requested address %s is in pool %q, which avoids addresses ending in .0 and .255; request another address",
			nr.Owner, ip, r.pool.name())
	case explicit != nil:
		return newError(ReasonNotInPool, "%s: requested address %s is not in pool %q; request an address of that pool or drop the pool request", nr.Owner, ip, explicit.name())
	case a.ips[ip] != nil:
		return newError(ReasonNotInPool, "%s: requested address %s is not in any pool; it is kept by %s, its holder from before, and given to nobody else; request an address of a pool",
			nr.Owner, ip, a.ips[ip].holders[0].name)
	}
	return newError(ReasonNotInPool, "%s: requested address %s is not in any pool; request an address of a pool, or add a pool that contains it", nr.Owner, ip)
}

// pickAuto chooses addresses for a request without requested IPs.
func (a *Allocator) pickAuto(nr *normReq, o *owner, explicit *pool) ([]netip.Addr, error) {
	if o != nil {
		if ips, ok := a.keepHeld(nr, o, explicit); ok {
			return ips, nil
		}
	}
	if o == nil && explicit == nil && nr.attrs.key == "" {
		// Fast path: nothing held or shareable to prefer, so the first
		// eligible pool with room wins. On failure the general path below
		// works out the error.
		for _, p := range a.order {
			if p.cfg.AutoAssign && p.refuses(nr) == "" && p.offers(nr) == "" {
				if ips, ok := a.tryPool(p, nr, nil); ok {
					return ips, nil
				}
			}
		}
	}
	cands, err := a.candidates(nr, explicit)
	if err != nil {
		return nil, err
	}
	// Pools where the owner already holds a wanted address come first, then
	// pools with an address it may share, then the rest, each in order.
	rank := func(p *pool) int {
		if o != nil {
			for _, st := range o.held {
				if st.rng != nil && st.rng.pool == p && nr.wants(FamilyOf(st.addr)) {
					return 0
				}
			}
		}
		return 2
	}
	shareable := a.poolsSharable(nr)
	slices.SortStableFunc(cands, func(x, y *pool) int {
		rx, ry := rank(x), rank(y)
		if shareable[x] {
			rx = min(rx, 1)
		}
		if shareable[y] {
			ry = min(ry, 1)
		}
		return rx - ry
	})
	for _, p := range cands {
		if ips, ok := a.tryPool(p, nr, o); ok {
			return ips, nil
		}
	}
	return nil, a.exhausted(nr, cands)
}

func (a *Allocator) exhausted(nr *normReq, cands []*pool) *Error {
	var parts []string
	for _, p := range cands {
		var fs []string
		for _, f := range nr.fams {
			if p.has(f) {
				fs = append(fs, fmt.Sprintf("%s %s", f, p.inUseString(f)))
			}
		}
		parts = append(parts, fmt.Sprintf("pool %q (%s)", p.name(), strings.Join(fs, ", ")))
	}
	return newError(ReasonExhausted, "%s: no free %s address in %s; release addresses or add addresses to a pool",
		nr.Owner, famList(nr), strings.Join(parts, ", "))
}

func famList(nr *normReq) string {
	var fs []string
	for _, f := range nr.fams {
		fs = append(fs, f.String())
	}
	if nr.require {
		return strings.Join(fs, "+")
	}
	return fs[0]
}

// keepHeld returns the owner's current addresses, adjusted to the wanted
// families, if they are compatible with the request.
func (a *Allocator) keepHeld(nr *normReq, o *owner, explicit *pool) ([]netip.Addr, bool) {
	var keep []netip.Addr
	var home *pool // pool of a kept address, preferring the first family's
	homeRank := len(nr.fams)
	for _, st := range o.held {
		f := FamilyOf(st.addr)
		if !nr.wants(f) {
			continue // no longer wanted: released on commit
		}
		if explicit != nil && (st.rng == nil || st.rng.pool != explicit) {
			return nil, false
		}
		if canShare(st, nr.Owner, &nr.attrs) != nil {
			return nil, false
		}
		keep = append(keep, st.addr)
		if st.rng != nil && nr.famRank(f) < homeRank {
			home, homeRank = st.rng.pool, nr.famRank(f)
		}
	}
	if len(keep) == 0 {
		return nil, false
	}
	held := func(f Family) bool {
		return slices.ContainsFunc(keep, func(ip netip.Addr) bool { return FamilyOf(ip) == f })
	}
	if len(nr.fams) == 1 || nr.require {
		for _, f := range nr.fams {
			if !held(f) {
				return nil, false
			}
		}
		nr.orderIPs(keep)
		return keep, true
	}
	// PreferDualStack: add missing families from the home pool when it is
	// usable for this request and has a free (or shareable) address.
	if home != nil && (home == explicit || (home.cfg.AutoAssign && home.refuses(nr) == "")) {
		for _, f := range nr.fams {
			if held(f) || !home.has(f) {
				continue
			}
			if ip, ok := a.pickInPool(home, f, nr); ok {
				keep = append(keep, ip)
			}
		}
	}
	nr.orderIPs(keep)
	return keep, true
}

// candidates returns the pools a request without requested IPs may use, in
// order, or a ReasonNoPool error saying why there are none.
func (a *Allocator) candidates(nr *normReq, explicit *pool) ([]*pool, error) {
	if explicit != nil {
		if why := explicit.offers(nr); why != "" {
			return nil, newError(ReasonNoPool, "%s: %s; use a pool with %s addresses", nr.Owner, why, famList(nr))
		}
		return []*pool{explicit}, nil
	}
	var out []*pool
	for _, p := range a.order {
		if p.cfg.AutoAssign && p.refuses(nr) == "" && p.offers(nr) == "" {
			out = append(out, p)
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	if len(a.order) == 0 {
		return nil, newError(ReasonNoPool, "%s: no pools are configured; create an IP pool", nr.Owner)
	}
	var why []string
	for _, p := range a.order {
		switch {
		case !p.cfg.AutoAssign:
			why = append(why, fmt.Sprintf("pool %q has autoAssign disabled", p.name()))
		case p.refuses(nr) != "":
			why = append(why, p.refuses(nr))
		default:
			why = append(why, p.offers(nr))
		}
	}
	return nil, newError(ReasonNoPool, "%s: no pool can serve %s automatically: %s; request a pool explicitly or adjust the pools' selectors",
		nr.Owner, famList(nr), strings.Join(why, "; "))
}

// tryPool picks addresses for every wanted family from p: the owner's own
// compatible address, else a shareable one, else the lowest free one. It
// fails if the first family (or, for RequireDualStack, any family) cannot
// be served.
func (a *Allocator) tryPool(p *pool, nr *normReq, o *owner) ([]netip.Addr, bool) {
	out := make([]netip.Addr, 0, len(nr.fams))
	for i, f := range nr.fams {
		mandatory := i == 0 || nr.require
		if !p.has(f) {
			if mandatory {
				return nil, false
			}
			continue
		}
		ip, ok := a.ownIn(p, f, nr, o)
		if !ok {
			ip, ok = a.pickInPool(p, f, nr)
		}
		if !ok {
			if mandatory {
				return nil, false
			}
			continue
		}
		out = append(out, ip)
	}
	return out, true
}

// ownIn returns an address of family f in p that o holds and may keep.
func (a *Allocator) ownIn(p *pool, f Family, nr *normReq, o *owner) (netip.Addr, bool) {
	if o == nil {
		return netip.Addr{}, false
	}
	for _, st := range o.held {
		ip := st.addr
		if FamilyOf(ip) == f && st.rng != nil && st.rng.pool == p && canShare(st, nr.Owner, &nr.attrs) == nil {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// pickInPool returns a shareable address of family f in p, else the lowest
// free one.
func (a *Allocator) pickInPool(p *pool, f Family, nr *normReq) (netip.Addr, bool) {
	if ip, ok := a.shareable(p, f, nr); ok {
		return ip, true
	}
	return p.lowestFree(f)
}
