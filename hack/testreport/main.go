// Command testreport reads the event stream of `go test -json` on its
// standard input and turns it into what `make test` shows and keeps.
//
// While the tests run it prints what plain `go test ./...` prints: one line
// per package (ok, FAIL, no test files), each failing test with its output,
// and build errors. It writes the raw events to OUT/test.json and the verbose
// log (what `go test -v` shows) to OUT/test.log.
//
// At the end it prints a summary of the failures, every skipped test with its
// reason, and a table of wall times: each package, each lab scenario (the
// top-level tests of the lab package and their first-level subtests), the
// total, and the ten slowest tests. The last line counts the tests that have
// no subtests: "N passed, N failed", with ", N skipped" when any skipped.
//
// It exits non-zero when a package or a test failed, when a package failed to
// build, when a package did not finish, when the run took longer than
// -max-total (a guard against a suite that only grows), and with -fail-on-skip
// when a test skipped.
//
// Usage:
//
//	go test -json ./... 2>&1 | testreport [-out DIR] [-max-total 60m] [-fail-on-skip]
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// defaultMaxTotal is the guard on the whole run unless -max-total or
// TEST_MAX_TOTAL says otherwise.
const defaultMaxTotal = 60 * time.Minute

// maxSummaryLines bounds the lines the failure summary quotes per failure.
const maxSummaryLines = 30

// maxLineLen bounds the length of a quoted line in the failure summary.
const maxLineLen = 300

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv, time.Now))
}

// config is what the flags set.
type config struct {
	outDir     string
	maxTotal   time.Duration
	failOnSkip bool
	labPkg     string
	trim       string
}

// parseFlags reads the command line; TEST_MAX_TOTAL sets the default guard.
func parseFlags(args []string, stderr io.Writer, getenv func(string) string) (config, error) {
	def := defaultMaxTotal
	if v := getenv("TEST_MAX_TOTAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return config{}, fmt.Errorf("TEST_MAX_TOTAL=%q: %w", v, err)
		}
		def = d
	}
	var c config
	fs := flag.NewFlagSet("testreport", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.outDir, "out", "_output", "directory for test.json and test.log (empty: write neither)")
	fs.DurationVar(&c.maxTotal, "max-total", def, "fail the run when its total wall time passes this (default from TEST_MAX_TOTAL, else 60m; 0: no guard)")
	fs.BoolVar(&c.failOnSkip, "fail-on-skip", false, "fail the run when any test skipped (CI: nothing is skipped)")
	fs.StringVar(&c.labPkg, "lab", "github.com/vipcast/vipcast/test/lab", "package whose top-level tests and first-level subtests are the lab scenarios")
	fs.StringVar(&c.trim, "trim", "github.com/vipcast/vipcast/", "prefix left out of package names in the table")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q: testreport reads go test -json on its standard input", fs.Args())
	}
	return c, nil
}

// run is main without the process: it returns the exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string, now func() time.Time) int {
	c, err := parseFlags(args, stderr, getenv)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "testreport:", err)
		}
		return 2
	}
	start := now()
	var rawOut, logOut io.Writer = io.Discard, io.Discard
	if c.outDir != "" {
		if err := os.MkdirAll(c.outDir, 0o755); err != nil {
			fmt.Fprintln(stderr, "testreport:", err)
			return 2
		}
		jf, err := os.Create(filepath.Join(c.outDir, "test.json"))
		if err != nil {
			fmt.Fprintln(stderr, "testreport:", err)
			return 2
		}
		defer jf.Close()
		lf, err := os.Create(filepath.Join(c.outDir, "test.log"))
		if err != nil {
			fmt.Fprintln(stderr, "testreport:", err)
			return 2
		}
		defer lf.Close()
		rawOut, logOut = jf, lf
	}
	r := newReporter(stdout, logOut)
	if err := r.consume(stdin, rawOut); err != nil {
		fmt.Fprintln(stderr, "testreport:", err)
		return 2
	}
	r.finish()
	s := r.summarize(c, now().Sub(start))
	s.write(stdout, c)
	if s.fails() {
		return 1
	}
	return 0
}

