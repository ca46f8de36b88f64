package harness

import (
	"fmt"
	"slices"
	"time"
)

// Distribution summarizes repeated measurements: the count, minimum,
// median, 90th percentile and maximum, and how many were at most target
// (when target is not zero).
func Distribution(ds []time.Duration, target time.Duration) string {
	if len(ds) == 0 {
		return "no trials"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[int(q*float64(len(s)-1)+0.5)] }
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	out := fmt.Sprintf("%d trials: min %v, median %v, p90 %v, max %v", len(s), r(s[0]), r(at(0.5)), r(at(0.9)), r(s[len(s)-1]))
	if target > 0 {
		within := 0
		for _, d := range s {
			if d <= target {
				within++
			}
		}
		out += fmt.Sprintf("; %d of %d within %v", within, len(s), target)
	}
	return out
}
