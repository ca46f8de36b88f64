package lab

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestGettingStartedPage checks that docs/getting-started.md still has the
// blocks TestCluster/getting-started follows, in the places it follows
// them, and every text the lab's edits replace: a change to the page that
// the lab would no longer follow fails here, in seconds, not in the lab.
func TestGettingStartedPage(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	p, err := ReadPage(filepath.Join(root, GettingStartedPage))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(GettingStartedEdits("registry.example:5000/vipcast", "0.1.0-lab")); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		step, lang string
		i          int
		file       string   // the name it is saved as
		commands   []string // a text each command holds, in order
	}{
		{"2. ", "sh", 0, "", []string{"REGISTRY=registry.example:5000/vipcast", "VERSION=0.1.0-lab"}},
		{"2. ", "yaml", 0, "my-values.yaml", nil},
		{"2. ", "sh", 1, "", []string{"helm install vipcast oci://$REGISTRY/charts/vipcast --version $VERSION --plain-http"}},
		{"2. ", "sh", 2, "", []string{"get pods", "get lease vipcast-ccm", "get nodes"}},
		{"3. ", "yaml", 0, "pool.yaml", nil},
		{"3. ", "sh", 0, "", []string{"apply -f pool.yaml", "get ippools"}},
		{"4. ", "yaml", 0, "peer.yaml", nil},
		{"4. ", "sh", 0, "", []string{"create secret generic tor-a-md5", "apply -f peer.yaml"}},
		{"5. ", "", 0, "", nil},
		{"5. ", "sh", 0, "", []string{"get bgppeers", "describe bgppeer", "# on a node", "# at the router"}},
		{"6. ", "sh", 0, "", []string{"--image=" + BackendImage, "--port=80 --target-port=8080"}},
		{"6. ", "sh", 1, "", []string{"get service web", "get speakerstatuses", "# at the router", "# from a client"}},
	}
	for _, w := range want {
		blocks, err := p.Step(w.step)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Block(blocks, w.lang, w.i)
		if err != nil {
			t.Fatal(err)
		}
		cmds := Commands(b.Text)
		if w.commands != nil {
			if len(cmds) != len(w.commands) {
				t.Errorf("%s:%d: %d commands %q, want %d", p.Path, b.Line, len(cmds), cmds, len(w.commands))
				continue
			}
			for i, c := range cmds {
				if !strings.Contains(c, w.commands[i]) {
					t.Errorf("%s:%d: command %d is %q, want it to hold %q", p.Path, b.Line, i+1, c, w.commands[i])
				}
			}
		}
		if w.file != "" {
			next, _ := Block(blocks, "sh", 0)
			if w.step == "2. " {
				next, _ = Block(blocks, "sh", 1)
			}
			if got := FileNamed(b, Commands(next.Text)); got != w.file {
				t.Errorf("%s:%d: the block is saved as %q, want %q", p.Path, b.Line, got, w.file)
			}
		}
	}
}

func TestReadPageAndCommands(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.md")
	page := "# T\n\n```sh\nbefore\n```\n\n## 1. One\n\n```yaml\n# a.yaml\nk: v\n```\n\n```sh\n# a comment\nhelm install x \\\n  --wait   # note\n\nkubectl apply -f b.yaml\n```\n\n## 2. Two\n\n```\nrouter bgp 1\n```\n"
	if err := os.WriteFile(path, []byte(page), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := ReadPage(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range p.Blocks {
		got = append(got, b.Section+"|"+b.Lang+"|"+b.Text)
	}
	want := []string{"|sh|before\n", "1. One|yaml|# a.yaml\nk: v\n", "1. One|sh|# a comment\nhelm install x \\\n  --wait   # note\n\nkubectl apply -f b.yaml\n", "2. Two||router bgp 1\n"}
	if !slices.Equal(got, want) {
		t.Errorf("blocks %q, want %q", got, want)
	}
	if c := Commands(p.Blocks[2].Text); !slices.Equal(c, []string{"helm install x    --wait   # note", "kubectl apply -f b.yaml"}) {
		t.Errorf("commands %q", c)
	}
	if f := FileNamed(p.Blocks[1], nil); f != "a.yaml" {
		t.Errorf("FileNamed by comment = %q", f)
	}
	if f := FileNamed(PageBlock{Text: "k: v\n"}, Commands(p.Blocks[2].Text)); f != "b.yaml" {
		t.Errorf("FileNamed by -f = %q", f)
	}
	if _, err := p.Step("3. "); err == nil {
		t.Error("Step of a missing section: no error")
	}
	if err := p.Apply([]PageEdit{{From: "nowhere", To: "x", Why: "w"}}); err == nil || !strings.Contains(err.Error(), `"nowhere"`) {
		t.Errorf("Apply of an edit the page lacks: %v", err)
	}
	if err := os.WriteFile(path, []byte("```sh\nopen\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPage(path); err == nil || !strings.Contains(err.Error(), ":1:") {
		t.Errorf("unclosed fence: %v", err)
	}
}

// TestTableCell reads kubectl's aligned tables, with headers of two words
// and empty cells.
func TestTableCell(t *testing.T) {
	out := `NAME     ADDRESSES          IPV4 CAPACITY   IPV4 IN USE   IPV6 CAPACITY   IPV6 IN USE   READY   AGE
public   ["192.0.2.0/24"]   254             0                                           True    61s
other    ["10.0.0.0/8"]     16777214        3             12              1             False   5s
`
	for _, c := range []struct{ row, col, want string }{
		{"public", "READY", "True"}, {"public", "IPV6 CAPACITY", ""}, {"public", "IPV4 CAPACITY", "254"},
		{"other", "IPV6 IN USE", "1"}, {"other", "AGE", "5s"}, {"other", "READY", "False"},
	} {
		if got, ok := TableCell(out, c.row, c.col); !ok || got != c.want {
			t.Errorf("TableCell(%s, %s) = %q, %v; want %q", c.row, c.col, got, ok, c.want)
		}
	}
	if _, ok := TableCell(out, "public", "NOPE"); ok {
		t.Error("a column that is not there was found")
	}
	if _, ok := TableCell(out, "gone", "READY"); ok {
		t.Error("a row that is not there was found")
	}
}