// event is one line of `go test -json` (cmd/test2json's TestEvent, plus the
// build events of Go 1.24 and later).
type event struct {
	Time        time.Time
	Action      string
	Package     string
	Test        string
	Elapsed     float64
	Output      string
	FailedBuild string
	ImportPath  string
}

// status of a test or a package.
const (
	statusRunning = ""
	statusPass    = "pass"
	statusFail    = "fail"
	statusSkip    = "skip"
)

// test is one test, subtest, example or fuzz seed.
type test struct {
	pkg      string
	name     string
	status   string
	elapsed  time.Duration
	started  time.Time
	output   strings.Builder
	parent   *test
	children []*test
	level    int // 0 for a top-level test, 1 for its subtests, ...
	printed  bool
}

// depth is 0 for a top-level test, 1 for its subtests, and so on.
func (t *test) depth() int { return t.level }

// pkg is one package of the run.
type pkg struct {
	name        string
	status      string
	elapsed     time.Duration
	started     time.Time
	ended       time.Time
	failedBuild string
	output      strings.Builder // lines that belong to no test
	verbose     strings.Builder // every output line, for test.log
	tests       map[string]*test
	order       []*test // every test in the order it started
	finished    bool
}

// build is the output of one package's failed build.
type build struct {
	importPath string
	output     strings.Builder
	failed     bool
	logged     bool
}

// reporter follows the event stream.
type reporter struct {
	out        io.Writer // the live console
	log        io.Writer // test.log
	pkgs       map[string]*pkg
	pkgOrder   []*pkg
	builds     map[string]*build
	buildOrder []*build
	nonJSON    int
	first      time.Time
	last       time.Time
}

func newReporter(out, log io.Writer) *reporter {
	return &reporter{out: out, log: log, pkgs: map[string]*pkg{}, builds: map[string]*build{}}
}

// consume reads events until the end of in, copying each JSON line to raw.
func (r *reporter) consume(in io.Reader, raw io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
			// Not an event: what go test printed outside the JSON stream
			// (go command errors, downloads). Shown as it comes.
			r.nonJSON++
			fmt.Fprintf(r.out, "%s\n", line)
			fmt.Fprintf(r.log, "%s\n", line)
			continue
		}
		if _, err := fmt.Fprintf(raw, "%s\n", line); err != nil {
			return fmt.Errorf("write test.json: %w", err)
		}
		r.handle(e)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read go test -json: %w", err)
	}
	return nil
}

