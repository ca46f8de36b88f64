package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testdata/run.json is a recorded `go test -json -p 4 ./...` of a small
// module named like this one: ipam passes with subtests, a parallel subtest
// and two skips; bgp fails in a subtest (after stdout output and a passing
// sibling) and in a test without subtests; broken fails to build;
// nodereport has no test files; test/lab passes TestCluster (nftables with
// a nested subtest, lifecycle, a skipped bfd) and TestEndToEnd. The packages'
// events interleave.

func readFixture(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// only keeps the fixture's events of packages whose path ends in one of the
// suffixes, without lines that contain drop.
func only(fixture, drop string, suffixes ...string) string {
	var out strings.Builder
	for _, l := range strings.SplitAfter(fixture, "\n") {
		if l == "" || (drop != "" && strings.Contains(l, drop)) {
			continue
		}
		var e event
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			continue
		}
		name := e.Package
		if name == "" {
			name = strings.Fields(e.ImportPath)[0]
		}
		for _, s := range suffixes {
			if strings.HasSuffix(name, "/"+s) {
				out.WriteString(l)
			}
		}
	}
	return out.String()
}

// result is one run of the reporter.
type result struct {
	code   int
	stdout string
	stderr string
	dir    string
}

// lastLine is the last line of the report.
func (r result) lastLine() string {
	ls := lines(r.stdout)
	if len(ls) == 0 {
		return ""
	}
	return ls[len(ls)-1]
}

// section is the report's table lines from the heading to the blank line.
func (r result) section(t *testing.T, heading string) []string {
	t.Helper()
	ls := lines(r.stdout)
	for i, l := range ls {
		if strings.HasPrefix(l, heading+" ") {
			var rows []string
			for _, row := range ls[i+1:] {
				if row == "" {
					return rows
				}
				rows = append(rows, row)
			}
			return rows
		}
	}
	t.Fatalf("no %q table in:\n%s", heading, r.stdout)
	return nil
}

// fixedClock returns start on its first call and start+wall on every later one.
func fixedClock(wall time.Duration) func() time.Time {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	calls := 0
	return func() time.Time {
		calls++
		if calls == 1 {
			return start
		}
		return start.Add(wall)
	}
}

func runReport(t *testing.T, input string, env map[string]string, wall time.Duration, args ...string) result {
	t.Helper()
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string { return env[k] }
	code := run(append([]string{"-out", dir}, args...), strings.NewReader(input), &stdout, &stderr, getenv, fixedClock(wall))
	return result{code: code, stdout: stdout.String(), stderr: stderr.String(), dir: dir}
}

