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
// top-level tests of the lab package and two levels of their subtests), the
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
	fs.StringVar(&c.labPkg, "lab", "github.com/vipcast/vipcast/test/lab", "package whose top-level tests and two levels of subtests are the lab scenarios")
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
			_, _ = fmt.Fprintln(stderr, "testreport:", err)
		}
		return 2
	}
	start := now()
	raw, log, closeFiles, err := openOutputs(c.outDir)
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "testreport:", err)
		return 2
	}
	r := newReporter(stdout, log)
	readErr := r.consume(stdin, raw)
	r.finish()
	s := r.summarize(c, now().Sub(start))
	for _, err := range []error{readErr, raw.err, r.log.err, closeFiles()} {
		if err != nil {
			s.reasons = append(s.reasons, err.Error())
		}
	}
	s.write(r.out, c)
	if r.out.err != nil {
		_, _ = fmt.Fprintln(stderr, "testreport:", r.out.err)
		return 2
	}
	if s.fails() {
		return 1
	}
	return 0
}

// openOutputs creates dir/test.json and dir/test.log; with no dir, what is
// written to them goes nowhere. The returned function closes both files.
func openOutputs(dir string) (raw, log *printer, closeFiles func() error, err error) {
	if dir == "" {
		return &printer{w: io.Discard}, &printer{w: io.Discard}, func() error { return nil }, nil
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, nil, nil, fmt.Errorf("make the output directory: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("open the output directory: %w", err)
	}
	// The files stay open without the directory; closing it loses nothing.
	defer func() { _ = root.Close() }()
	jf, err := root.Create("test.json")
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create test.json: %w", err)
	}
	lf, err := root.Create("test.log")
	if err != nil {
		_ = jf.Close()
		return nil, nil, nil, fmt.Errorf("create test.log: %w", err)
	}
	closeFiles = func() error {
		return errors.Join(jf.Close(), lf.Close())
	}
	return &printer{w: jf, name: filepath.Join(dir, "test.json")}, &printer{w: lf, name: filepath.Join(dir, "test.log")}, closeFiles, nil
}

// printer writes and keeps the first error, so that a report of many lines
// checks once, at the end.
type printer struct {
	w    io.Writer
	name string
	err  error
}

func (p *printer) printf(format string, args ...any) {
	if p.err != nil {
		return
	}
	if _, err := fmt.Fprintf(p.w, format, args...); err != nil {
		p.err = fmt.Errorf("write %s: %w", p.name, err)
	}
}

func (p *printer) print(s string) { p.printf("%s", s) }

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
	out        *printer // the live console
	log        *printer // test.log
	pkgs       map[string]*pkg
	pkgOrder   []*pkg
	builds     map[string]*build
	buildOrder []*build
	first      time.Time
	last       time.Time
}

func newReporter(out io.Writer, log *printer) *reporter {
	return &reporter{out: &printer{w: out, name: "the standard output"}, log: log, pkgs: map[string]*pkg{}, builds: map[string]*build{}}
}

// consume reads events until the end of in, copying each JSON line to raw.
func (r *reporter) consume(in io.Reader, raw *printer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
			// Not an event: what go test printed outside the JSON stream
			// (go command errors, downloads). Shown as it comes.
			r.out.printf("%s\n", line)
			r.log.printf("%s\n", line)
			continue
		}
		raw.printf("%s\n", line)
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
	switch {
	case e.Action == "build-output":
		r.build(e.ImportPath).output.WriteString(e.Output)
	case e.Action == "build-fail":
		b := r.build(e.ImportPath)
		b.failed = true
		r.flushBuild(b)
	case e.Package == "":
	case e.Test == "":
		r.handlePackage(r.pkg(e.Package), e)
	default:
		r.handleTest(r.pkg(e.Package), e)
	}
}

// handlePackage applies an event of the package as a whole.
func (r *reporter) handlePackage(p *pkg, e event) {
	switch e.Action {
	case "start":
		p.started = e.Time
	case "output":
		p.output.WriteString(e.Output)
		p.verbose.WriteString(e.Output)
	case statusPass, statusFail, statusSkip:
		p.status = e.Action
		p.elapsed = seconds(e.Elapsed)
		p.ended = e.Time
		p.failedBuild = e.FailedBuild
		r.endPackage(p)
	}
}

