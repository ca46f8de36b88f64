package chart

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// unqualified finds vipcast's plurals and singular names not followed by
// the group: kubectl would resolve them to another product's resource.
var unqualified = regexp.MustCompile(`\b(ippools?|bgppeers?)\b(\.vipcast\.io)?`)

// TestDocsQualifyNames checks that every kubectl command the documentation,
// the chart's notes, the lab and the Makefile show names vipcast's
// resources by the qualified names (test/e2e TestResourceNames shows why), and that
// the README gives the CRDs' short names and their category.
func TestDocsQualifyNames(t *testing.T) {
	root := filepath.Join(Dir(), "..", "..")
	var files []string
	for _, pattern := range []string{"README.md", "docs/*.md", "docs/dev/*.md", "docs/dev/design/*.md", "CHANGELOG.md", "charts/vipcast/values.yaml", "charts/vipcast/templates/*", "test/lab/*.go", "test/lab/cmd/lab/*.go", "Makefile", "hack/*.sh"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil || len(m) == 0 {
			t.Fatalf("%s: no files (err %v)", pattern, err)
		}
		files = append(files, m...)
	}
	commands := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for i, line := range strings.Split(string(data), "\n") {
			// Each command runs from "kubectl" to the end of its code
			// span, table cell or shell comment.
			for _, cmd := range strings.Split(line, "kubectl")[1:] {
				if end := strings.IndexAny(cmd, "`|#"); end >= 0 {
					cmd = cmd[:end]
				}
				commands++
				for _, m := range unqualified.FindAllStringSubmatch(cmd, -1) {
					if m[2] == "" {
						t.Errorf("%s:%d: kubectl%s: write %s.vipcast.io (or a short name)", rel, i+1, cmd, m[1])
					}
				}
			}
		}
	}
	if commands < 20 {
		t.Errorf("only %d kubectl commands found in %v", commands, files)
	}

	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Render(release, namespace, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"`kubectl get vipcast`"}
	for _, crd := range r.CRDs {
		short, _, _ := unstructured.NestedStringSlice(crd.Object, "spec", "names", "shortNames")
		for _, s := range short {
			want = append(want, "`"+s+"`")
		}
		want = append(want, "`"+crd.GetName()+"`")
	}
	for _, w := range want {
		if !strings.Contains(string(readme), w) {
			t.Errorf("README.md does not mention %s", w)
		}
	}
}
