package vm

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Suite runs several kernel tests of one package in one VM. Each member
// calls Run when !InVM(), as it would call RunTest; the first member to
// run boots a single VM running every member that the host's -test.run and
// -test.skip select, in the order go test runs them, and every member then
// logs its own part of the guest's output and passes, skips or fails on its
// own verdict there. A boot costs the VM's start and the package's module
// loading once, not once per test.
//
// Members share Options: a test that needs another kernel setup (without
// ip_vs loaded at boot, say) keeps its own RunTest. Members must not depend
// on each other's leftovers: each builds and removes its own namespaces.
//
// A Suite is made once per package (a package-level variable of its
// tests) and is safe for sequential use by its members.
type Suite struct {
	opts    Options
	members []string

	once sync.Once
	run  suiteRun
}

// suiteRun is what the suite's one VM run left: its console output, the
// members it ran, and the harness error, if any.
type suiteRun struct {
	res      *Result
	err      error
	selected []string
	info     string
}

// NewSuite returns a suite of the named top-level tests, run in one VM
// with opts; opts.Timeout bounds the whole run (default 5 minutes per
// member).
func NewSuite(opts Options, members ...string) *Suite {
	return &Suite{opts: opts, members: slices.Clone(members)}
}

// Run reports t's part of the suite's VM run, booting the VM if t is the
// first member to run. Call it when !InVM() and return.
func (s *Suite) Run(t *testing.T) {
	t.Helper()
	skipIfDisabled(t)
	if InVM() {
		t.Fatal("vm.Suite.Run called inside the VM")
	}
	if !slices.Contains(s.members, t.Name()) {
		t.Fatalf("vm: %s is not a member of its package's kernel suite %v: add it to the NewSuite call", t.Name(), s.members)
	}
	first := false
	s.once.Do(func() {
		first = true
		s.run = s.boot(t)
	})
	r := s.run
	if first && r.info != "" {
		t.Log(r.info)
	}
	if !slices.Contains(r.selected, t.Name()) {
		t.Fatalf("vm: the suite's VM did not run %s (it ran %v)", t.Name(), r.selected)
	}
	var out string
	if r.res != nil {
		out = r.res.Output
	}
	section := testSection(out, t.Name())
	for _, line := range strings.Split(strings.TrimRight(section, "\n"), "\n") {
		if line != "" {
			t.Log("vm| " + line)
		}
	}
	switch verdict(section, t.Name()) {
	case "PASS":
		return
	case "SKIP":
		t.Skip("vm: the guest test skipped")
	case "FAIL":
		t.Fatalf("vm: the guest reported --- FAIL: %s", t.Name())
	}
	if r.err != nil {
		t.Fatalf("vm: the suite's VM run failed before %s finished: %v; the console's last lines:\n%s", t.Name(), r.err, lastLines(out, 40))
	}
	t.Fatalf("vm: the guest did not report a verdict for %s (exit code %d); the console's last lines:\n%s", t.Name(), r.res.ExitCode, lastLines(out, 40))
}

// boot runs the selected members in one VM.
func (s *Suite) boot(t *testing.T) suiteRun {
	t.Helper()
	runPat, skipPat := flagValue("test.run"), flagValue("test.skip")
	selected, err := selectMembers(s.members, runPat, skipPat)
	if err != nil {
		return suiteRun{err: err}
	}
	env, err := prepareOnce()
	if err != nil {
		return suiteRun{err: fmt.Errorf("prepare: %w", err), selected: selected}
	}
	ctx, cancel := deadlineCtx(t)
	defer cancel()
	bin, err := TestBinary(ctx)
	if err != nil {
		return suiteRun{err: fmt.Errorf("build test binary: %w", err), selected: selected}
	}
	opts := s.opts
	if opts.Timeout <= 0 {
		opts.Timeout = time.Duration(len(selected)) * 5 * time.Minute
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < opts.Timeout {
		opts.Timeout = time.Until(dl)
	}
	opts.TestBinary = bin
	opts.Args = append(guestArgs(selected, runPat, skipPat, opts.Timeout), opts.Args...)
	if opts.Logf == nil {
		// Each member logs its own part when the run is over; meanwhile
		// the console streams to a file, to follow a long or hung run.
		wd, err := workDir()
		if err != nil {
			return suiteRun{err: err, selected: selected}
		}
		f, err := os.CreateTemp(wd, "suite-console-*.log")
		if err != nil {
			return suiteRun{err: fmt.Errorf("console log: %w", err), selected: selected}
		}
		defer func() { _ = f.Close() }()
		t.Logf("vm: one VM for %v; its console streams to %s", selected, f.Name())
		var mu sync.Mutex
		opts.Logf = func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			_, _ = fmt.Fprintf(f, format+"\n", args...)
		}
	}
	res, err := RunContext(ctx, env, opts)
	r := suiteRun{res: res, err: err, selected: selected}
	if res != nil {
		r.info = fmt.Sprintf("vm: one VM for %d kernel tests %v: kernel %s (%s, %s), boot %s, total %s, exit %d",
			len(selected), selected, env.Kernel.Release, env.Kernel.Version, env.Accel,
			res.Boot.Round(time.Millisecond), res.Total.Round(time.Millisecond), res.ExitCode)
	}
	return r
}

