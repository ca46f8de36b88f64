package vm

import (
	"slices"
	"testing"
	"time"
)

func TestSplitPattern(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"", []string{""}},
		{"TestA", []string{"TestA"}},
		{"TestA/IPv6/sync=true", []string{"TestA", "IPv6", "sync=true"}},
		{"^(TestA|TestB/x)$/y", []string{"^(TestA|TestB/x)$", "y"}},
		{"Test[/]A/b", []string{"Test[/]A", "b"}},
		{`Test\/A/b`, []string{`Test\/A`, "b"}},
	} {
		if got := splitPattern(c.in); !slices.Equal(got, c.want) {
			t.Errorf("splitPattern(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestSelectMembers(t *testing.T) {
	members := []string{"TestKernel", "TestECMPMove", "TestKernelTwoTier"}
	for _, c := range []struct {
		run, skip string
		want      []string
	}{
		{"", "", members},
		{"TestKernel$", "", []string{"TestKernel"}},
		{"TestKernel", "", []string{"TestKernel", "TestKernelTwoTier"}},
		{"TestECMPMove/IPv6", "", []string{"TestECMPMove"}},
		{"TestDiff", "", nil},
		{"", "TestECMPMove", []string{"TestKernel", "TestKernelTwoTier"}},
		// A skip with subtest elements leaves the top-level test in.
		{"", "TestECMPMove/IPv6", members},
	} {
		got, err := selectMembers(members, c.run, c.skip)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("selectMembers(run %q, skip %q) = %q, %v; want %q", c.run, c.skip, got, err, c.want)
		}
	}
	if _, err := selectMembers(members, "Test(", ""); err == nil {
		t.Error("selectMembers with a malformed pattern: no error")
	}
}

func TestGuestArgs(t *testing.T) {
	got := guestArgs([]string{"TestA", "TestB.x"}, "Test/IPv6/sync=true", "Slow", 4*time.Minute)
	want := []string{"-test.run", `^(TestA|TestB\.x)$/IPv6/sync=true`, "-test.v", "-test.count=1", "-test.timeout", "3m30s", "-test.skip", "Slow"}
	if !slices.Equal(got, want) {
		t.Errorf("guestArgs = %q, want %q", got, want)
	}
}

// guestOutput is a guest console: kernel lines, two top-level tests (one
// with subtests, one failing), a skip, the binary's verdict and the
// harness's exit marker.
const guestOutput = `[    1.2] ip_vs: registered
=== RUN   TestA
=== RUN   TestA/one
    a_test.go:10: inside one
=== RUN   TestA/two
--- PASS: TestA (1.00s)
    --- PASS: TestA/one (0.50s)
    --- PASS: TestA/two (0.50s)
=== RUN   TestB
    b_test.go:20: broken
--- FAIL: TestB (0.10s)
=== RUN   TestC
    c_test.go:5: not here
--- SKIP: TestC (0.00s)
=== RUN   TestD
FAIL
` + ExitMarker + "1\n"

func TestSectionsAndVerdicts(t *testing.T) {
	a := testSection(guestOutput, "TestA")
	if want := "=== RUN   TestA\n=== RUN   TestA/one\n    a_test.go:10: inside one\n=== RUN   TestA/two\n--- PASS: TestA (1.00s)\n    --- PASS: TestA/one (0.50s)\n    --- PASS: TestA/two (0.50s)\n"; a != want {
		t.Errorf("section of TestA:\n%q\nwant\n%q", a, want)
	}
	for name, want := range map[string]string{"TestA": "PASS", "TestB": "FAIL", "TestC": "SKIP", "TestD": "", "TestE": ""} {
		if got := verdict(testSection(guestOutput, name), name); got != want {
			t.Errorf("verdict of %s = %q, want %q", name, got, want)
		}
	}
	// TestA/one's own line must not count as TestA's verdict.
	if got := verdict("--- PASS: TestA/one (0.50s)\n", "TestA"); got != "" {
		t.Errorf("a subtest's PASS counted as its parent's: %q", got)
	}
	if d := testSection(guestOutput, "TestD"); d != "=== RUN   TestD\n" {
		t.Errorf("section of TestD (the binary's FAIL and the exit marker are not its own) = %q", d)
	}
}
