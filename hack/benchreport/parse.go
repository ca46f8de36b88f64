package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// outputs is what the outputs of one `make bench` hold.
type outputs struct {
	benches map[string]*benchmark // by top-level name, such as BenchmarkAllocate
	tests   map[string]*trialTest // by name, such as TestSpeakerFabricBFD
	// The headers go test prints, each value with the first file that
	// printed it: one value each in a run of one machine.
	goos, goarch, cpu, procs headerValues
}

// benchmark is one top-level benchmark function's results.
type benchmark struct {
	name    string // such as BenchmarkAllocate
	pkg     string // its import path (the pkg: header)
	file    string // the output file it came from
	results []result
	// printed is what the benchmark printed besides its results: the
	// e2e benchmarks' "BENCH ..." lines, the guests' "bench: ..." lines
	// and the VM's "vm: kernel ..." line.
	printed []string
	skipped string // the reason, when go test -v reports it skipped
}

// result is one result line: the benchmark itself or one sub-benchmark.
type result struct {
	sub     string // the sub-benchmark's path, "" for the benchmark itself
	iters   int
	metrics []metric
	where   string // file:line
}

// metric is one value and its unit, such as 664.0 ns/op.
type metric struct {
	text  string // the value as printed
	value float64
	unit  string
}

// trialTest is a test whose log lines about frozen speakers make bench
// keeps (TestSpeakerFabric, TestSpeakerFabricBFD, go test -v).
type trialTest struct {
	name    string
	file    string
	passed  bool
	skipped string
	lines   []string
}

// headerValues are the distinct values of one header, in order, each
// with the file that printed it first.
type headerValues struct {
	values []string
	files  []string
}

func (h *headerValues) add(value, file string) {
	if slices.Contains(h.values, value) {
		return
	}
	h.values = append(h.values, value)
	h.files = append(h.files, file)
}

// one is the header's single value ("" when no file printed it), or an
// error naming the files that disagree.
func (h *headerValues) one(header string) (string, error) {
	switch len(h.values) {
	case 0:
		return "", nil
	case 1:
		return h.values[0], nil
	}
	var seen []string
	for i, v := range h.values {
		seen = append(seen, fmt.Sprintf("%q in %s", v, h.files[i]))
	}
	return "", fmt.Errorf("the outputs disagree on %s: %s (one run of one machine has one)", header, strings.Join(seen, ", "))
}

var (
	// benchName is a result line's name, GOMAXPROCS suffix included.
	benchName = regexp.MustCompile(`^Benchmark[^a-z\s]\S*`)
	// procsSuffix is the -N go test adds to a name when GOMAXPROCS > 1.
	procsSuffix = regexp.MustCompile(`-(\d+)$`)
	// continuation is the rest of a result line whose name was printed
	// on an earlier line: "       1\t123 ns/op ...".
	continuation = regexp.MustCompile(`^\s*\d+\s`)
	// testEvent is go test -v's "=== RUN   TestX/sub" and its kin.
	testEvent = regexp.MustCompile(`^=== (RUN|CONT|NAME|PAUSE)\s+(\S+)`)
	// testEnd is a top-level test's or benchmark's end line.
	testEnd = regexp.MustCompile(`^--- (PASS|SKIP|BENCH): (\S+)`)
	// testLog is a t.Logf line: "    bfd_test.go:68: message".
	testLog = regexp.MustCompile(`^\s+[\w.-]+\.go:\d+: `)
	// failed is go test's report of a failure, at any depth.
	failed = regexp.MustCompile(`^\s*--- FAIL: (\S+)|^FAIL(\s|$)`)
)

// isTrialLine reports whether a log line of TestSpeakerFabric or
// TestSpeakerFabricBFD is a trial's: a frozen (SIGSTOP) speaker leaving
// the ToR's route, and, thawed, coming back.
func isTrialLine(l string) bool {
	return strings.Contains(l, "frozen") || strings.Contains(l, "SIGSTOP") || strings.Contains(l, "thawed")
}

// parser reads one output file.
type parser struct {
	r       *outputs
	file    string
	n       int // the line number
	pkg     string
	pending string   // a benchmark name printed, its result not yet
	printed []string // printed lines not yet given to a benchmark
	test    string   // the test go test -v runs now
	block   *block   // a --- BENCH or --- SKIP block being read
	errs    []error
}

// block is a "--- BENCH: name" or "--- SKIP: name" header and the
// indented log lines after it.
type block struct {
	kind, name string
	reason     bool // a SKIP block's reason read: its first line
}

