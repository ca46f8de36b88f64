package main

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// testdata/run holds one make bench's outputs, real (this machine), but
// for bench-scale.txt: the real one with the two metrics per N that
// BenchmarkScale reports since (testdata/errors/bench-scale.txt is the
// real one, without them).

// parseRun parses the named files of testdata/run, and extra files of
// other directories given by path.
func parseRun(t *testing.T, names ...string) (*outputs, error) {
	t.Helper()
	r := newOutputs()
	var errs []error
	for _, n := range names {
		path := n
		if !strings.Contains(n, "/") {
			path = filepath.Join("testdata", "run", n)
		}
		errs = append(errs, parsePath(r, path))
	}
	return r, errors.Join(errs...)
}

// runFiles are testdata/run's files.
func runFiles(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join("testdata", "run", "bench-*.txt"))
	if err != nil || len(m) == 0 {
		t.Fatalf("testdata/run: %v, %d files", err, len(m))
	}
	var names []string
	for _, p := range m {
		names = append(names, filepath.Base(p))
	}
	return names
}

func TestParseRun(t *testing.T) {
	r, err := parseRun(t, runFiles(t)...)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"BenchmarkAllocate", "BenchmarkAnnounce10k", "BenchmarkCCMAllocation", "BenchmarkDiff", "BenchmarkDiffService",
		"BenchmarkGuestCopy", "BenchmarkHolders", "BenchmarkKernelDataplane", "BenchmarkMemory", "BenchmarkReceive",
		"BenchmarkRelayCheck", "BenchmarkRelease", "BenchmarkScale", "BenchmarkServiceDataplane", "BenchmarkServiceRoutes",
		"BenchmarkShareManyPorts", "BenchmarkSpeakerAnnounce", "BenchmarkSpeakerStatus10k", "BenchmarkTimersUnderLoad",
		"BenchmarkTwoTier", "BenchmarkTwoTierEndpoints"}
	if got := slices.Sorted(maps.Keys(r.benches)); !reflect.DeepEqual(got, want) {
		t.Errorf("benchmarks:\n got %q\nwant %q", got, want)
	}
	if got := slices.Sorted(maps.Keys(r.tests)); !reflect.DeepEqual(got, []string{"TestSpeakerFabric", "TestSpeakerFabricBFD"}) {
		t.Errorf("tests: %q", got)
	}
	for h, want := range map[string]struct {
		v    headerValues
		want string
	}{"cpu": {r.cpu, "AMD EPYC"}, "goos": {r.goos, "linux"}, "goarch": {r.goarch, "amd64"}, "procs": {r.procs, "2"}} {
		if got, err := want.v.one(h); err != nil || got != want.want {
			t.Errorf("%s: %q, %v; want %q", h, got, err, want.want)
		}
	}
	if b := r.benches["BenchmarkTwoTierEndpoints"]; b.pkg != "github.com/vipcast/vipcast/ipvs" || len(b.printed) != 4 || !strings.HasPrefix(b.printed[3], "vm: kernel ") {
		t.Errorf("BenchmarkTwoTierEndpoints: package %s, printed %q", b.pkg, b.printed)
	}
	if b := r.benches["BenchmarkTimersUnderLoad"]; len(b.results) != 3 || len(b.printed) != 0 {
		t.Errorf("BenchmarkTimersUnderLoad: %d results, printed %q (its log is not kept)", len(b.results), b.printed)
	}
	if b := r.benches["BenchmarkAnnounce10k"]; len(b.printed) != 0 || b.results[0].iters != 3 {
		t.Errorf("BenchmarkAnnounce10k: printed %q (gobgp's log is not kept), %d iterations", b.printed, b.results[0].iters)
	}
}

func mapKeys[V any](m map[string]V) []string { return slices.Collect(maps.Keys(m)) }

