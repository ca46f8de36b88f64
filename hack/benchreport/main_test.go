package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func fixedNow() time.Time { return time.Date(2026, 12, 1, 23, 30, 0, 0, time.FixedZone("x", -3600)) }

// runArgs runs the command with args and returns its status, output and
// errors.
func runArgs(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut, fixedNow)
	return code, out.String(), errOut.String()
}

// runPaths are testdata/run's files as paths.
func runPaths(t *testing.T) []string {
	t.Helper()
	var paths []string
	for _, f := range runFiles(t) {
		paths = append(paths, filepath.Join("testdata", "run", f))
	}
	return paths
}

func TestRunFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no commit", []string{"testdata/run/bench-bgp.txt"}, "-commit is required"},
		{"no outputs", []string{"-commit", "abc"}, "no output files"},
		{"a bad date", []string{"-commit", "abc", "-date", "1 Dec", "x.txt"}, `-date "1 Dec": want YYYY-MM-DD`},
		{"an unknown flag", []string{"-commmit", "abc"}, "flag provided but not defined: -commmit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := runArgs(tc.args...)
			if code != 2 || !strings.Contains(stderr, tc.want) {
				t.Errorf("status %d, stderr %q; want 2 and %q", code, stderr, tc.want)
			}
		})
	}
}

func TestRunWritesThePage(t *testing.T) {
	out := filepath.Join(t.TempDir(), "performance.md")
	args := append([]string{"-commit", "5619c98", "-kernel", "Linux 6.12", "-go", "go1.26.8", "-o", out}, runPaths(t)...)
	if code, _, stderr := runArgs(args...); code != 0 {
		t.Fatalf("status %d: %s", code, stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// The default date is the run's, in UTC.
	if !strings.Contains(string(data), "| date (UTC) | 2026-12-02 |") {
		t.Errorf("the page lacks the UTC date of now:\n%.1200s", data)
	}
	entries, err := os.ReadDir(filepath.Dir(out))
	if err != nil || len(entries) != 1 {
		t.Errorf("the directory holds %d entries (%v): a temporary file left?", len(entries), err)
	}
}

func TestRunStdout(t *testing.T) {
	code, stdout, stderr := runArgs(append([]string{"-commit", "5619c98", "-date", "2026-12-01"}, runPaths(t)...)...)
	if code != 0 || !strings.HasPrefix(stdout, generatedComment) {
		t.Errorf("status %d, stderr %q, stdout %.100q", code, stderr, stdout)
	}
}

// TestRunLeavesThePageOnError: an inconsistency writes nothing, and the
// page is the one before.
func TestRunLeavesThePageOnError(t *testing.T) {
	out := filepath.Join(t.TempDir(), "performance.md")
	if err := os.WriteFile(out, []byte("the page before\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-commit", "5619c98", "-o", out}, runPaths(t)...)
	args = append(args, filepath.Join("testdata", "errors", "bench-extra.txt"), filepath.Join("testdata", "errors", "bench-malformed.txt"))
	code, _, stderr := runArgs(args...)
	if code != 1 || !strings.Contains(stderr, "not written") || !strings.Contains(stderr, "malformed result line") {
		t.Errorf("status %d, stderr %q; want 1, naming the malformed line", code, stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil || string(data) != "the page before\n" {
		t.Errorf("the page is now %q (%v)", data, err)
	}
}

func TestRunTemplateFlag(t *testing.T) {
	tmpl := filepath.Join(t.TempDir(), "t.tmpl")
	if err := os.WriteFile(tmpl, []byte("{{.Commit}} {{bench \"BenchmarkAnnounce10k\"}}"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runArgs("-commit", "abc", "-template", tmpl, filepath.Join("testdata", "run", "bench-bgp.txt"))
	// The repository's floor pairs name benchmarks this template leaves out.
	if code != 1 || !strings.Contains(stderr, "the template does not place BenchmarkCCMAllocation") || stdout != "" {
		t.Errorf("status %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