func newOutputs() *outputs {
	return &outputs{benches: map[string]*benchmark{}, tests: map[string]*trialTest{}}
}

// parseFile adds the output file name, read from in, to r. It reports
// every malformed line, failure and unfinished result it finds.
func (r *outputs) parseFile(name string, in io.Reader) error {
	p := &parser{r: r, file: name}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		p.n++
		p.line(strings.TrimRight(sc.Text(), "\r"))
	}
	if err := sc.Err(); err != nil {
		p.errs = append(p.errs, fmt.Errorf("read %s: %w", name, err))
	}
	p.finish()
	return errors.Join(p.errs...)
}

func (p *parser) where() string { return fmt.Sprintf("%s:%d", p.file, p.n) }

func (p *parser) errorf(format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: "+format, append([]any{p.where()}, args...)...))
}

// line reads one line of output.
func (p *parser) line(l string) {
	if p.block != nil {
		if strings.HasPrefix(l, "    ") {
			p.blockLine(l)
			return
		}
		p.block = nil
	}
	switch {
	case p.header(l):
	case failed.MatchString(l):
		p.errorf("go test reports a failure: %q (make bench stops there: rerun it)", l)
	case testEnd.MatchString(l):
		m := testEnd.FindStringSubmatch(l)
		p.end(m[1], m[2])
	case testEvent.MatchString(l):
		p.testEvent(testEvent.FindStringSubmatch(l)[2])
	case benchName.MatchString(l):
		p.resultLine(l)
	case p.pending != "" && continuation.MatchString(l):
		name := p.pending
		p.pending = ""
		p.result(name, l)
	default:
		p.other(l)
	}
}

// header reads goos:, goarch:, pkg: and cpu:.
func (p *parser) header(l string) bool {
	key, value, ok := strings.Cut(l, ": ")
	if !ok {
		return false
	}
	value = strings.TrimSpace(value)
	switch key {
	case "goos":
		p.r.goos.add(value, p.file)
	case "goarch":
		p.r.goarch.add(value, p.file)
	case "cpu":
		p.r.cpu.add(value, p.file)
	case "pkg":
		p.pkg = value
	default:
		return false
	}
	return true
}

// testEvent follows go test -v to the test whose log lines come next.
func (p *parser) testEvent(name string) {
	top, _, _ := strings.Cut(name, "/")
	if !strings.HasPrefix(top, "Test") {
		return
	}
	p.test = top
	if p.r.tests[top] == nil {
		p.r.tests[top] = &trialTest{name: top, file: p.file}
	} else if t := p.r.tests[top]; t.file != p.file {
		p.errorf("%s runs in both %s and %s", top, t.file, p.file)
	}
}

// end reads "--- PASS: TestX (1.2s)", "--- SKIP: X" and "--- BENCH: X".
func (p *parser) end(kind, name string) {
	switch {
	case kind == "BENCH" || kind == "SKIP":
		p.block = &block{kind: kind, name: name}
	case kind == "PASS" && p.r.tests[name] != nil:
		p.r.tests[name].passed = true
	}
}

// blockLine reads an indented log line of a --- BENCH or --- SKIP block.
func (p *parser) blockLine(l string) {
	msg := strings.TrimSpace(testLog.ReplaceAllString(l, ""))
	if p.block.kind == "SKIP" {
		if !p.block.reason {
			p.skip(p.block.name, msg)
			p.block.reason = true
		}
		return
	}
	if p.block.kind != "BENCH" || !strings.HasPrefix(msg, "vm: kernel ") {
		return
	}
	top, _ := splitName(p.block.name)
	if b := p.r.benches[top]; b != nil {
		b.printed = append(b.printed, msg)
	}
}

// skip records that test or benchmark name skipped, for reason.
func (p *parser) skip(name, reason string) {
	if strings.HasPrefix(name, "Test") {
		if t := p.r.tests[name]; t != nil {
			t.skipped = reason
		}
		return
	}
	top, _ := splitName(name)
	b, err := p.benchmark(top)
	if err != nil {
		p.errs = append(p.errs, err)
		return
	}
	b.skipped = reason
}

