package ipam

import "slices"

// SetPools replaces the pool configuration.
//
// Pools are given in precedence order: a pool that is malformed, has no
// name, repeats an earlier name or overlaps an earlier accepted pool is
// rejected and not installed. The returned map has an error (an *Error) per
// rejected pool name (a pool without a name is reported under ""); it is nil
// when every pool was accepted.
//
// Existing assignments always survive: an address no longer inside any pool
// is kept by its owner (an "orphan") and never handed to anybody else; if a
// pool covering it comes back, it is accounted in that pool again.
func (a *Allocator) SetPools(pools []Pool) map[string]error {
	errs := map[string]error{}
	var accepted []*pool
	var index rangeIndex
	names := map[string]bool{}
	for _, cfg := range pools {
		if cfg.Name == "" {
			errs[""] = newError(ReasonInvalid, "a pool has no name; give every pool a unique name")
			continue
		}
		if names[cfg.Name] {
			errs[cfg.Name] = newError(ReasonInvalid, "pool %q is defined more than once; the later definition was ignored, give every pool a unique name", cfg.Name)
			continue
		}
		names[cfg.Name] = true
		rs, err := parseAddresses(cfg.Addresses)
		if err != nil {
			errs[cfg.Name] = newError(err.Reason, "pool %q: %s", cfg.Name, err.Msg)
			continue
		}
		if len(rs) == 0 {
			errs[cfg.Name] = newError(ReasonInvalid, "pool %q has no addresses; add at least one CIDR or range", cfg.Name)
			continue
		}
		p := newPool(cfg, rs)
		if err := overlapError(p, index); err != nil {
			errs[cfg.Name] = err
			continue
		}
		accepted = append(accepted, p)
		for _, r := range p.ranges {
			index = index.insert(r)
		}
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	a.pools = make(map[string]*pool, len(accepted))
	for _, p := range accepted {
		a.pools[p.name()] = p
	}
	a.order = slices.Clone(accepted)
	slices.SortFunc(a.order, comparePools)
	a.index = index
	for _, st := range a.ips {
		a.account(st)
	}
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// overlapError reports the first range of p overlapping an accepted pool.
func overlapError(p *pool, index rangeIndex) *Error {
	for _, r := range p.ranges {
		if o := index.overlapping(r.Range); o != nil {
			return newError(ReasonOverlap,
				"pool %q: addresses[%d] %q overlaps pool %q addresses[%d] %q; pools must not overlap, shrink or remove one of the entries",
				p.name(), r.pos, r.entry, o.pool.name(), o.pos, o.entry)
		}
	}
	return nil
}