// handle applies one event.
func (r *reporter) handle(e event) {
	if !e.Time.IsZero() {
		if r.first.IsZero() || e.Time.Before(r.first) {
			r.first = e.Time
		}
		if e.Time.After(r.last) {
			r.last = e.Time
		}
	}
	switch e.Action {
	case "build-output":
		b := r.build(e.ImportPath)
		b.output.WriteString(e.Output)
		return
	case "build-fail":
		b := r.build(e.ImportPath)
		b.failed = true
		r.flushBuild(b)
		return
	}
	if e.Package == "" {
		return
	}
	p := r.pkg(e.Package)
	if e.Test == "" {
		switch e.Action {
		case "start":
			p.started = e.Time
		case "output":
			p.output.WriteString(e.Output)
			p.verbose.WriteString(e.Output)
		case "pass", "fail", "skip":
			p.status = e.Action
			p.elapsed = seconds(e.Elapsed)
			p.ended = e.Time
			p.failedBuild = e.FailedBuild
			r.endPackage(p)
		}
		return
	}
	t := p.test(e.Test, e.Time)
	switch e.Action {
	case "output":
		t.output.WriteString(e.Output)
		p.verbose.WriteString(e.Output)
	case "pass", "fail", "skip":
		t.status = e.Action
		t.elapsed = seconds(e.Elapsed)
		if e.Action == statusFail && t.depth() == 0 {
			r.printFailed(t)
		}
	}
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func (r *reporter) build(importPath string) *build {
	b, ok := r.builds[importPath]
	if !ok {
		b = &build{importPath: importPath}
		r.builds[importPath] = b
		r.buildOrder = append(r.buildOrder, b)
	}
	return b
}

// flushBuild prints a failed build's errors, as go test does on stderr.
func (r *reporter) flushBuild(b *build) {
	if b.logged {
		return
	}
	b.logged = true
	fmt.Fprint(r.out, b.output.String())
	fmt.Fprint(r.log, b.output.String())
}

func (r *reporter) pkg(name string) *pkg {
	p, ok := r.pkgs[name]
	if !ok {
		p = &pkg{name: name, tests: map[string]*test{}}
		r.pkgs[name] = p
		r.pkgOrder = append(r.pkgOrder, p)
	}
	return p
}

// test returns the package's test of that name, made on its first event.
// Its parent is the longest test name before a slash that has run already:
// a subtest's own name may hold a slash (t.Run("v4 /0") is "TestX/v4_/0"),
// so not every prefix is a test.
func (p *pkg) test(name string, at time.Time) *test {
	t, ok := p.tests[name]
	if ok {
		return t
	}
	t = &test{pkg: p.name, name: name, started: at}
	p.tests[name] = t
	p.order = append(p.order, t)
	for i := strings.LastIndex(name, "/"); i >= 0; i = strings.LastIndex(name[:i], "/") {
		if parent, ok := p.tests[name[:i]]; ok {
			parent.children = append(parent.children, t)
			t.parent = parent
			t.level = parent.level + 1
			break
		}
	}
	return t
}

// endPackage prints what plain go test prints when a package ends and
// appends the package's verbose output to test.log.
func (r *reporter) endPackage(p *pkg) {
	p.finished = true
	fmt.Fprint(r.log, p.verbose.String())
	switch p.status {
	case statusPass, statusSkip:
		// Plain go test shows only the "ok" or "no test files" line.
		for _, l := range lines(p.output.String()) {
			if strings.HasPrefix(l, "ok  ") || strings.HasPrefix(l, "?   ") {
				fmt.Fprintln(r.out, l)
			}
		}
	default:
		for _, t := range p.order {
			if t.depth() == 0 && !t.printed && (t.status == statusFail || t.status == statusRunning) {
				r.printFailed(t)
			}
		}
		fmt.Fprint(r.out, p.output.String())
	}
}

// finish ends what the stream left open: a package with no end event did
// not finish (go test was killed or crashed).
func (r *reporter) finish() {
	for _, b := range r.buildOrder {
		if b.failed {
			r.flushBuild(b)
		}
	}
	for _, p := range r.pkgOrder {
		if !p.finished {
			fmt.Fprint(r.log, p.verbose.String())
			for _, t := range p.order {
				if t.depth() == 0 && !t.printed && (t.status == statusFail || t.status == statusRunning) {
					r.printFailed(t)
				}
			}
			fmt.Fprintf(r.out, "FAIL\t%s [did not finish]\n", p.name)
		}
	}
}

// printFailed prints a failed (or unfinished) test and its failed subtests
// the way plain go test does: the result line, then the test's output
// indented under it.
func (r *reporter) printFailed(t *test) {
	t.printed = true
	indent := strings.Repeat("    ", t.depth())
	fmt.Fprintf(r.out, "%s%s\n", indent, resultLine(t))
	for _, l := range ownLines(t) {
		fmt.Fprintf(r.out, "%s%s\n", indent, l)
	}
	for _, c := range t.children {
		if c.status == statusFail || c.status == statusRunning {
			r.printFailed(c)
		}
	}
}

// resultLine is the test's "--- FAIL: name (1.23s)" line.
func resultLine(t *test) string {
	if t.status == statusRunning {
		return fmt.Sprintf("--- FAIL: %s (did not finish)", t.name)
	}
	for _, l := range lines(t.output.String()) {
		if strings.HasPrefix(l, "--- ") {
			return l
		}
	}
	return fmt.Sprintf("--- %s: %s (%.2fs)", strings.ToUpper(t.status), t.name, t.elapsed.Seconds())
}

// framing matches the lines go test -v adds around a test's own output.
var framing = regexp.MustCompile(`^(=== (RUN|PAUSE|CONT|NAME) |--- (PASS|FAIL|SKIP): )`)

// ownLines is the test's output without the framing lines of -v.
func ownLines(t *test) []string {
	var out []string
	for _, l := range lines(t.output.String()) {
		if !framing.MatchString(l) {
			out = append(out, l)
		}
	}
	return out
}

// lines splits output into lines without their newlines.
func lines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// row is one line of a table.
type row struct {
	name   string
	status string
	wall   time.Duration
}

// summary is what the run comes to.
type summary struct {
	passed, failed, skipped int
	failures                []failure
	skips                   []row
	skipReasons             []string
	packages                []row
	scenarios               []row
	slowest                 []row
	noTestFiles             int
	total                   time.Duration
	reasons                 []string
}

// failure is one entry of the failure summary.
type failure struct {
	title string
	lines []string
}

// logLine matches what test code logs (t.Log, t.Error: "file.go:12: ...")
// and panics: the lines that say why a test failed.
var logLine = regexp.MustCompile(`^\s*([A-Za-z0-9_.-]+\.go:[0-9]+: |panic: )`)

// summarize counts and ranks what the stream reported. wall is the
// reporter's own running time; the total is the larger of it and the span of
// the event times (a replayed file has no wall time of its own).
func (r *reporter) summarize(c config, wall time.Duration) summary {
	var s summary
	s.total = wall
	if span := r.last.Sub(r.first); span > s.total {
		s.total = span
	}
	var all []row
	for _, p := range r.pkgOrder {
		short := trimPkg(p.name, c.trim)
		switch {
		case !p.finished:
			s.packages = append(s.packages, row{short, "did not finish", p.runTime(r.last)})
			s.reasons = append(s.reasons, fmt.Sprintf("package %s did not finish", p.name))
		case p.status == statusSkip && len(p.order) == 0:
			s.noTestFiles++
			continue
		case p.failedBuild != "":
			s.packages = append(s.packages, row{short, "build failed", p.elapsed})
			s.reasons = append(s.reasons, fmt.Sprintf("package %s failed to build", p.name))
			s.failures = append(s.failures, failure{
				title: fmt.Sprintf("FAIL %s [build failed]", p.name),
				lines: tail(r.buildLines(p.failedBuild)),
			})
		default:
			s.packages = append(s.packages, row{short, statusWord(p.status), p.elapsed})
		}
		failedTests := 0
		for _, t := range p.order {
			wall := t.elapsed
			st := t.status
			if st == statusRunning {
				wall = p.testEnd(r.last).Sub(t.started)
				st = "did not finish"
			}
			all = append(all, row{short + " " + t.name, statusWord(st), wall})
			if p.name == c.labPkg && t.depth() <= 1 {
				s.scenarios = append(s.scenarios, row{t.name, statusWord(st), wall})
			}
			failedHere := (t.status == statusFail || t.status == statusRunning) && !anyChildFailed(t)
			switch {
			case failedHere:
				s.failed++
				failedTests++
				title := fmt.Sprintf("--- FAIL: %s %s (%s)", p.name, t.name, fmtDur(wall))
				if t.status == statusRunning {
					title = fmt.Sprintf("--- FAIL: %s %s (did not finish)", p.name, t.name)
				}
				s.failures = append(s.failures, failure{title: title, lines: tail(whyLines(t))})
			case len(t.children) > 0:
			case t.status == statusPass:
				s.passed++
			case t.status == statusSkip:
				s.skipped++
				s.skips = append(s.skips, row{short + " " + t.name, "skip", 0})
				s.skipReasons = append(s.skipReasons, skipReason(t))
			}
		}
		if failedTests > 0 {
			s.reasons = append(s.reasons, fmt.Sprintf("%d test(s) of %s failed", failedTests, p.name))
		} else if p.finished && p.status == statusFail && p.failedBuild == "" {
			s.reasons = append(s.reasons, fmt.Sprintf("package %s failed without a failing test", p.name))
			s.failures = append(s.failures, failure{
				title: fmt.Sprintf("FAIL %s (no test failed: TestMain, init or the test binary)", p.name),
				lines: tail(lines(p.output.String())),
			})
		}
	}
	for _, b := range r.buildOrder {
		if b.failed && !r.reported(b.importPath) {
			s.reasons = append(s.reasons, fmt.Sprintf("%s failed to build", b.importPath))
			s.failures = append(s.failures, failure{title: fmt.Sprintf("FAIL %s [build failed]", b.importPath), lines: tail(lines(b.output.String()))})
		}
	}
	if len(r.pkgOrder) == 0 {
		s.reasons = append(s.reasons, "go test reported no package (see its output above)")
	}
	sort.SliceStable(s.packages, func(i, j int) bool { return s.packages[i].wall > s.packages[j].wall })
	sort.SliceStable(all, func(i, j int) bool { return all[i].wall > all[j].wall })
	if len(all) > 10 {
		all = all[:10]
	}
	s.slowest = all
	if c.maxTotal > 0 && s.total > c.maxTotal {
		s.reasons = append(s.reasons, fmt.Sprintf("the run took %s, over the limit of %s (-max-total, TEST_MAX_TOTAL)", fmtDur(s.total), fmtDur(c.maxTotal)))
	}
	if c.failOnSkip && s.skipped > 0 {
		s.reasons = append(s.reasons, fmt.Sprintf("%d test(s) skipped, and -fail-on-skip says nothing is skipped (CI=true)", s.skipped))
	}
	return s
}

// reported says whether a package's fail event already names this build.
func (r *reporter) reported(importPath string) bool {
	for _, p := range r.pkgOrder {
		if p.failedBuild == importPath {
			return true
		}
	}
	return false
}

// buildLines is the output of the failed build a package names.
func (r *reporter) buildLines(importPath string) []string {
	if b, ok := r.builds[importPath]; ok {
		return lines(b.output.String())
	}
	return nil
}

// runTime is how long an unfinished package ran until the stream ended.
func (p *pkg) runTime(last time.Time) time.Duration {
	if p.started.IsZero() || last.IsZero() {
		return 0
	}
	return last.Sub(p.started)
}

// testEnd is when the package's tests stopped: its end, or the stream's.
func (p *pkg) testEnd(last time.Time) time.Time {
	if !p.ended.IsZero() {
		return p.ended
	}
	return last
}

func anyChildFailed(t *test) bool {
	for _, c := range t.children {
		if c.status == statusFail || c.status == statusRunning {
			return true
		}
	}
	return false
}

// whyLines is what a failed test logged, or all its output when it logged
// nothing in the file.go:NN form, and the panic its parents reported: the
// testing package reports a subtest's panic in the output of the top-level
// test.
func whyLines(t *test) []string {
	var why []string
	own := ownLines(t)
	for _, l := range own {
		if logLine.MatchString(l) {
			why = append(why, l)
		}
	}
	if len(why) == 0 {
		why = own
	}
	for a := t.parent; a != nil; a = a.parent {
		for _, l := range ownLines(a) {
			if strings.HasPrefix(l, "panic: ") {
				why = append(why, l)
			}
		}
	}
	return why
}

// skipReason is what a skipped test said when it skipped.
func skipReason(t *test) string {
	own := ownLines(t)
	for i := len(own) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(own[i]); l != "" {
			return l
		}
	}
	return "(no message)"
}

