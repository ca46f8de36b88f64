package ipam

import (
	"fmt"
	"slices"
	"strings"
)

// checkInvariants verifies the allocator's internal consistency: owners and
// address states agree, holders of a shared address may share it, every
// address is accounted in exactly the range that contains it (holders of a
// legacy share, one Restore admitted under older rules, meet those rules
// and break today's), the runs
// match the accounted addresses, pool counters match, and the sharing-key
// index is exact.
func (a *Allocator) checkInvariants() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, o := range a.owners {
		if o.name != name {
			return fmt.Errorf("owner %q filed under %q", o.name, name)
		}
		if len(o.held) == 0 {
			return fmt.Errorf("owner %q holds nothing but is recorded", name)
		}
		var fams []Family
		for _, ip := range o.ips() {
			if slices.Contains(fams, FamilyOf(ip)) {
				return fmt.Errorf("owner %q holds two %s addresses: %v", name, FamilyOf(ip), o.ips())
			}
			fams = append(fams, FamilyOf(ip))
			if st := a.ips[ip]; st == nil || !st.heldBy(o) || o.holds(ip) != st {
				return fmt.Errorf("owner %q lists %s but the address does not list it", name, ip)
			}
		}
	}
	type famCount [2]int
	inUse := map[*pool]famCount{}
	perRange := map[*prange]int{}
	for ip, st := range a.ips {
		if st.addr != ip {
			return fmt.Errorf("state of %s filed under %s", st.addr, ip)
		}
		if len(st.holders) == 0 {
			return fmt.Errorf("%s has no holders", ip)
		}
		for i, h := range st.holders {
			if a.owners[h.name] != h || h.holds(ip) != st {
				return fmt.Errorf("%s lists holder %q which does not hold it", ip, h.name)
			}
			if i > 0 && strings.Compare(st.holders[i-1].name, h.name) >= 0 {
				return fmt.Errorf("%s holders not sorted/unique", ip)
			}
			check := shareConflict
			if st.legacy {
				check = legacyConflict
			}
			for _, g := range st.holders[:i] {
				if err := check(ip, h.name, &h.attrs, g); err != nil {
					return fmt.Errorf("%s held by %q and %q which may not share (legacy %v): %w", ip, g.name, h.name, st.legacy, err)
				}
			}
		}
		if st.legacy && st.breaksRules() == nil {
			return fmt.Errorf("%s is a legacy share but its holders %v meet today's rules", ip, st.holders)
		}
		r, idx, ok := a.locate(ip)
		if ok {
			if st.rng != r || st.idx != idx {
				return fmt.Errorf("%s accounted at %v/%v, want %v/%v", ip, st.rng, st.idx, r, idx)
			}
			if !r.used.contains(idx) {
				return fmt.Errorf("%s not marked in its range's runs", ip)
			}
			if r.addr(idx) != ip {
				return fmt.Errorf("%s index %v maps back to %s", ip, idx, r.addr(idx))
			}
			perRange[r]++
			c := inUse[r.pool]
			c[FamilyOf(ip).slot()]++
			inUse[r.pool] = c
		} else if st.rng != nil {
			return fmt.Errorf("%s is accounted in pool %q but no usable range contains it", ip, st.rng.pool.name())
		}
		key := st.holders[0].attrs.key
		if st.key != key {
			return fmt.Errorf("%s filed under key %q, holders have %q", ip, st.key, key)
		}
		if key != "" && a.byKey[key][ip] != st {
			return fmt.Errorf("%s missing from key index %q", ip, key)
		}
	}
	for key, m := range a.byKey {
		if len(m) == 0 {
			return fmt.Errorf("empty key index %q", key)
		}
		for ip, st := range m {
			if a.ips[ip] != st || st.key != key {
				return fmt.Errorf("stale key index %q entry %s", key, ip)
			}
		}
	}
	for _, p := range a.order {
		if a.pools[p.name()] != p {
			return fmt.Errorf("pool %q in order but not in map", p.name())
		}
		for _, r := range p.ranges {
			var total u128
			var prev *run
			var err error
			r.used.each(func(x run) bool {
				if x.hi.less(x.lo) || r.last.less(x.hi) {
					err = fmt.Errorf("pool %q range %s: bad run %v (last %v)", p.name(), r.entry, x, r.last)
					return false
				}
				if prev != nil && !prev.hi.inc().less(x.lo) {
					err = fmt.Errorf("pool %q range %s: runs %v and %v not disjoint and separated", p.name(), r.entry, *prev, x)
					return false
				}
				total = total.add(x.hi.sub(x.lo).inc())
				prev = &x
				return true
			})
			if err != nil {
				return err
			}
			if total != u64(uint64(perRange[r])) {
				return fmt.Errorf("pool %q range %s: runs count %v addresses, %d accounted", p.name(), r.entry, total, perRange[r])
			}
		}
		c := inUse[p]
		if p.fams[0].inUse != c[0] || p.fams[1].inUse != c[1] {
			return fmt.Errorf("pool %q inUse %d/%d, counted %d/%d", p.name(), p.fams[0].inUse, p.fams[1].inUse, c[0], c[1])
		}
	}
	if len(a.pools) != len(a.order) {
		return fmt.Errorf("%d pools in map, %d in order", len(a.pools), len(a.order))
	}
	return nil
}