// one parses a single output given as text.
func one(t *testing.T, text string) (*outputs, error) {
	t.Helper()
	r := newOutputs()
	return r, r.parseFile("out.txt", strings.NewReader(text))
}

func TestParseLines(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		bench    string
		results  []result
		printed  []string
	}{{
		name:    "a result line",
		in:      "pkg: p\nBenchmarkX-2   \t     100\t  12.5 ns/op\t  3 B/op\n",
		bench:   "BenchmarkX",
		results: []result{{iters: 100, metrics: []metric{{"12.5", 12.5, "ns/op"}, {"3", 3, "B/op"}}, where: "out.txt:2"}},
	}, {
		name:    "sub-benchmarks, the GOMAXPROCS suffix gone",
		in:      "BenchmarkX/a/b=1-8 \t 1\t 2 ns/op\nBenchmarkX/c-8 \t 1\t 3 ns/op\n",
		bench:   "BenchmarkX",
		results: []result{{sub: "a/b=1", iters: 1, metrics: []metric{{"2", 2, "ns/op"}}, where: "out.txt:1"}, {sub: "c", iters: 1, metrics: []metric{{"3", 3, "ns/op"}}, where: "out.txt:2"}},
	}, {
		name:    "BENCH lines before the result are its prints",
		in:      "BENCH one: 1s\nI1201 a log line\nBENCH two: 2s\ngoos: linux\nBenchmarkX-2 \t 1\t 5 ns/op\t 1.5 s-total\nBENCH after: not X's\nPASS\n",
		bench:   "BenchmarkX",
		results: []result{{iters: 1, metrics: []metric{{"5", 5, "ns/op"}, {"1.5", 1.5, "s-total"}}, where: "out.txt:5"}},
		printed: []string{"BENCH one: 1s", "BENCH two: 2s"},
	}, {
		name:    "the name, then prints, then the result",
		in:      "BenchmarkX-2   \tBENCH inside: 1s\nsome log\n       3\t 7 ns/op\n",
		bench:   "BenchmarkX",
		results: []result{{iters: 3, metrics: []metric{{"7", 7, "ns/op"}}, where: "out.txt:3"}},
		printed: []string{"BENCH inside: 1s"},
	}, {
		name: "a guest's bench lines and the VM's kernel, not its other log lines",
		in: "vm| bench: Sync 1s\nvm| BenchmarkX-2 \t 1\t 9 ns/op\nBenchmarkX-2 \t 1\t 10 ns/op\t 1 sync-s\n" +
			"--- BENCH: BenchmarkX-2\n    vm.go:741: vm: kernel 6.12 (x, tcg), boot 1s\n    vm.go:735: vm| guest copy\n    other.go:1: published\nPASS\n",
		bench:   "BenchmarkX",
		results: []result{{iters: 1, metrics: []metric{{"10", 10, "ns/op"}, {"1", 1, "sync-s"}}, where: "out.txt:3"}},
		printed: []string{"bench: Sync 1s", "vm: kernel 6.12 (x, tcg), boot 1s"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := one(t, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			b := r.benches[tc.bench]
			if b == nil {
				t.Fatalf("no %s in %q", tc.bench, mapKeys(r.benches))
			}
			if !reflect.DeepEqual(b.results, tc.results) {
				t.Errorf("results:\n got %+v\nwant %+v", b.results, tc.results)
			}
			if !reflect.DeepEqual(b.printed, tc.printed) {
				t.Errorf("printed:\n got %q\nwant %q", b.printed, tc.printed)
			}
		})
	}
}

func TestParseTrials(t *testing.T) {
	r, err := parseRun(t, "bench-bfd.txt")
	if err != nil {
		t.Fatal(err)
	}
	bfd := r.tests["TestSpeakerFabricBFD"]
	if len(bfd.lines) != 2 || !strings.Contains(bfd.lines[0], "frozen (SIGSTOP)") || !strings.Contains(bfd.lines[1], "thawed") {
		t.Errorf("TestSpeakerFabricBFD's trial lines: %q", bfd.lines)
	}
	if f := r.tests["TestSpeakerFabric"]; len(f.lines) != 1 || !strings.HasPrefix(f.lines[0], "fabric_test.go:213: SIGSTOP") {
		t.Errorf("TestSpeakerFabric's trial lines: %q (the SIGTERM line is not a trial)", f.lines)
	}
}

