package vm

import "testing"

func TestLeastUsed(t *testing.T) {
	for _, tc := range []struct {
		name            string
		allowed, pinned []int
		tiebreak        int
		want            int
		ok              bool
	}{
		{name: "one CPU: no pinning", allowed: []int{0}},
		{name: "none pinned: the tie-break picks", allowed: []int{0, 1}, tiebreak: 1, want: 1, ok: true},
		{name: "none pinned, tie-break wraps", allowed: []int{0, 1}, tiebreak: 4, want: 0, ok: true},
		{name: "the free CPU", allowed: []int{0, 1}, pinned: []int{0}, tiebreak: 2, want: 1, ok: true},
		{name: "the less used", allowed: []int{0, 1, 2}, pinned: []int{0, 0, 1, 2, 2}, tiebreak: 7, want: 1, ok: true},
		{name: "VMs on CPUs this process may not use do not count", allowed: []int{2, 3}, pinned: []int{0, 1, 3}, want: 2, ok: true},
		{name: "a negative tie-break", allowed: []int{0, 1}, tiebreak: -3, want: 1, ok: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := leastUsed(tc.allowed, tc.pinned, tc.tiebreak)
			if ok != tc.ok || (ok && got != tc.want) {
				t.Errorf("leastUsed(%v, %v, %d) = %d, %v; want %d, %v", tc.allowed, tc.pinned, tc.tiebreak, got, ok, tc.want, tc.ok)
			}
		})
	}
}
