package main

import (
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func twoPlatforms() []PlatformBinary {
	return []PlatformBinary{{OS: "linux", Arch: "amd64", Binary: hello}, {OS: "linux", Arch: "arm64", Binary: helloARM64}}
}

// TestIndexTwoPlatforms builds the index a release pushes: one OCI image
// per platform under one index, reproducible, each platform's entrypoint
// a static binary of its own architecture.
func TestIndexTwoPlatforms(t *testing.T) {
	s := Spec{Name: "vipcast/vipcast-speaker", Tag: "v0.1.0", Created: epoch}
	DefaultsFor(&s)
	idx, err := BuildIndex(s, twoPlatforms())
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIImageIndex || len(m.Manifests) != 2 {
		t.Fatalf("index %s with %d manifests, want an OCI index of 2", m.MediaType, len(m.Manifests))
	}
	checks, err := CheckIndex(idx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"linux/amd64": "EM_X86_64", "linux/arm64": "EM_AARCH64"}
	for _, c := range checks {
		if want[c.Platform] != c.Machine || c.Entrypoint != "/usr/local/bin/vipcast-speaker" {
			t.Errorf("%s, want machine %s and entrypoint /usr/local/bin/vipcast-speaker", c, want[c.Platform])
		}
		delete(want, c.Platform)
	}
	if len(want) > 0 {
		t.Errorf("no check for %v", want)
	}
	again, err := BuildIndex(s, twoPlatforms())
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := idx.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("two builds of the same index: %s and %s, want one digest", d1, d2)
	}
}

// TestIndexRefuses checks the inputs a release must not publish: an
// arm64 entry holding an amd64 binary, a platform twice, a malformed
// argument, and an index whose config lies about its architecture.
func TestIndexRefuses(t *testing.T) {
	s := Spec{Name: "vipcast/vipcast-ccm", Tag: "v0.1.0", Created: epoch}
	if _, err := BuildIndex(s, []PlatformBinary{{OS: "linux", Arch: "arm64", Binary: hello}}); err == nil || !strings.Contains(err.Error(), "does not match architecture arm64") {
		t.Errorf("an amd64 binary as linux/arm64: %v, want a refusal naming the architecture", err)
	}
	if _, err := BuildIndex(s, []PlatformBinary{{OS: "linux", Arch: "amd64", Binary: hello}, {OS: "linux", Arch: "amd64", Binary: hello}}); err == nil {
		t.Error("linux/amd64 twice: accepted")
	}
	for _, arg := range []string{"linux/arm64", "arm64=x", "linux/=x", "linux/arm64/v8/x=y", "=x"} {
		if _, err := ParsePlatformBinary(arg); err == nil {
			t.Errorf("ParsePlatformBinary(%q): accepted", arg)
		}
	}
	if b, err := ParsePlatformBinary("linux/arm64=bin/x"); err != nil || b != (PlatformBinary{OS: "linux", Arch: "arm64", Binary: "bin/x"}) {
		t.Errorf("ParsePlatformBinary: %+v, %v", b, err)
	}
	// An amd64 image listed as arm64: the descriptor and config disagree.
	img, err := Build(Spec{Binary: hello, Name: s.Name, Tag: s.Tag, Created: epoch, Format: FormatOCI})
	if err != nil {
		t.Fatal(err)
	}
	forged := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	if _, err := CheckIndex(forged); err == nil || !strings.Contains(err.Error(), "linux/amd64") {
		t.Errorf("an amd64 image listed as linux/arm64: %v, want a refusal", err)
	}
	// The config agrees, the binary does not.
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = "arm64"
	lying, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	forged = mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
		mutate.IndexAddendum{Add: lying, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	if _, err := CheckIndex(forged); err == nil || !strings.Contains(err.Error(), "EM_X86_64 does not match architecture arm64") {
		t.Errorf("an amd64 binary in an image that says arm64: %v, want a refusal naming the ELF machine", err)
	}
}

// TestIndexCommandPushes runs `image index` and `image check` against a
// registry on loopback: the index pushed, read back with the same digest
// and checked, and written as an OCI layout.
func TestIndexCommandPushes(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	repo := u.Host + "/vipcast/vipcast-speaker"
	out := filepath.Join(t.TempDir(), "layout")
	var stdout bytes.Buffer
	if err := run([]string{"index", "-plain-http", "-repository", repo, "-tag", "v0.1.0", "-created", "0", "-out", out,
		"linux/amd64=" + hello, "linux/arm64=" + helloARM64}, &stdout); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"linux/arm64", "EM_AARCH64", "linux/amd64", "EM_X86_64", repo + ":v0.1.0\tsha256:"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("image index printed:\n%s\nwant %q", stdout.String(), want)
		}
	}
	ref, err := name.NewTag(repo+":v0.1.0", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	served, err := remote.Index(ref)
	if err != nil {
		t.Fatal(err)
	}
	p, err := layout.FromPath(out)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil || len(tm.Manifests) != 1 {
		t.Fatalf("the layout's index: %+v, %v; want one entry", tm, err)
	}
	if d, _ := served.Digest(); tm.Manifests[0].Digest != d || tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != ref.String() {
		t.Errorf("the layout lists %s (%v), the registry serves %s under %s", tm.Manifests[0].Digest, tm.Manifests[0].Annotations, d, ref)
	}
	stdout.Reset()
	if err := run([]string{"check", "-plain-http", ref.String()}, &stdout); err != nil || strings.Count(stdout.String(), "static ELF binary") != 2 {
		t.Errorf("image check: %v\n%s", err, stdout.String())
	}
	if err := run([]string{"check", "-plain-http", u.Host + "/vipcast/none:v0.1.0"}, &stdout); err == nil {
		t.Error("image check of an image the registry does not have: no error")
	}
	if err := os.RemoveAll(out); err != nil {
		t.Fatal(err)
	}
}