// guestArgs are the guest test binary's flags: the selected members, the
// host's own subtest patterns below them, and a timeout that fires in the
// guest before the host's, so its goroutine dump reaches the console.
func guestArgs(selected []string, runPat, skipPat string, timeout time.Duration) []string {
	quoted := make([]string, len(selected))
	for i, name := range selected {
		quoted[i] = regexp.QuoteMeta(name)
	}
	pat := "^(" + strings.Join(quoted, "|") + ")$"
	if parts := splitPattern(runPat); len(parts) > 1 {
		pat += "/" + strings.Join(parts[1:], "/")
	}
	inner := max(timeout-30*time.Second, timeout/2)
	args := []string{"-test.run", pat, "-test.v", "-test.count=1", "-test.timeout", inner.String()}
	if skipPat != "" {
		args = append(args, "-test.skip", skipPat)
	}
	return args
}

// selectMembers returns the members that go test runs at the top level
// under -test.run runPat and -test.skip skipPat, as the testing package
// matches them: the first slash-separated element of -run selects, and a
// single-element -skip removes.
func selectMembers(members []string, runPat, skipPat string) ([]string, error) {
	match := func(pat, name string) (bool, error) {
		ok, err := regexp.MatchString(splitPattern(pat)[0], name)
		if err != nil {
			return false, fmt.Errorf("vm: pattern %q: %w", pat, err)
		}
		return ok, nil
	}
	var out []string
	for _, m := range members {
		if runPat != "" {
			ok, err := match(runPat, m)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
		}
		if skipPat != "" && len(splitPattern(skipPat)) == 1 {
			skip, err := match(skipPat, m)
			if err != nil {
				return nil, err
			}
			if skip {
				continue
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// splitPattern splits a -test.run pattern into its per-level elements at
// the slashes outside brackets and parentheses, as the testing package
// does.
func splitPattern(s string) []string {
	var parts []string
	brackets, parens, start := 0, 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			brackets++
		case ']':
			brackets = max(brackets-1, 0)
		case '(':
			if brackets == 0 {
				parens++
			}
		case ')':
			if brackets == 0 {
				parens--
			}
		case '\\':
			i++
		case '/':
			if brackets == 0 && parens == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

// testSection is the part of a -test.v output that belongs to the
// top-level test name: from its "=== RUN" line up to the next top-level
// test's, the binary's closing PASS/FAIL or the VM's exit marker.
func testSection(out, name string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.SplitAfter(out, "\n") {
		trimmed := strings.TrimRight(line, "\n")
		if strings.HasPrefix(trimmed, "=== RUN   ") {
			run := strings.TrimPrefix(trimmed, "=== RUN   ")
			if !strings.Contains(run, "/") {
				in = run == name
			}
		}
		if in && (trimmed == "PASS" || trimmed == "FAIL" || strings.HasPrefix(trimmed, ExitMarker)) {
			in = false
		}
		if in {
			b.WriteString(line)
		}
	}
	return b.String()
}

// verdict is PASS, FAIL or SKIP as the section reports the top-level
// test, or "" when it reports none.
func verdict(section, name string) string {
	for _, v := range []string{"PASS", "FAIL", "SKIP"} {
		if strings.Contains(section, "--- "+v+": "+name+" (") {
			return v
		}
	}
	return ""
}

// flagValue is the value of the test binary's flag name ("" when the flag
// does not exist).
func flagValue(name string) string {
	if f := flag.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// lastLines returns the last n lines of out.
func lastLines(out string, n int) string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}
