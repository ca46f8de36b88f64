// Package golden compares generated pages with the files checked in, for
// the tests that render documentation from the code (docs/reference).
package golden

import (
	"os"
	"testing"
)

// Check compares got with the file at path; with update it writes got
// there instead. A difference fails t, naming the file, what to run
// (make generate) and showing got.
func Check(t testing.TB, path, got string, update bool) {
	t.Helper()
	if update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil { //nolint:gosec // a docs page, world-readable
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run make generate", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from what the code says: run make generate\n--- the code says:\n%s", path, got)
	}
}