func TestParseSkip(t *testing.T) {
	r, err := one(t, "--- SKIP: BenchmarkGuestCopy\n    copy_bench_test.go:76: TCGCPU applies under TCG only; accel is kvm\n    more\nPASS\n")
	if err != nil {
		t.Fatal(err)
	}
	if b := r.benches["BenchmarkGuestCopy"]; b == nil || b.skipped != "TCGCPU applies under TCG only; accel is kvm" {
		t.Errorf("skipped: %+v", b)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"a value without its unit", "BenchmarkX-2 \t 1\t 12 ns/op\t 3\n", `out.txt:1: malformed result line of BenchmarkX-2: want the iterations and pairs of value and unit: "1\t 12 ns/op\t 3"`},
		{"a value that is no number", "BenchmarkX-2 \t 1\t 12 ns/op\t many B/op\n", `value "many" of B/op is not a number`},
		{"no iterations", "BenchmarkX-2 \t 0\t 12 ns/op\n", `iterations "0" are not a positive count`},
		{"a unit twice", "BenchmarkX-2 \t 1\t 12 ns/op\t 13 ns/op\n", "unit ns/op twice"},
		{"a continuation that is no result", "BenchmarkX-2 \t\n  1 thing\n", "out.txt:2: malformed result line of BenchmarkX-2"},
		{"a name without its result", "BenchmarkX-2 \t\nPASS\n", "out.txt:2: BenchmarkX-2 has no result: the output ends before it"},
		{"a name, then another", "BenchmarkX-2 \t\nBenchmarkY-2 \t 1\t 1 ns/op\n", "out.txt:2: BenchmarkX-2 has no result before BenchmarkY-2"},
		{"two results of one benchmark", "BenchmarkX/a-2 \t 1\t 1 ns/op\nBenchmarkX/a-2 \t 1\t 1 ns/op\n", "out.txt:2: a second result of BenchmarkX/a (the first at out.txt:1)"},
		{"a failed benchmark", "BenchmarkX-2 \t--- FAIL: BenchmarkX-2\n    x_test.go:1: boom\nFAIL\n", `out.txt:1: go test reports a failure: "--- FAIL: BenchmarkX-2"`},
		{"a failed subtest", "=== RUN   TestA\n    --- FAIL: TestA/b (0.1s)\n", `out.txt:2: go test reports a failure: "    --- FAIL: TestA/b (0.1s)"`},
		{"a test cut short", "=== RUN   TestA\n    a_test.go:1: node2's speaker frozen\n", "out.txt: TestA started but did not pass"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := one(t, tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseMalformedFixture(t *testing.T) {
	_, err := parseRun(t, filepath.Join("testdata", "errors", "bench-malformed.txt"))
	want := `testdata/errors/bench-malformed.txt:6: malformed result line of BenchmarkAllocate/v4-slash16-fill50pct-2: value "791.1.0" of ns/op is not a number`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v, want one containing %q", err, want)
	}
}

func TestParseTwoFilesOneBenchmark(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join("testdata", "run", "bench-bgp.txt"))
	if err != nil {
		t.Fatal(err)
	}
	again := filepath.Join(dir, "bench-again.txt")
	if err := os.WriteFile(again, data, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = parseRun(t, "bench-bgp.txt", again)
	if err == nil || !strings.Contains(err.Error(), "BenchmarkAnnounce10k is also in testdata/run/bench-bgp.txt") {
		t.Errorf("error %v, want BenchmarkAnnounce10k in two files", err)
	}
}
