package chart

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReleaseRefusesBadInput runs hack/release.sh (make release) with
// what a maintainer can get wrong: each is refused before anything is
// built or pushed, with a message that names the variable and the fix.
func TestReleaseRefusesBadInput(t *testing.T) {
	root := filepath.Join(Dir(), "..", "..")
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"no registry", []string{"VERSION=0.1.0"}, "set REGISTRY=HOST[:PORT]/PATH"},
		{"no version", []string{"REGISTRY=registry.example/vipcast"}, "set VERSION"},
		{"a commit, not a version", []string{"REGISTRY=registry.example/vipcast", "VERSION=9f6b5b3-dirty"}, "VERSION=9f6b5b3-dirty is not a semantic version"},
		{"a scheme", []string{"REGISTRY=https://registry.example/vipcast", "VERSION=0.1.0"}, "without a scheme"},
		{"no changelog entry", []string{"REGISTRY=registry.example/vipcast", "VERSION=99.0.0"}, `CHANGELOG.md has no entry "## [99.0.0]"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command("bash", filepath.Join(root, "hack", "release.sh"))
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "RELEASE_DIR=" + t.TempDir()}, tc.env...)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Errorf("release.sh with %v: %v, %q; want a refusal saying %q", tc.env, err, out, tc.want)
			}
			if strings.Contains(string(out), ">> building") {
				t.Errorf("release.sh with %v started building before refusing: %s", tc.env, out)
			}
		})
	}
}

// TestChangelogHasTheChartVersion checks that CHANGELOG.md has an entry
// for the chart's version, which make release requires of a release.
func TestChangelogHasTheChartVersion(t *testing.T) {
	chart, err := os.ReadFile(filepath.Join(Dir(), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^version: *"?([^"\s]+)`).FindSubmatch(chart)
	if m == nil {
		t.Fatal("Chart.yaml has no version")
	}
	log, err := os.ReadFile(filepath.Join(Dir(), "..", "..", "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "\n## ["+string(m[1])+"]") {
		t.Errorf("CHANGELOG.md has no entry \"## [%s]\", the chart's version", m[1])
	}
}