// handleTest applies an event of one test.
func (r *reporter) handleTest(p *pkg, e event) {
	t := p.test(e.Test, e.Time)
	switch e.Action {
	case "output":
		t.output.WriteString(e.Output)
		p.verbose.WriteString(e.Output)
	case statusPass, statusFail, statusSkip:
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
	r.out.print(b.output.String())
	r.log.print(b.output.String())
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
	r.log.print(p.verbose.String())
	switch p.status {
	case statusPass, statusSkip:
		// Plain go test shows only the "ok" or "no test files" line.
		for _, l := range lines(p.output.String()) {
			if strings.HasPrefix(l, "ok  ") || strings.HasPrefix(l, "?   ") {
				r.out.printf("%s\n", l)
			}
		}
	default:
		for _, t := range p.order {
			if t.depth() == 0 && !t.printed && (t.status == statusFail || t.status == statusRunning) {
				r.printFailed(t)
			}
		}
		r.out.print(p.output.String())
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
			r.log.print(p.verbose.String())
			for _, t := range p.order {
				if t.depth() == 0 && !t.printed && (t.status == statusFail || t.status == statusRunning) {
					r.printFailed(t)
				}
			}
			r.out.printf("FAIL\t%s [did not finish]\n", p.name)
		}
	}
}

// printFailed prints a failed (or unfinished) test and its failed subtests
// the way plain go test does: the result line, then the test's output
// indented under it.
func (r *reporter) printFailed(t *test) {
	t.printed = true
	indent := strings.Repeat("    ", t.depth())
	r.out.printf("%s%s\n", indent, resultLine(t))
	for _, l := range ownLines(t) {
		r.out.printf("%s%s\n", indent, l)
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

// skip is one skipped test and what it said.
type skip struct {
	name   string
	reason string
}

// summary is what the run comes to.
type summary struct {
	passed, failed, skipped int
	failures                []failure
	skips                   []skip
	packages                []row
	scenarios               []row
	tests                   []row // every test; the ten slowest after rank
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
	s := summary{total: max(wall, r.last.Sub(r.first))}
	for _, p := range r.pkgOrder {
		r.addPackage(&s, p, c)
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
	s.rank()
	if c.maxTotal > 0 && s.total > c.maxTotal {
		s.reasons = append(s.reasons, fmt.Sprintf("the run took %s, over the limit of %s (-max-total, TEST_MAX_TOTAL)", fmtDur(s.total), fmtDur(c.maxTotal)))
	}
	if c.failOnSkip && s.skipped > 0 {
		s.reasons = append(s.reasons, fmt.Sprintf("%d test(s) skipped, and -fail-on-skip says nothing is skipped (CI=true)", s.skipped))
	}
	return s
}

// addPackage adds a package's row and its tests to the summary.
func (r *reporter) addPackage(s *summary, p *pkg, c config) {
	short := trimPkg(p.name, c.trim)
	switch {
	case !p.finished:
		s.packages = append(s.packages, row{short, "did not finish", p.runTime(r.last)})
		s.reasons = append(s.reasons, fmt.Sprintf("package %s did not finish", p.name))
	case p.status == statusSkip && len(p.order) == 0:
		s.noTestFiles++
		return
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
	failed := 0
	for _, t := range p.order {
		if s.addTest(t, short, p.testEnd(r.last), p.name == c.labPkg) {
			failed++
		}
	}
	switch {
	case failed > 0:
		s.reasons = append(s.reasons, fmt.Sprintf("%d test(s) of %s failed", failed, p.name))
	case p.finished && p.status == statusFail && p.failedBuild == "":
		s.reasons = append(s.reasons, fmt.Sprintf("package %s failed without a failing test", p.name))
		s.failures = append(s.failures, failure{
			title: fmt.Sprintf("FAIL %s (no test failed: TestMain, init or the test binary)", p.name),
			lines: tail(lines(p.output.String())),
		})
	}
}

// addTest adds one test to the summary: its row, a lab scenario's row, and
// the counts. A test counts when it has no subtests, or when it failed
// though none of its subtests did (it failed on its own). end is when its
// package stopped, for a test that did not finish. It reports whether the
// test counts as failed.
func (s *summary) addTest(t *test, short string, end time.Time, lab bool) bool {
	wall, st := t.elapsed, statusWord(t.status)
	if t.status == statusRunning {
		wall, st = end.Sub(t.started), "did not finish"
	}
	s.tests = append(s.tests, row{short + " " + t.name, st, wall})
	if lab && t.depth() <= 2 {
		s.scenarios = append(s.scenarios, row{t.name, st, wall})
	}
	switch {
	case (t.status == statusFail || t.status == statusRunning) && !anyChildFailed(t):
		s.failed++
		title := fmt.Sprintf("--- FAIL: %s %s (%s)", t.pkg, t.name, fmtDur(wall))
		if t.status == statusRunning {
			title = fmt.Sprintf("--- FAIL: %s %s (did not finish)", t.pkg, t.name)
		}
		s.failures = append(s.failures, failure{title: title, lines: tail(whyLines(t))})
		return true
	case len(t.children) > 0:
	case t.status == statusPass:
		s.passed++
	case t.status == statusSkip:
		s.skipped++
		s.skips = append(s.skips, skip{short + " " + t.name, skipReason(t)})
	}
	return false
}

// rank puts the slowest packages first and keeps the ten slowest tests.
func (s *summary) rank() {
	sort.SliceStable(s.packages, func(i, j int) bool { return s.packages[i].wall > s.packages[j].wall })
	sort.SliceStable(s.tests, func(i, j int) bool { return s.tests[i].wall > s.tests[j].wall })
	if len(s.tests) > 10 {
		s.tests = s.tests[:10]
	}
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

// write prints the report: skips, the table, the failures, why the run
// fails, and the closing line. The failures come last, where a reader of
// the end of a long log (a CI page showing its head and tail) finds them.
func (s summary) write(w *printer, c config) {
	if len(s.skips) > 0 {
		w.printf("\n==== skipped tests (%d) ====\n", len(s.skips))
		for _, sk := range s.skips {
			w.printf("SKIP %s: %s\n", sk.name, sk.reason)
		}
	}
	s.writeTable(w, c)
	if len(s.failures) > 0 {
		w.printf("\n==== failure summary (every line in %s) ====\n", logName(c))
		for _, f := range s.failures {
			w.printf("%s\n", f.title)
			for _, l := range f.lines {
				w.printf("    %s\n", strings.TrimLeft(l, " "))
			}
		}
	}
	for _, r := range s.reasons {
		w.printf("FAIL: %s\n", r)
	}
	w.printf("%s\n", s.closingLine())
}

// writeTable prints the wall times: packages, lab scenarios, the slowest
// tests and the total.
func (s summary) writeTable(w *printer, c config) {
	w.printf("\n==== wall times ====\n")
	width := len("slowest tests")
	for _, rs := range [][]row{s.packages, s.scenarios, s.tests} {
		for _, r := range rs {
			width = max(width, len(r.name))
		}
	}
	table := func(title string, rs []row) {
		w.printf("%-*s  %-14s %10s\n", width, title, "result", "wall")
		for _, r := range rs {
			w.printf("%-*s  %-14s %10s\n", width, r.name, r.status, fmtDur(r.wall))
		}
		w.printf("\n")
	}
	table("package", s.packages)
	if s.noTestFiles > 0 {
		w.printf("packages without test files: %d\n\n", s.noTestFiles)
	}
	if len(s.scenarios) > 0 {
		table("lab scenario", indentScenarios(s.scenarios))
	}
	table("slowest tests", s.tests)
	limit := "no limit"
	if c.maxTotal > 0 {
		limit = "limit " + fmtDur(c.maxTotal)
	}
	w.printf("total wall time: %s (%s)\n", fmtDur(s.total), limit)
}

// indentScenarios indents subtests under their top-level test.
func indentScenarios(rs []row) []row {
	out := make([]row, len(rs))
	for i, r := range rs {
		r.name = strings.Repeat("  ", strings.Count(r.name, "/")) + r.name
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