func TestFixtureRun(t *testing.T) {
	fixture := readFixture(t)
	r := runReport(t, fixture, nil, 0)
	if r.code != 1 {
		t.Errorf("exit status %d, want 1 (bgp failed, broken did not build)", r.code)
	}
	if got, want := r.lastLine(), "8 passed, 2 failed, 3 skipped"; got != want {
		t.Errorf("closing line %q, want %q", got, want)
	}

	// Live: what plain go test prints, not the verbose log.
	for _, want := range []string{
		"ok  \tgithub.com/vipcast/vipcast/ipam\t",
		"ok  \tgithub.com/vipcast/vipcast/test/lab\t",
		"?   \tgithub.com/vipcast/vipcast/nodereport\t[no test files]",
		"FAIL\tgithub.com/vipcast/vipcast/bgp\t",
		"FAIL\tgithub.com/vipcast/vipcast/broken [build failed]",
		"broken/broken_test.go:5:40: cannot use \"s\" (untyped string constant) as int value",
		"--- FAIL: TestPeers (0.",
		"peer 192.0.2.1 up",
		"    --- FAIL: TestPeers/hold (0.",
		"        bgp_test.go:9: routes = 1, want 2",
		"--- FAIL: TestLogger (0.",
		"    bgp_test.go:11: own failure with no subtests",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	for _, unwanted := range []string{"=== RUN", "--- PASS", "--- SKIP", "session up after 3 keepalives", "cluster up", "10.0.0.0/24"} {
		if strings.Contains(r.stdout, unwanted) {
			t.Errorf("stdout shows %q, which only go test -v shows", unwanted)
		}
	}
	// The failing subtest comes before the test's own failure, in tree order.
	if i, j := strings.Index(r.stdout, "--- FAIL: TestPeers ("), strings.Index(r.stdout, "--- FAIL: TestPeers/hold ("); i < 0 || j < i {
		t.Errorf("TestPeers/hold is not printed under TestPeers:\n%s", r.stdout)
	}

	// Skips, the table, then the failure summary: last, where the tail of
	// a long log shows it.
	if i, j := strings.Index(r.stdout, "==== wall times"), strings.Index(r.stdout, "==== failure summary"); i < 0 || j < i {
		t.Errorf("the failure summary does not come after the table:\n%s", r.stdout)
	}
	for _, want := range []string{
		"==== failure summary",
		"--- FAIL: github.com/vipcast/vipcast/bgp TestPeers/hold (",
		"    bgp_test.go:9: routes = 1, want 2",
		"FAIL github.com/vipcast/vipcast/broken [build failed]",
		"SKIP ipam TestRanges/dualstack: ipam_test.go:9: dual stack needs a second family",
		"SKIP ipam TestNeedsRoot: ipam_test.go:11: needs root: network namespaces",
		"SKIP test/lab TestCluster/bfd: lab_test.go:12: no BFD peer in this lab",
		"FAIL: 2 test(s) of github.com/vipcast/vipcast/bgp failed",
		"FAIL: package github.com/vipcast/vipcast/broken failed to build",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("report lacks %q", want)
		}
	}

	pkgs := r.section(t, "package")
	if got := names(pkgs); strings.Join(got, " ") != "test/lab bgp ipam broken" {
		t.Errorf("packages %q, want test/lab bgp ipam broken (slowest first; nodereport has no tests)", got)
	}
	if !strings.Contains(pkgs[3], "build failed") {
		t.Errorf("broken's row %q does not say the build failed", pkgs[3])
	}
	scen := r.section(t, "lab scenario")
	if got := names(scen); strings.Join(got, " ") != "TestCluster TestCluster/nftables TestCluster/nftables/held TestCluster/lifecycle TestCluster/bfd TestEndToEnd" {
		t.Errorf("lab scenarios %q: want the top-level tests and two levels of subtests in run order", got)
	}
	if !strings.Contains(scen[0], "0.6s") || !strings.Contains(scen[1], "0.4s") {
		t.Errorf("scenario wall times: %q", scen)
	}
	slow := r.section(t, "slowest tests")
	if len(slow) != 10 {
		t.Fatalf("%d slowest tests, want 10: %q", len(slow), slow)
	}
	if !strings.HasPrefix(slow[0], "test/lab TestCluster ") || !strings.HasPrefix(slow[1], "test/lab TestCluster/nftables ") {
		t.Errorf("slowest tests start with %q, %q; want TestCluster, TestCluster/nftables", slow[0], slow[1])
	}
	for _, s := range slow {
		if !strings.Contains(s, " Test") {
			t.Errorf("slowest tests list a package aggregate: %q", s)
		}
	}
	if !strings.Contains(r.stdout, "\ntotal wall time: 1.0s (limit 1h00m00s)\n") {
		t.Errorf("no total (the span of the events, 1.0s) with the default limit in:\n%s", r.stdout)
	}

	// The files: the raw events, and the verbose log.
	raw, err := os.ReadFile(filepath.Join(r.dir, "test.json"))
	if err != nil {
		t.Fatal(err)
	}
	if string(raw) != fixture {
		t.Errorf("test.json differs from the events read")
	}
	log, err := os.ReadFile(filepath.Join(r.dir, "test.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"=== RUN   TestAllocate\n", "    bgp_test.go:8: session up after 3 keepalives\n", "--- SKIP: TestCluster/bfd", "broken/broken_test.go:5:32: declared and not used: x\n", "ok  \tgithub.com/vipcast/vipcast/test/lab\t"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("test.log lacks %q", want)
		}
	}
	// One package's lines stay together in the log although they interleave
	// in the stream.
	if i, j, k := strings.Index(string(log), "=== RUN   TestAllocate"), strings.Index(string(log), "=== RUN   TestRanges/ipv4"), strings.Index(string(log), "=== RUN   TestPeers/hold"); !(i < j && (k < i || k > j)) {
		t.Errorf("ipam's log lines are split by bgp's")
	}
}