// tail keeps the last maxSummaryLines lines, each cut to maxLineLen.
func tail(ls []string) []string {
	var out []string
	if len(ls) > maxSummaryLines {
		out = append(out, fmt.Sprintf("... (%d earlier lines in test.log)", len(ls)-maxSummaryLines))
		ls = ls[len(ls)-maxSummaryLines:]
	}
	for _, l := range ls {
		if len(l) > maxLineLen {
			l = l[:maxLineLen] + " ..."
		}
		out = append(out, l)
	}
	return out
}

func statusWord(s string) string {
	switch s {
	case statusPass:
		return "ok"
	case statusFail:
		return "FAIL"
	case statusSkip:
		return "skip"
	}
	return s
}

func trimPkg(name, prefix string) string {
	if prefix != "" && strings.HasPrefix(name, prefix) && len(name) > len(prefix) {
		return name[len(prefix):]
	}
	return name
}

// fmtDur prints a wall time the way a person reads it: 0.4s, 12.3s, 4m07s,
// 1h02m03s.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		s := int(d.Round(time.Second).Seconds())
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	default:
		s := int(d.Round(time.Second).Seconds())
		return fmt.Sprintf("%dh%02dm%02ds", s/3600, s/60%60, s%60)
	}
}

// fails says whether the run fails.
func (s summary) fails() bool { return len(s.reasons) > 0 }