// resultLine reads a line that starts with a benchmark's name: its
// result, or only its name when the benchmark printed something before
// its result (the rest of the line, and the lines up to the result, are
// its prints).
func (p *parser) resultLine(l string) {
	name := benchName.FindString(l)
	rest := strings.TrimSpace(l[len(name):])
	if p.pending != "" {
		p.errorf("%s has no result before %s", p.pending, name)
		p.pending = ""
	}
	if f := strings.Fields(rest); len(f) > 0 {
		if _, err := strconv.Atoi(f[0]); err == nil {
			p.result(name, rest)
			return
		}
	}
	p.pending = name
	if rest != "" {
		p.line(rest)
	}
}

// result records the result line of name whose fields (iterations, then
// value and unit pairs) are rest.
func (p *parser) result(name, rest string) {
	res, err := parseResult(rest)
	if err != nil {
		p.errorf("malformed result line of %s: %v: %q", name, err, rest)
		return
	}
	res.where = p.where()
	top, sub := splitName(name)
	if m := procsSuffix.FindStringSubmatch(name); m != nil {
		p.r.procs.add(m[1], p.file)
	} else {
		p.r.procs.add("1", p.file)
	}
	res.sub = sub
	b, err := p.benchmark(top)
	if err != nil {
		p.errs = append(p.errs, err)
		return
	}
	for _, o := range b.results {
		if o.sub == sub {
			p.errorf("a second result of %s (the first at %s)", strings.TrimSuffix(top+"/"+sub, "/"), o.where)
			return
		}
	}
	b.results = append(b.results, res)
	b.printed = append(b.printed, p.printed...)
	p.printed = nil
}

// benchmark is top's record, made on its first result; one benchmark
// comes from one package and one file.
func (p *parser) benchmark(top string) (*benchmark, error) {
	b := p.r.benches[top]
	if b == nil {
		b = &benchmark{name: top, pkg: p.pkg, file: p.file}
		p.r.benches[top] = b
		return b, nil
	}
	if b.file != p.file || b.pkg != p.pkg {
		return nil, fmt.Errorf("%s: %s is also in %s (package %s): a benchmark name must be unique across the outputs", p.where(), top, b.file, b.pkg)
	}
	return b, nil
}

// other keeps the lines a benchmark prints for the page, and the trial
// lines of the test running.
func (p *parser) other(l string) {
	switch {
	case strings.HasPrefix(l, "BENCH "):
		p.printed = append(p.printed, l)
	case strings.HasPrefix(l, "bench: "), strings.HasPrefix(l, "vm| bench: "):
		p.printed = append(p.printed, strings.TrimPrefix(l, "vm| "))
	case p.test != "" && testLog.MatchString(l) && isTrialLine(l):
		t := p.r.tests[p.test]
		t.lines = append(t.lines, strings.TrimSpace(l))
	case strings.HasPrefix(l, "ok  \t") || l == "PASS":
		// The end of a package: what it printed after its last result
		// belongs to none.
		p.printed = nil
		p.test = ""
	}
}

// finish reports what the file left unfinished.
func (p *parser) finish() {
	if p.pending != "" {
		p.errorf("%s has no result: the output ends before it", p.pending)
	}
	for _, name := range slices.Sorted(maps.Keys(p.r.tests)) {
		if t := p.r.tests[name]; t.file == p.file && !t.passed && t.skipped == "" {
			p.errs = append(p.errs, fmt.Errorf("%s: %s started but did not pass: the output ends before it", p.file, name))
		}
	}
}

// parseResult reads "iterations value unit value unit ...".
func parseResult(fields string) (result, error) {
	f := strings.Fields(fields)
	if len(f) < 3 || len(f)%2 == 0 {
		return result{}, errors.New("want the iterations and pairs of value and unit")
	}
	iters, err := strconv.Atoi(f[0])
	if err != nil || iters < 1 {
		return result{}, fmt.Errorf("iterations %q are not a positive count", f[0])
	}
	res := result{iters: iters}
	for i := 1; i < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return result{}, fmt.Errorf("value %q of %s is not a number", f[i], f[i+1])
		}
		for _, m := range res.metrics {
			if m.unit == f[i+1] {
				return result{}, fmt.Errorf("unit %s twice", m.unit)
			}
		}
		res.metrics = append(res.metrics, metric{text: f[i], value: v, unit: f[i+1]})
	}
	return res, nil
}

// splitName splits "BenchmarkX/sub/more-2" into "BenchmarkX" and
// "sub/more", without the GOMAXPROCS suffix.
func splitName(name string) (top, sub string) {
	name = procsSuffix.ReplaceAllString(name, "")
	top, sub, _ = strings.Cut(name, "/")
	return top, sub
}