// names is the first column of table rows.
func names(rows []string) []string {
	var out []string
	for _, r := range rows {
		if f := strings.Fields(r); len(f) > 0 {
			out = append(out, f[0])
		}
	}
	return out
}

func TestPassingRun(t *testing.T) {
	in := only(readFixture(t), "", "ipam", "nodereport", "test/lab")
	r := runReport(t, in, nil, 0)
	if r.code != 0 {
		t.Errorf("exit status %d, want 0:\n%s", r.code, r.stdout)
	}
	if got, want := r.lastLine(), "6 passed, 0 failed, 3 skipped"; got != want {
		t.Errorf("closing line %q, want %q", got, want)
	}
	if strings.Contains(r.stdout, "failure summary") || strings.Contains(r.stdout, "FAIL") {
		t.Errorf("a passing run reports a failure:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "SKIP test/lab TestCluster/bfd: lab_test.go:12: no BFD peer in this lab") {
		t.Errorf("a skipped test is not listed:\n%s", r.stdout)
	}
}

func TestNoSkipsNoSkippedCount(t *testing.T) {
	in := only(readFixture(t), "TestCluster/bfd", "test/lab")
	r := runReport(t, in, nil, 0, "-fail-on-skip")
	if r.code != 0 {
		t.Errorf("exit status %d, want 0:\n%s", r.code, r.stdout)
	}
	if got, want := r.lastLine(), "3 passed, 0 failed"; got != want {
		t.Errorf("closing line %q, want %q", got, want)
	}
}

func TestFailOnSkip(t *testing.T) {
	in := only(readFixture(t), "", "ipam", "test/lab")
	r := runReport(t, in, nil, 0, "-fail-on-skip")
	if r.code != 1 {
		t.Errorf("exit status %d, want 1: three tests skipped under -fail-on-skip", r.code)
	}
	for _, want := range []string{
		"FAIL: 3 test(s) skipped, and -fail-on-skip says nothing is skipped (CI=true)",
		"SKIP ipam TestNeedsRoot: ipam_test.go:11: needs root: network namespaces",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, r.stdout)
		}
	}
	if got, want := r.lastLine(), "6 passed, 0 failed, 3 skipped"; got != want {
		t.Errorf("closing line %q, want %q", got, want)
	}
}

func TestGuard(t *testing.T) {
	in := only(readFixture(t), "", "ipam", "test/lab")
	for _, tc := range []struct {
		name string
		env  map[string]string
		wall time.Duration
		args []string
		fail string // the guard's message, "" when it must not trip
	}{
		{name: "default limit, 59m", wall: 59 * time.Minute},
		{name: "default limit, 61m", wall: 61 * time.Minute, fail: "FAIL: the run took 1h01m00s, over the limit of 1h00m00s (-max-total, TEST_MAX_TOTAL)"},
		{name: "flag", args: []string{"-max-total", "500ms"}, fail: "FAIL: the run took 0.8s, over the limit of 0.5s"},
		{name: "env", env: map[string]string{"TEST_MAX_TOTAL": "20m"}, wall: 25 * time.Minute, fail: "FAIL: the run took 25m00s, over the limit of 20m00s"},
		{name: "flag over env", env: map[string]string{"TEST_MAX_TOTAL": "20m"}, wall: 25 * time.Minute, args: []string{"-max-total", "30m"}},
		{name: "no guard", wall: 5 * time.Hour, args: []string{"-max-total", "0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runReport(t, in, tc.env, tc.wall, tc.args...)
			if tc.fail == "" {
				if r.code != 0 || strings.Contains(r.stdout, "over the limit") {
					t.Errorf("exit status %d; the guard tripped:\n%s", r.code, r.stdout)
				}
				return
			}
			if r.code != 1 {
				t.Errorf("exit status %d, want 1", r.code)
			}
			if !strings.Contains(r.stdout, tc.fail) {
				t.Errorf("report lacks %q:\n%s", tc.fail, r.stdout)
			}
			if got, want := r.lastLine(), "6 passed, 0 failed, 3 skipped"; got != want {
				t.Errorf("closing line %q, want %q", got, want)
			}
		})
	}
}

func TestBadTestMaxTotal(t *testing.T) {
	r := runReport(t, "", map[string]string{"TEST_MAX_TOTAL": "an hour"}, 0)
	if r.code != 2 || !strings.Contains(r.stderr, "TEST_MAX_TOTAL") {
		t.Errorf("exit status %d, stderr %q; want 2 and a word on TEST_MAX_TOTAL", r.code, r.stderr)
	}
}

