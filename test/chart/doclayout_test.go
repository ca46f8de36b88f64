package chart

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// layoutPage holds the layout table, the one map of the repository.
const layoutPage = "docs/dev/development.md"

// TestLayoutTableCoversEveryPackage checks that the layout table of
// docs/dev/development.md, the one map of the repository, names every
// directory that holds Go code: by its own row, or by a row for a directory
// above it.
func TestLayoutTableCoversEveryPackage(t *testing.T) {
	root := filepath.Join(Dir(), "..", "..")
	page, err := os.ReadFile(filepath.Join(root, layoutPage))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(page), "\n## Layout\n")
	if !ok {
		t.Fatalf("%s has no \"## Layout\" section", layoutPage)
	}
	if end := strings.Index(table, "\n## "); end >= 0 {
		table = table[:end]
	}
	path := regexp.MustCompile("`([a-z0-9_./-]+)`")
	var rows []string
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		for _, m := range path.FindAllStringSubmatch(cells[1], -1) {
			rows = append(rows, strings.TrimSuffix(m[1], "/"))
		}
	}
	if len(rows) < 10 {
		t.Fatalf("the layout table names %d paths: %q", len(rows), rows)
	}
	var dirs []string
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && p != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(name, ".go") {
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			if rel != "." && !slices.Contains(dirs, rel) {
				dirs = append(dirs, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if !slices.ContainsFunc(rows, func(r string) bool { return d == r || strings.HasPrefix(d, r+"/") }) {
			t.Errorf("%s holds Go code but no row of the layout table in %s names it or a directory above it", d, layoutPage)
		}
	}
	for _, r := range rows {
		if _, err := os.Stat(filepath.Join(root, r)); err != nil {
			t.Errorf("the layout table names %s, which does not exist", r)
		}
	}
}
