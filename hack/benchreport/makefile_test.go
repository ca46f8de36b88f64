package main

import (
	"go/build/constraint"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// repoRoot is the repository, from this package's directory.
var repoRoot = filepath.Join("..", "..")

// benchCommand is one go test command of the Makefile's bench target.
type benchCommand struct {
	line        string
	tags        []string
	bench, run  string
	packageDirs []string
}

// benchCommands reads the go test commands of the bench target's recipe.
func benchCommands(t *testing.T) []benchCommand {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []benchCommand
	inBench := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "bench:") {
			inBench = true
			continue
		}
		if !inBench {
			continue
		}
		if !strings.HasPrefix(line, "\t") {
			break
		}
		if c, ok := parseGoTest(strings.ReplaceAll(line, "$$", "$")); ok {
			cmds = append(cmds, c)
		}
	}
	if len(cmds) < 5 {
		t.Fatalf("the Makefile's bench target has %d go test commands", len(cmds))
	}
	return cmds
}

// parseGoTest reads a recipe line "$(GO) test [flags] ./pkg/ ... [| ...]":
// its -tags, -bench and -run and its packages, up to a pipe or a
// redirection.
func parseGoTest(line string) (benchCommand, bool) {
	_, rest, ok := strings.Cut(line, "$(GO) test ")
	if !ok {
		return benchCommand{}, false
	}
	c := benchCommand{line: strings.TrimSpace(line)}
	words := shellWords(rest)
	for i := 0; i < len(words); i++ {
		w := words[i]
		if w == "|" || strings.Contains(w, ">") || w == "-args" {
			break
		}
		next := ""
		if i+1 < len(words) {
			next = words[i+1]
		}
		switch w {
		case "-tags":
			c.tags, i = strings.Split(next, ","), i+1
		case "-bench":
			c.bench, i = next, i+1
		case "-run":
			c.run, i = next, i+1
		default:
			if strings.HasPrefix(w, "./") {
				c.packageDirs = append(c.packageDirs, strings.TrimSuffix(w, "/"))
			}
		}
	}
	return c, true
}

// shellWords splits s at spaces outside single quotes, without them.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	quoted, inWord := false, false
	for _, r := range s {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				words = append(words, w.String())
				w.Reset()
			}
			inWord = false
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

var (
	benchFunc = regexp.MustCompile(`(?m)^func (Benchmark\w*)\(\w+ \*testing\.B\)`)
	testFunc  = regexp.MustCompile(`(?m)^func (Test\w*)\(\w+ \*testing\.T\)`)
)

// ranBy is what c runs: the Benchmark functions its -bench matches and,
// with a -run other than '^$', the Test functions that matches, in the
// _test.go files of its packages that its -tags build.
func ranBy(t *testing.T, c benchCommand) []string {
	t.Helper()
	var names []string
	for _, dir := range c.packageDirs {
		files, err := filepath.Glob(filepath.Join(repoRoot, dir, "*_test.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no test files in %s (%v)", c.line, dir, err)
		}
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if !builds(t, string(src), c.tags) {
				continue
			}
			names = append(names, matching(t, benchFunc, c.bench, string(src))...)
			if c.run != "^$" {
				names = append(names, matching(t, testFunc, c.run, string(src))...)
			}
		}
	}
	return names
}

// matching is the functions of src that funcs finds and pattern (a go
// test -bench or -run pattern: its first element, unanchored) selects.
func matching(t *testing.T, funcs *regexp.Regexp, pattern, src string) []string {
	t.Helper()
	if pattern == "" {
		return nil
	}
	first, _, _ := strings.Cut(pattern, "/")
	re, err := regexp.Compile(first)
	if err != nil {
		t.Fatalf("pattern %q: %v", pattern, err)
	}
	var names []string
	for _, m := range funcs.FindAllStringSubmatch(src, -1) {
		if re.MatchString(m[1]) {
			names = append(names, m[1])
		}
	}
	return names
}

// builds reports whether a file of src builds with tags on linux/amd64.
func builds(t *testing.T, src string, tags []string) bool {
	t.Helper()
	for _, line := range strings.Split(src, "\n") {
		if strings.HasPrefix(line, "package ") {
			return true
		}
		if !constraint.IsGoBuild(line) {
			continue
		}
		expr, err := constraint.Parse(line)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		return expr.Eval(func(tag string) bool { return tag == "linux" || tag == "amd64" || slices.Contains(tags, tag) })
	}
	return true
}

// TestTemplatePlacesWhatMakeBenchRuns: every benchmark and test the
// Makefile's bench target runs has a place in the template, and the
// template places nothing else, so a new benchmark fails here, not after
// an hour of make bench.
func TestTemplatePlacesWhatMakeBenchRuns(t *testing.T) {
	var ran []string
	for _, c := range benchCommands(t) {
		names := ranBy(t, c)
		if len(names) == 0 {
			t.Errorf("%s runs nothing this test finds", c.line)
		}
		ran = append(ran, names...)
	}
	placed := placedBy(t, defaultTemplate)
	for _, name := range ran {
		if !slices.Contains(placed, name) {
			t.Errorf("make bench runs %s, which hack/benchreport/performance.md.tmpl does not place", name)
		}
	}
	for _, name := range placed {
		if !slices.Contains(ran, name) {
			t.Errorf("hack/benchreport/performance.md.tmpl places %s, which make bench does not run", name)
		}
	}
	for _, p := range floorPairs() {
		if !slices.Contains(placed, p.bench) {
			t.Errorf("floor pair %s / %s of %s, which the template does not place", p.value, p.floor, p.bench)
		}
	}
}

func TestParseGoTest(t *testing.T) {
	c, ok := parseGoTest(`	$(GO) test -tags routing -count=1 -run '^TestSpeakerFabric(BFD)?$' -v ./test/e2e/ -args -bfd-trials=50 2>&1 | tee x | grep -E 'a|b'`)
	want := benchCommand{tags: []string{"routing"}, run: "^TestSpeakerFabric(BFD)?$", packageDirs: []string{"./test/e2e"}}
	c.line = ""
	if !ok || !slices.Equal(c.tags, want.tags) || c.run != want.run || c.bench != "" || !slices.Equal(c.packageDirs, want.packageDirs) {
		t.Errorf("got %+v, want %+v", c, want)
	}
	c, _ = parseGoTest(`	$(GO) test -run '^$' -bench 'BenchmarkDiff|BenchmarkRelayCheck' -benchmem ./ipvs/ ./bfd/ | tee x`)
	if c.bench != "BenchmarkDiff|BenchmarkRelayCheck" || c.run != "^$" || !slices.Equal(c.packageDirs, []string{"./ipvs", "./bfd"}) {
		t.Errorf("got %+v", c)
	}
}