// stream writes events as go test -json would, one second apart.
func stream(events ...event) string {
	var b strings.Builder
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, e := range events {
		e.Time = at.Add(time.Duration(i) * time.Second)
		l, err := json.Marshal(e)
		if err != nil {
			panic(err)
		}
		b.Write(l)
		b.WriteByte('\n')
	}
	return b.String()
}

// A subtest whose name holds a slash is not a grandchild of a test that
// never ran.
func TestSlashInSubtestName(t *testing.T) {
	const p = "github.com/vipcast/vipcast/test/lab"
	in := stream(
		event{Action: "start", Package: p},
		event{Action: "run", Package: p, Test: "TestParse"},
		event{Action: "run", Package: p, Test: "TestParse/v4_/0"},
		event{Action: "pass", Package: p, Test: "TestParse/v4_/0"},
		event{Action: "run", Package: p, Test: "TestParse/v4_/32"},
		event{Action: "pass", Package: p, Test: "TestParse/v4_/32"},
		event{Action: "pass", Package: p, Test: "TestParse", Elapsed: 2},
		event{Action: "pass", Package: p, Elapsed: 3},
	)
	r := runReport(t, in, nil, 0)
	if r.code != 0 {
		t.Errorf("exit status %d, want 0:\n%s", r.code, r.stdout)
	}
	if got, want := r.lastLine(), "2 passed, 0 failed"; got != want {
		t.Errorf("closing line %q, want %q", got, want)
	}
	if got := names(r.section(t, "lab scenario")); strings.Join(got, " ") != "TestParse TestParse/v4_/0 TestParse/v4_/32" {
		t.Errorf("lab scenarios %q: want TestParse and its two subtests", got)
	}
}

func TestTimeoutPanic(t *testing.T) {
	const p = "github.com/vipcast/vipcast/ipvs"
	in := stream(
		event{Action: "start", Package: p},
		event{Action: "run", Package: p, Test: "TestSlow"},
		event{Action: "run", Package: p, Test: "TestSlow/sub"},
		event{Action: "output", Package: p, Test: "TestSlow/sub", Output: "    ipvs_test.go:5: waiting\n"},
		event{Action: "output", Package: p, Test: "TestSlow/sub", Output: "panic: test timed out after 2s\n"},
		event{Action: "output", Package: p, Output: "FAIL\tgithub.com/vipcast/vipcast/ipvs\t2.104s\n"},
		event{Action: "fail", Package: p, Elapsed: 2.104},
	)
	r := runReport(t, in, nil, 0)
	if r.code != 1 {
		t.Errorf("exit status %d, want 1", r.code)
	}
	for _, want := range []string{
		"--- FAIL: TestSlow (did not finish)",
		"    --- FAIL: TestSlow/sub (did not finish)",
		"panic: test timed out after 2s",
		"FAIL\tgithub.com/vipcast/vipcast/ipvs\t2.104s",
		"--- FAIL: github.com/vipcast/vipcast/ipvs TestSlow/sub (did not finish)",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, r.stdout)
		}
	}
	if got, want := r.lastLine(), "0 passed, 1 failed"; got != want {
		t.Errorf("closing line %q, want %q", got, want)
	}
}

// A subtest's panic shows in the output of its top-level test, after the
// subtest failed; the failure summary quotes it for the subtest.
func TestSubtestPanic(t *testing.T) {
	const p = "github.com/vipcast/vipcast/ccm"
	in := stream(
		event{Action: "start", Package: p},
		event{Action: "run", Package: p, Test: "TestPanic"},
		event{Action: "run", Package: p, Test: "TestPanic/deep"},
		event{Action: "output", Package: p, Test: "TestPanic/deep", Output: "--- FAIL: TestPanic/deep (0.00s)\n"},
		event{Action: "fail", Package: p, Test: "TestPanic/deep"},
		event{Action: "output", Package: p, Test: "TestPanic", Output: "--- FAIL: TestPanic (0.00s)\n"},
		event{Action: "output", Package: p, Test: "TestPanic", Output: "panic: assignment to entry in nil map [recovered, repanicked]\n"},
		event{Action: "output", Package: p, Test: "TestPanic", Output: "\tp_test.go:6 +0x28\n"},
		event{Action: "fail", Package: p, Test: "TestPanic"},
		event{Action: "output", Package: p, Output: "FAIL\tgithub.com/vipcast/vipcast/ccm\t0.080s\n"},
		event{Action: "fail", Package: p, Elapsed: 0.08},
	)
	r := runReport(t, in, nil, 0)
	if r.code != 1 {
		t.Errorf("exit status %d, want 1", r.code)
	}
	want := "--- FAIL: github.com/vipcast/vipcast/ccm TestPanic/deep (0.0s)\n    panic: assignment to entry in nil map [recovered, repanicked]\n"
	if !strings.Contains(r.stdout, want) {
		t.Errorf("report lacks %q:\n%s", want, r.stdout)
	}
	if got, want := r.lastLine(), "0 passed, 1 failed"; got != want {
		t.Errorf("closing line %q, want %q", got, want)
	}
}

