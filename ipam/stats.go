package ipam

import "math/big"

// FamilyStats is the usage of one family of a pool.
type FamilyStats struct {
	// Capacity is the number of usable addresses; avoided buggy IPs are
	// not counted.
	Capacity *big.Int
	// InUse is the number of distinct addresses held.
	InUse int
}

// PoolStats is the usage of a pool per family.
type PoolStats struct {
	IPv4, IPv6 FamilyStats
}

// Stats returns the usage of the named pool, or false if it is not
// installed. The returned values are copies.
func (a *Allocator) Stats(pool string) (PoolStats, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p := a.pools[pool]
	if p == nil {
		return PoolStats{}, false
	}
	fs := func(s famState) FamilyStats {
		return FamilyStats{Capacity: new(big.Int).Set(s.capacity), InUse: s.inUse}
	}
	return PoolStats{IPv4: fs(p.fams[0]), IPv6: fs(p.fams[1])}, true
}
