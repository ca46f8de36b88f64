package harness

import (
	"os"
	"slices"
	"strings"
	"testing"
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