func TestPackageFailsWithoutFailingTest(t *testing.T) {
	const p = "github.com/vipcast/vipcast/speaker"
	in := stream(
		event{Action: "start", Package: p},
		event{Action: "run", Package: p, Test: "TestOK"},
		event{Action: "pass", Package: p, Test: "TestOK"},
		event{Action: "output", Package: p, Output: "PASS\n"},
		event{Action: "output", Package: p, Output: "teardown: leaked namespace\n"},
		event{Action: "output", Package: p, Output: "FAIL\tgithub.com/vipcast/vipcast/speaker\t0.012s\n"},
		event{Action: "fail", Package: p, Elapsed: 0.012},
	)
	r := runReport(t, in, nil, 0)
	if r.code != 1 {
		t.Errorf("exit status %d, want 1", r.code)
	}
	for _, want := range []string{"teardown: leaked namespace", "FAIL: package github.com/vipcast/vipcast/speaker failed without a failing test"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, r.stdout)
		}
	}
	if got, want := r.lastLine(), "1 passed, 0 failed"; got != want {
		t.Errorf("closing line %q, want %q", got, want)
	}
}

func TestStreamCutShort(t *testing.T) {
	const p = "github.com/vipcast/vipcast/test/lab"
	in := stream(
		event{Action: "start", Package: p},
		event{Action: "run", Package: p, Test: "TestCluster"},
		event{Action: "run", Package: p, Test: "TestCluster/nftables"},
		event{Action: "pass", Package: p, Test: "TestCluster/nftables", Elapsed: 1},
		event{Action: "run", Package: p, Test: "TestCluster/lifecycle"},
	)
	r := runReport(t, in, nil, 0)
	if r.code != 1 {
		t.Errorf("exit status %d, want 1", r.code)
	}
	for _, want := range []string{"FAIL\tgithub.com/vipcast/vipcast/test/lab [did not finish]", "FAIL: package github.com/vipcast/vipcast/test/lab did not finish"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, r.stdout)
		}
	}
	scen := r.section(t, "lab scenario")
	if len(scen) != 3 || !strings.Contains(scen[2], "TestCluster/lifecycle") || !strings.Contains(scen[2], "did not finish") {
		t.Errorf("lab scenarios %q: want lifecycle marked as unfinished", scen)
	}
}

func TestNotJSON(t *testing.T) {
	r := runReport(t, "go: updates to go.mod needed; to update it:\n\tgo mod tidy\n", nil, 0)
	if r.code != 1 {
		t.Errorf("exit status %d, want 1", r.code)
	}
	for _, want := range []string{"go: updates to go.mod needed", "FAIL: go test reported no package"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("report lacks %q:\n%s", want, r.stdout)
		}
	}
	if got, want := r.lastLine(), "0 passed, 0 failed"; got != want {
		t.Errorf("closing line %q, want %q", got, want)
	}
}

func TestFmtDur(t *testing.T) {
	for d, want := range map[time.Duration]string{
		400 * time.Millisecond:                    "0.4s",
		12300 * time.Millisecond:                  "12.3s",
		4*time.Minute + 7*time.Second:             "4m07s",
		time.Hour + 2*time.Minute + 3*time.Second: "1h02m03s",
	} {
		if got := fmtDur(d); got != want {
			t.Errorf("fmtDur(%v) = %q, want %q", d, got, want)
		}
	}
}
