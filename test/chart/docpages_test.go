package chart

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// readmeMaxWords is the README's budget: a front door that says what
// vipcast is, how to start and where to read on, and no more.
const readmeMaxWords = 1500

// The user pages say what vipcast does, in the present tense; the tests
// that show it, dated figures and the history of issues belong to the
// maintainers' pages under docs/dev.
var (
	testName   = regexp.MustCompile(`\bTest[A-Z][A-Za-z0-9_]*`)
	date       = regexp.MustCompile(`\b20\d\d-\d\d-\d\d\b`)
	issueTrail = regexp.MustCompile(`(?i)\bissue \d+`)
)

// TestDocPages keeps the documentation's shape: a short README, user pages
// without test names, dates or issue history, and relative links (with
// their anchors) that lead somewhere.
func TestDocPages(t *testing.T) {
	root := filepath.Join(Dir(), "..", "..")

	t.Run("README is short", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(root, "README.md"))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(strings.Fields(string(data))); n >= readmeMaxWords {
			t.Errorf("README.md has %d words, want fewer than %d: move detail to docs/", n, readmeMaxWords)
		}
	})

	t.Run("user pages hold no test names, dates or issue history", func(t *testing.T) {
		pages := globs(t, root, "README.md", "docs/*.md", "docs/reference/*.md")
		for _, p := range pages {
			data, err := os.ReadFile(filepath.Join(root, p))
			if err != nil {
				t.Fatal(err)
			}
			for i, line := range strings.Split(string(data), "\n") {
				for _, c := range []struct {
					re   *regexp.Regexp
					what string
				}{
					{testName, "a test name (the matrix in docs/dev/verified.md names the tests)"},
					{date, "a date (figures go to docs/dev/figures.md, or make bench's docs/dev/performance.md)"},
					{issueTrail, "issue history"},
				} {
					for _, m := range c.re.FindAllString(line, -1) {
						t.Errorf("%s:%d: %q is %s", p, i+1, m, c.what)
					}
				}
			}
		}
	})

	t.Run("relative links lead somewhere", func(t *testing.T) {
		pages := globs(t, root, "README.md", "CHANGELOG.md", "CONTRIBUTING.md", "SECURITY.md")
		err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".md") {
				rel, _ := filepath.Rel(root, p)
				pages = append(pages, rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		anchors := map[string]map[string]bool{}
		for _, p := range pages {
			data, err := os.ReadFile(filepath.Join(root, p))
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range links(string(data)) {
				if err := checkLink(root, p, l.target, anchors); err != nil {
					t.Errorf("%s:%d: ](%s): %v", p, l.line, l.target, err)
				}
			}
		}
	})
}

// globs lists the files the patterns match, relative to root; the README
// and the docs must exist, the other pages may not.
func globs(t *testing.T, root string, patterns ...string) []string {
	t.Helper()
	var files []string
	for _, pattern := range patterns {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		if len(m) == 0 && (pattern == "README.md" || strings.HasPrefix(pattern, "docs/")) {
			t.Fatalf("%s: no files", pattern)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(root, f)
			files = append(files, rel)
		}
	}
	return files
}

type link struct {
	line   int
	target string
}

var (
	fence     = regexp.MustCompile("^\\s*(```|~~~)")
	codeSpan  = regexp.MustCompile("`[^`]*`")
	linkStart = regexp.MustCompile(`\]\(([^()\s]+)\)`)
	external  = regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`)
)

// links returns the relative link targets of a markdown page, outside code
// blocks and code spans.
func links(page string) []link {
	var out []link
	inFence := false
	for i, line := range strings.Split(page, "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		line = codeSpan.ReplaceAllString(line, "")
		for _, m := range linkStart.FindAllStringSubmatch(line, -1) {
			if external.MatchString(m[1]) {
				continue
			}
			out = append(out, link{i + 1, m[1]})
		}
	}
	return out
}

// checkLink says what is wrong with a relative link from page: a file that
// does not exist, or an anchor that none of its headings makes.
func checkLink(root, page, target string, anchors map[string]map[string]bool) error {
	file, anchor, _ := strings.Cut(target, "#")
	dest := page
	if file != "" {
		dest = filepath.Join(filepath.Dir(page), file)
		if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
			return fmt.Errorf("%s does not exist", dest)
		}
	}
	if anchor == "" || !strings.HasSuffix(dest, ".md") {
		return nil
	}
	if anchors[dest] == nil {
		data, err := os.ReadFile(filepath.Join(root, dest))
		if err != nil {
			return err
		}
		anchors[dest] = headingSlugs(string(data))
	}
	if !anchors[dest][anchor] {
		return fmt.Errorf("%s has no heading whose anchor is #%s", dest, anchor)
	}
	return nil
}

var heading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)

// headingSlugs returns the anchors GitHub gives a page's headings: the
// text lowercased, without punctuation, spaces as hyphens, and -1, -2, ...
// after a repeated one.
func headingSlugs(page string) map[string]bool {
	slugs := map[string]bool{}
	seen := map[string]int{}
	inFence := false
	for _, line := range strings.Split(page, "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		m := heading.FindStringSubmatch(line)
		if inFence || m == nil {
			continue
		}
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			slugs[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			slugs[s] = true
		}
		seen[s]++
	}
	return slugs
}

// mdLink is a markdown link, whose text alone a heading's anchor keeps.
var mdLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// slug is GitHub's anchor for a heading's text.
func slug(text string) string {
	text = mdLink.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
