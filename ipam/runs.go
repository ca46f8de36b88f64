package ipam

import "github.com/google/btree"

// run is an inclusive span [lo, hi] of allocated indexes.
type run struct {
	lo, hi u128
}

// runs is the set of allocated indexes of one range, kept as maximal
// (merged, non-adjacent) runs ordered by lo. Memory is O(runs), at most
// O(allocated indexes); every operation is O(log runs).
type runs struct {
	t *btree.BTreeG[run]
}

// btreeDegree trades node size for depth; 32 keeps trees of 10^5 runs at a
// depth of about 3.
const btreeDegree = 32

func runLess(a, b run) bool { return a.lo.less(b.lo) }

func (s *runs) tree() *btree.BTreeG[run] {
	if s.t == nil {
		s.t = btree.NewG(btreeDegree, runLess)
	}
	return s.t
}

// floor returns the run with the largest lo <= i.
func (s *runs) floor(i u128) (run, bool) {
	if s.t == nil {
		return run{}, false
	}
	var out run
	found := false
	s.t.DescendLessOrEqual(run{lo: i}, func(r run) bool {
		out, found = r, true
		return false
	})
	return out, found
}

// contains reports whether index i is allocated.
func (s *runs) contains(i u128) bool {
	r, ok := s.floor(i)
	return ok && !r.hi.less(i)
}

// lowestFree returns the lowest index in [0, last] not allocated.
func (s *runs) lowestFree(last u128) (u128, bool) {
	if s.t == nil {
		return u128{}, true
	}
	first, ok := s.t.Min()
	if !ok || !first.lo.isZero() {
		return u128{}, true
	}
	// Runs are maximal, so the index right after the first run is free
	// unless the first run reaches the end of the space.
	if first.hi.cmp(last) >= 0 {
		return u128{}, false
	}
	return first.hi.inc(), true
}

// insert marks index i allocated; it reports false if it already was.
func (s *runs) insert(i u128) bool {
	t := s.tree()
	prev, hasPrev := s.floor(i)
	if hasPrev && !prev.hi.less(i) {
		return false
	}
	joinPrev := hasPrev && prev.hi.inc() == i
	var next run
	joinNext := false
	if i != maxU128() {
		next, joinNext = t.Get(run{lo: i.inc()})
	}
	switch {
	case joinPrev && joinNext:
		t.Delete(next)
		t.ReplaceOrInsert(run{lo: prev.lo, hi: next.hi})
	case joinPrev:
		t.ReplaceOrInsert(run{lo: prev.lo, hi: i})
	case joinNext:
		t.Delete(next)
		t.ReplaceOrInsert(run{lo: i, hi: next.hi})
	default:
		t.ReplaceOrInsert(run{lo: i, hi: i})
	}
	return true
}

// remove marks index i free; it reports false if it was not allocated.
func (s *runs) remove(i u128) bool {
	r, ok := s.floor(i)
	if !ok || r.hi.less(i) {
		return false
	}
	t := s.t
	switch {
	case r.lo == i && r.hi == i:
		t.Delete(r)
	case r.lo == i:
		t.Delete(r)
		t.ReplaceOrInsert(run{lo: i.inc(), hi: r.hi})
	case r.hi == i:
		t.ReplaceOrInsert(run{lo: r.lo, hi: i.dec()})
	default:
		t.ReplaceOrInsert(run{lo: r.lo, hi: i.dec()})
		t.ReplaceOrInsert(run{lo: i.inc(), hi: r.hi})
	}
	return true
}

// len returns the number of runs.
func (s *runs) len() int {
	if s.t == nil {
		return 0
	}
	return s.t.Len()
}

// each calls fn for every run in order.
func (s *runs) each(fn func(run) bool) {
	if s.t != nil {
		s.t.Ascend(fn)
	}
}