// closingLine is the last line of the report.
func (s summary) closingLine() string {
	l := fmt.Sprintf("%d passed, %d failed", s.passed, s.failed)
	if s.skipped > 0 {
		l += fmt.Sprintf(", %d skipped", s.skipped)
	}
	return l
}

// write prints the report: failures, skips, the table, why the run fails,
// and the closing line.
func (s summary) write(w io.Writer, c config) {
	if len(s.failures) > 0 {
		fmt.Fprintf(w, "\n==== failure summary (every line in %s) ====\n", logName(c))
		for _, f := range s.failures {
			fmt.Fprintln(w, f.title)
			for _, l := range f.lines {
				fmt.Fprintf(w, "    %s\n", strings.TrimLeft(l, " "))
			}
		}
	}
	if len(s.skips) > 0 {
		fmt.Fprintf(w, "\n==== skipped tests (%d) ====\n", len(s.skips))
		for i, sk := range s.skips {
			fmt.Fprintf(w, "SKIP %s: %s\n", sk.name, s.skipReasons[i])
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "==== wall times ====")
	width := 0
	for _, rs := range [][]row{s.packages, s.scenarios, s.slowest} {
		for _, r := range rs {
			width = max(width, len(r.name))
		}
	}
	width = max(width, len("slowest tests"))
	table := func(title string, rs []row) {
		fmt.Fprintf(w, "%-*s  %-14s %10s\n", width, title, "result", "wall")
		for _, r := range rs {
			fmt.Fprintf(w, "%-*s  %-14s %10s\n", width, r.name, r.status, fmtDur(r.wall))
		}
		fmt.Fprintln(w)
	}
	table("package", s.packages)
	if s.noTestFiles > 0 {
		fmt.Fprintf(w, "packages without test files: %d\n\n", s.noTestFiles)
	}
	if len(s.scenarios) > 0 {
		table("lab scenario", indentScenarios(s.scenarios))
	}
	table("slowest tests", s.slowest)
	limit := "no limit"
	if c.maxTotal > 0 {
		limit = "limit " + fmtDur(c.maxTotal)
	}
	fmt.Fprintf(w, "total wall time: %s (%s)\n", fmtDur(s.total), limit)
	for _, r := range s.reasons {
		fmt.Fprintln(w, "FAIL:", r)
	}
	fmt.Fprintln(w, s.closingLine())
}

// indentScenarios indents subtests under their top-level test.
func indentScenarios(rs []row) []row {
	out := make([]row, len(rs))
	for i, r := range rs {
		if strings.Contains(r.name, "/") {
			r.name = "  " + r.name
		}
		out[i] = r
	}
	return out
}

func logName(c config) string {
	if c.outDir == "" {
		return "the go test -v log"
	}
	return filepath.Join(c.outDir, "test.log")
}
