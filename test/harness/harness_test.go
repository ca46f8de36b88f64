package harness

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRunner(t *testing.T) {
	var logs []string
	r := NewRunner(func(format string, _ ...any) { logs = append(logs, format) })
	var order []string
	var dir string
	reached := false
	err := r.Run(func(h T) {
		h.Cleanup(func() { order = append(order, "first") })
		h.Cleanup(func() { order = append(order, "second") })
		dir = h.TempDir()
		h.Fatalf("boom %d", 1)
		reached = true
	})
	if err == nil || !r.Failed() {
		t.Fatalf("Run after Fatalf: err %v, Failed %v; want a failure", err, r.Failed())
	}
	if reached {
		t.Error("code after Fatalf ran")
	}
	if !slices.ContainsFunc(logs, func(l string) bool { return strings.Contains(l, "boom") }) {
		t.Errorf("Fatalf's message not logged: %q", logs)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("TempDir %s gone before Close: %v", dir, err)
	}
	r.Close()
	if !slices.Equal(order, []string{"second", "first"}) {
		t.Errorf("cleanups ran as %v, want last registered first", order)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("TempDir %s still there after Close: %v", dir, err)
	}

	ok := NewRunner(func(string, ...any) {})
	if err := ok.Run(func(h T) { h.Logf("fine") }); err != nil || ok.Failed() {
		t.Errorf("a run without failures: err %v, Failed %v", err, ok.Failed())
	}
	ok.Close()
}

func TestDistribution(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		in     []time.Duration
		target time.Duration
		want   string
	}{
		{nil, 0, "no trials"},
		{ms(5), 0, "1 trials: min 5ms, median 5ms, p90 5ms, max 5ms"},
		{ms(400, 100, 300, 200, 500, 600, 700, 800, 900, 1000), 550 * time.Millisecond,
			"10 trials: min 100ms, median 600ms, p90 900ms, max 1s; 5 of 10 within 550ms"},
	} {
		if got := Distribution(tc.in, tc.target); got != tc.want {
			t.Errorf("Distribution(%v, %v) = %q, want %q", tc.in, tc.target, got, tc.want)
		}
	}
}
