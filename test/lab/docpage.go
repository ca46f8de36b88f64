package lab

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// PageBlock is one fenced code block of a Markdown page.
type PageBlock struct {
	// Section is the text of the "## " heading the block is under ("" before
	// the first).
	Section string
	// Lang is the fence's info string ("sh", "yaml", "" for none).
	Lang string
	// Text is the block's content, each line ending in a newline.
	Text string
	// Line is the line of the opening fence, from 1.
	Line int
}

// Page is a Markdown page's fenced code blocks, in order.
type Page struct {
	Path   string
	Blocks []PageBlock
}

// ReadPage reads the fenced code blocks of the Markdown page at path. An
// unclosed fence is an error naming its line.
func ReadPage(path string) (*Page, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	p := &Page{Path: path}
	var (
		section string
		open    *PageBlock
		text    strings.Builder
	)
	s := bufio.NewScanner(f)
	for n := 1; s.Scan(); n++ {
		line := s.Text()
		switch {
		case open != nil && strings.TrimSpace(line) == "```":
			open.Text = text.String()
			p.Blocks = append(p.Blocks, *open)
			open = nil
		case open != nil:
			text.WriteString(line + "\n")
		case strings.HasPrefix(line, "```"):
			open = &PageBlock{Section: section, Lang: strings.TrimSpace(strings.TrimPrefix(line, "```")), Line: n}
			text.Reset()
		case strings.HasPrefix(line, "## "):
			section = strings.TrimSpace(strings.TrimPrefix(line, "## "))
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if open != nil {
		return nil, fmt.Errorf("%s:%d: a code block is never closed", path, open.Line)
	}
	return p, nil
}

// Step returns the blocks under the section that starts with prefix (such
// as "3. "), or an error naming the page when there is no such section or
// it has no block.
func (p *Page) Step(prefix string) ([]PageBlock, error) {
	var out []PageBlock
	for _, b := range p.Blocks {
		if strings.HasPrefix(b.Section, prefix) {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s has no code block under a section %q", p.Path, prefix+"…")
	}
	return out, nil
}

// Block returns the i-th block (from 0) of lang in blocks, or an error
// naming the section and what is missing.
func Block(blocks []PageBlock, lang string, i int) (PageBlock, error) {
	n := 0
	for _, b := range blocks {
		if b.Lang == lang {
			if n == i {
				return b, nil
			}
			n++
		}
	}
	section := ""
	if len(blocks) > 0 {
		section = blocks[0].Section
	}
	return PageBlock{}, fmt.Errorf("section %q has %d %q blocks, the lab follows block %d", section, n, lang, i+1)
}

// Commands splits a shell block into its commands: one per line, a line
// ending in a backslash joined with the next, blank and comment-only lines
// left out. Each keeps its trailing comment, which says where the page
// runs it.
func Commands(block string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(block, "\n") {
		if t := strings.TrimSpace(line); cur.Len() == 0 && (t == "" || strings.HasPrefix(t, "#")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		out = append(out, strings.TrimSpace(cur.String()))
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, strings.TrimSpace(cur.String()))
	}
	return out
}

// applyFile is a command's `-f FILE.yaml`.
var applyFile = regexp.MustCompile(`-f (\S+\.yaml)`)

// FileNamed returns the file a block is saved as: the name in its first
// line's comment ("# my-values.yaml"), else the `-f NAME.yaml` of the
// first command in cmds that has one; "" when neither names one.
func FileNamed(b PageBlock, cmds []string) string {
	first, _, _ := strings.Cut(b.Text, "\n")
	if name, ok := strings.CutPrefix(strings.TrimSpace(first), "# "); ok && strings.HasSuffix(name, ".yaml") && !strings.Contains(name, " ") {
		return name
	}
	for _, c := range cmds {
		if m := applyFile.FindStringSubmatch(c); m != nil {
			return m[1]
		}
	}
	return ""
}

// PageEdit is one change the lab makes to a page's commands before it
// runs them, where the lab cannot be the reader's cluster: From must occur
// on the page (Apply fails otherwise, so that an edit cannot silently stop
// applying), and Why says why the lab differs.
type PageEdit struct {
	From, To, Why string
}

// Apply makes each edit in every block of the page, and returns an error
// naming an edit whose From is nowhere on the page.
func (p *Page) Apply(edits []PageEdit) error {
	for _, e := range edits {
		found := false
		for i := range p.Blocks {
			if strings.Contains(p.Blocks[i].Text, e.From) {
				found = true
				p.Blocks[i].Text = strings.ReplaceAll(p.Blocks[i].Text, e.From, e.To)
			}
		}
		if !found {
			return fmt.Errorf("%s no longer has %q, which the lab replaces (%s): follow the page's change in the lab", p.Path, e.From, e.Why)
		}
	}
	return nil
}

// GettingStartedPage is the page TestCluster/getting-started follows.
const GettingStartedPage = "docs/getting-started.md"

// GettingStartedEdits are the changes the lab makes to the commands of
// GettingStartedPage: registry and version are the release the lab pushed
// (Lab.Registry, ChartVersion). The page's example numbers (the router
// 10.0.0.1 in AS 64500, the nodes in 10.0.0.0/24 and AS 64501) are the
// lab's own, and its pool 192.0.2.0/24 is used as it stands.
func GettingStartedEdits(registry, version string) []PageEdit {
	return []PageEdit{
		{From: "REGISTRY=<host[:port]/path>", To: "REGISTRY=" + registry, Why: "the lab's registry"},
		{From: "VERSION=<version>", To: "VERSION=" + version, Why: "the release the lab pushed"},
		{From: "--version $VERSION", To: "--version $VERSION --plain-http", Why: "the lab's registry serves plain HTTP on the host's loopback"},
		{From: "--image=nginx", To: "--image=" + BackendImage, Why: "the lab's nodes reach no public registry; its backend image is on them"},
		{From: "--port=80", To: "--port=80 --target-port=8080", Why: "the lab's backend listens on 8080, not nginx's 80"},
	}
}

// TableCell returns the cell of kubectl's table output in the column
// headed col and the row whose first cell is row. kubectl aligns its
// columns, and a cell may be empty, so cells are cut at the header's
// column positions.
func TableCell(out, row, col string) (string, bool) {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) < 2 {
		return "", false
	}
	header := lines[0]
	starts := []int{0}
	for i := 1; i < len(header); i++ {
		// Columns are two or more spaces apart; a header may hold one
		// ("IPV4 CAPACITY").
		if header[i] != ' ' && header[i-1] == ' ' && i >= 2 && header[i-2] == ' ' {
			starts = append(starts, i)
		}
	}
	at := -1
	for i, st := range starts {
		end := len(header)
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		if strings.TrimSpace(header[st:end]) == col {
			at = i
		}
	}
	if at < 0 {
		return "", false
	}
	cut := func(l string, i int) string {
		st := min(starts[i], len(l))
		end := len(l)
		if i+1 < len(starts) {
			end = min(starts[i+1], len(l))
		}
		return strings.TrimSpace(l[st:end])
	}
	for _, l := range lines[1:] {
		if cut(l, 0) == row {
			return cut(l, at), true
		}
	}
	return "", false
}
