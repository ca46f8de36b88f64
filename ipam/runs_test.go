package ipam

import (
	"math/rand/v2"
	"testing"
)

// TestRunsModel drives runs with random inserts and removes and compares
// it with a plain set, including at the top of the 128-bit space.
func TestRunsModel(t *testing.T) {
	for _, base := range []u128{{}, maxU128().sub(u64(63))} {
		rng := rand.New(rand.NewPCG(7, base.lo))
		var rs runs
		model := map[u128]bool{}
		last := base.add(u64(63)) // the space is [0, last]; we use its top 64
		for step := range 20000 {
			i := base.add(u64(rng.Uint64N(64)))
			if rng.IntN(2) == 0 {
				if got := rs.insert(i); got == model[i] {
					t.Fatalf("step %d: insert(%v) = %v with model %v", step, i, got, model[i])
				}
				model[i] = true
			} else {
				if got := rs.remove(i); got != model[i] {
					t.Fatalf("step %d: remove(%v) = %v with model %v", step, i, got, model[i])
				}
				delete(model, i)
			}
			j := base.add(u64(rng.Uint64N(64)))
			if rs.contains(j) != model[j] {
				t.Fatalf("step %d: contains(%v) = %v", step, j, !model[j])
			}
			// Runs are maximal and sorted.
			var prev *run
			n := 0
			rs.each(func(r run) bool {
				if prev != nil && !prev.hi.inc().less(r.lo) {
					t.Fatalf("step %d: runs %v %v not separated", step, *prev, r)
				}
				n += int(r.hi.sub(r.lo).lo) + 1
				prev = &r
				return true
			})
			if n != len(model) {
				t.Fatalf("step %d: runs hold %d, model %d", step, n, len(model))
			}
			if base.isZero() {
				want, wantOK := u128{}, false
				for k := range uint64(64) {
					if !model[u64(k)] {
						want, wantOK = u64(k), true
						break
					}
				}
				got, ok := rs.lowestFree(last)
				if ok != wantOK || (ok && got != want) {
					t.Fatalf("step %d: lowestFree = %v %v, want %v %v", step, got, ok, want, wantOK)
				}
			}
		}
	}
}

func TestRunsFullSpace(t *testing.T) {
	var rs runs
	if i, ok := rs.lowestFree(maxU128()); !ok || !i.isZero() {
		t.Fatal("empty runs: lowest free should be 0")
	}
	rs.insert(maxU128())
	rs.insert(u128{})
	if i, ok := rs.lowestFree(maxU128()); !ok || i != u64(1) {
		t.Fatalf("lowest free = %v %v", i, ok)
	}
	rs.insert(u64(1))
	if rs.len() != 2 {
		t.Fatalf("runs = %d, want 2", rs.len())
	}
	if !rs.remove(maxU128()) || rs.contains(maxU128()) || rs.len() != 1 {
		t.Fatal("remove max")
	}
	var one runs
	one.insert(u128{})
	if _, ok := one.lowestFree(u128{}); ok {
		t.Fatal("single-index space is full")
	}
}
