package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// hello and helloARM64 are a tiny static binary for linux/amd64 and
// linux/arm64, built once for all tests.
var hello, helloARM64 string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "image-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		src := filepath.Join(dir, "hello.go")
		if err := os.WriteFile(src, []byte("package main\n\nfunc main() { println(\"hello\") }\n"), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		gobin, err := exec.LookPath("go")
		if err != nil {
			fmt.Fprintln(os.Stderr, "go toolchain not found:", err)
			return 1
		}
		hello, helloARM64 = filepath.Join(dir, "hello"), filepath.Join(dir, "hello-arm64")
		for arch, out := range map[string]string{"amd64": hello, "arm64": helloARM64} {
			cmd := exec.Command(gobin, "build", "-trimpath", "-ldflags=-s -w", "-o", out, "hello.go")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch, "GO111MODULE=on", "GOWORK=off", "GOFLAGS=")
			if out, err := cmd.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "building the test binary for %s: %v\n%s", arch, err, out)
				return 1
			}
		}
		return m.Run()
	}())
}

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func spec(t *testing.T, repo, format string) Spec {
	t.Helper()
	s := Spec{Binary: hello, Name: repo, Tag: "v0.0.0-test", Created: epoch, Format: format}
	DefaultsFor(&s)
	return s
}

func build(t *testing.T, s Spec, out string) v1.Hash {
	t.Helper()
	img, err := Build(s)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	d, err := Write(s, img, out)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	return d
}

// checkImage verifies config and layer of an image read back from disk.
func checkImage(t *testing.T, img v1.Image, base, user, tag string) {
	t.Helper()
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	target := "/usr/local/bin/" + base
	if got := cf.Config.Entrypoint; len(got) != 1 || got[0] != target {
		t.Errorf("entrypoint = %q, want [%s]", got, target)
	}
	if cf.Config.User != user {
		t.Errorf("user = %q, want %q", cf.Config.User, user)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("platform = %s/%s, want linux/amd64", cf.OS, cf.Architecture)
	}
	if !cf.Created.Equal(epoch) {
		t.Errorf("created = %v, want %v", cf.Created.Time, epoch)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.title":   base,
		"org.opencontainers.image.version": tag,
	} {
		if got := cf.Config.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	if d := cf.Config.Labels["org.opencontainers.image.description"]; d == "" || strings.Contains(d, "/") {
		t.Errorf("description %q: want a non-empty, path-free text", d)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("%d layers, want 1", len(layers))
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	want, err := os.ReadFile(hello)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(rc)
	found := false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: owner %d:%d (%q:%q), want root 0:0 without names", h.Name, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		if !h.ModTime.Equal(epoch) {
			t.Errorf("%s: mtime %v, want %v", h.Name, h.ModTime, epoch)
		}
		if h.Name != strings.TrimPrefix(target, "/") {
			if h.Typeflag != tar.TypeDir {
				t.Errorf("unexpected entry %s in the layer", h.Name)
			}
			continue
		}
		found = true
		if h.Typeflag != tar.TypeReg || h.Mode != 0o755 {
			t.Errorf("%s: type %c mode %o, want a regular file 0755", h.Name, h.Typeflag, h.Mode)
		}
		got, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: content differs from the binary", h.Name)
		}
	}
	if !found {
		t.Errorf("%s not in the layer", target)
	}
}

func TestDockerTarballSpeaker(t *testing.T) {
	dir := t.TempDir()
	s := spec(t, "vipcast/vipcast-speaker", FormatDocker)
	out1 := filepath.Join(dir, "a", "speaker.tar")
	d1 := build(t, s, out1)

	tag, err := name.NewTag("vipcast/vipcast-speaker:v0.0.0-test")
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out1, &tag)
	if err != nil {
		t.Fatalf("reading the tarball back: %v", err)
	}
	if got, _ := img.Digest(); got != d1 {
		t.Errorf("digest read back %s, built %s", got, d1)
	}
	if mt, _ := img.MediaType(); mt != types.DockerManifestSchema2 {
		t.Errorf("manifest media type %s", mt)
	}
	checkImage(t, img, "vipcast-speaker", "0:0", "v0.0.0-test")

	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(out1) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || len(m[0].RepoTags) != 1 || m[0].RepoTags[0] != "vipcast/vipcast-speaker:v0.0.0-test" {
		t.Errorf("manifest.json = %+v, want one RepoTag vipcast/vipcast-speaker:v0.0.0-test", m)
	}

	// Reproducible: a second build gives the same digest and the same bytes.
	out2 := filepath.Join(dir, "b", "speaker.tar")
	if d2 := build(t, s, out2); d2 != d1 {
		t.Errorf("second build digest %s != %s", d2, d1)
	}
	b1, _ := os.ReadFile(out1)
	b2, _ := os.ReadFile(out2)
	if !bytes.Equal(b1, b2) {
		t.Error("the two tarballs differ")
	}

	// A different creation time is a different image.
	s.Created = epoch.Add(time.Second)
	if d3 := build(t, s, filepath.Join(dir, "c.tar")); d3 == d1 {
		t.Error("changing the creation time did not change the digest")
	}
}

func TestDockerTarballCCMNonRoot(t *testing.T) {
	out := filepath.Join(t.TempDir(), "ccm.tar")
	d := build(t, spec(t, "vipcast/vipcast-ccm", FormatDocker), out)
	img, err := tarball.ImageFromPath(out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := img.Digest(); got != d {
		t.Errorf("digest read back %s, built %s", got, d)
	}
	checkImage(t, img, "vipcast-ccm", "65532:65532", "v0.0.0-test")
}

func TestOCILayout(t *testing.T) {
	dir := t.TempDir()
	s := spec(t, "vipcast/vipcast-ccm", FormatOCI)
	lay := filepath.Join(dir, "layout")
	d := build(t, s, lay)

	idx, err := layout.ImageIndexFromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("%d manifests in index.json, want 1", len(im.Manifests))
	}
	desc := im.Manifests[0]
	if desc.Digest != d {
		t.Errorf("index digest %s, built %s", desc.Digest, d)
	}
	if got := desc.Annotations["org.opencontainers.image.ref.name"]; got != "vipcast/vipcast-ccm:v0.0.0-test" {
		t.Errorf("ref.name = %q", got)
	}
	if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != "amd64" {
		t.Errorf("platform = %+v", desc.Platform)
	}
	img, err := idx.Image(d)
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", mt)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.MediaType != types.OCIConfigJSON || m.Layers[0].MediaType != types.OCILayer {
		t.Errorf("media types config %s layer %s", m.Config.MediaType, m.Layers[0].MediaType)
	}
	checkImage(t, img, "vipcast-ccm", "65532:65532", "v0.0.0-test")

	// The .tar form (oci-archive) is reproducible too and holds the layout.
	a1, a2 := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	if d1, d2 := build(t, s, a1), build(t, s, a2); d1 != d || d2 != d {
		t.Errorf("oci-archive digests %s %s, want %s", d1, d2, d)
	}
	b1, _ := os.ReadFile(a1)
	b2, _ := os.ReadFile(a2)
	if !bytes.Equal(b1, b2) {
		t.Error("the two OCI archives differ")
	}
	names := map[string]bool{}
	tr := tar.NewReader(bytes.NewReader(b1))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
	}
	for _, n := range []string{"oci-layout", "index.json", "blobs/sha256/" + d.Hex} {
		if !names[n] {
			t.Errorf("%s missing from the OCI archive (have %v)", n, names)
		}
	}
}

func TestMultiImageMode(t *testing.T) {
	dir := t.TempDir()
	bin, err := os.ReadFile(hello)
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	for _, b := range []string{"vipcast-ccm", "vipcast-speaker"} {
		p := filepath.Join(dir, "bin", b)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bin, 0o755); err != nil {
			t.Fatal(err)
		}
		args = append(args, p)
	}
	out := filepath.Join(dir, "images")
	if err := run(append([]string{"-tag", "v1.2.3", "-outdir", out, "-created", epoch.Format(time.RFC3339)}, args...), io.Discard); err != nil {
		t.Fatal(err)
	}
	for b, user := range map[string]string{"vipcast-ccm": "65532:65532", "vipcast-speaker": "0:0"} {
		tag, _ := name.NewTag("vipcast/" + b + ":v1.2.3")
		img, err := tarball.ImageFromPath(filepath.Join(out, b+".tar"), &tag)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		checkImage(t, img, b, user, "v1.2.3")
	}

	// Single-image mode with -user none leaves the user unset.
	one := filepath.Join(dir, "one.tar")
	if err := run([]string{"-binary", args[1], "-name", "vipcast/vipcast-speaker", "-tag", "x", "-out", one, "-user", "none"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(one, nil)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	if cf.Config.User != "" {
		t.Errorf("user = %q, want unset", cf.Config.User)
	}
	if !cf.Created.Equal(time.Unix(0, 0)) && os.Getenv("SOURCE_DATE_EPOCH") == "" {
		t.Errorf("default creation time %v, want the Unix epoch", cf.Created.Time)
	}
}

func TestRejects(t *testing.T) {
	dir := t.TempDir()
	notELF := filepath.Join(dir, "script")
	if err := os.WriteFile(notELF, []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cases := map[string]Spec{
		"not ELF":       {Binary: notELF, Name: "vipcast/x", Tag: "v1"},
		"wrong arch":    {Binary: hello, Name: "vipcast/x", Tag: "v1", Arch: "arm64"},
		"missing file":  {Binary: filepath.Join(dir, "nope"), Name: "vipcast/x", Tag: "v1"},
		"registry host": {Binary: hello, Name: "host.invalid/vipcast/x", Tag: "v1"},
	}
	// A dynamically linked binary of the host, when there is one.
	for _, p := range []string{"/bin/sh", "/bin/ls", "/usr/bin/env"} {
		if f, err := elf.Open(p); err == nil {
			dynamic := false
			for _, pr := range f.Progs {
				dynamic = dynamic || pr.Type == elf.PT_INTERP
			}
			f.Close()
			if dynamic && f.Machine == elf.EM_X86_64 {
				cases["dynamic"] = Spec{Binary: p, Name: "vipcast/x", Tag: "v1"}
				break
			}
		}
	}
	for n, s := range cases {
		t.Run(n, func(t *testing.T) {
			img, err := Build(s)
			if err == nil {
				_, err = Write(s, img, filepath.Join(dir, "out.tar"))
			}
			if err == nil {
				t.Fatal("accepted")
			}
			t.Log(err)
		})
	}
	if err := run([]string{"-tag", "v1", "-format", "zip", hello}, io.Discard); err == nil {
		t.Error("unknown format accepted")
	}
	if err := run([]string{"-binary", hello, "-tag", "v1"}, io.Discard); err == nil {
		t.Error("-binary without -name/-out accepted")
	}
}

// TestBaseLayerPathCmd: a test image with a userland (-base), its binary
// at a path of its own (-path) and default arguments (-cmd) has two
// layers — the tree as it is on disk (modes and symbolic links kept,
// owned by root at the creation time), then the binary — the binary as
// its entrypoint and the arguments as its command; it stays
// reproducible, and a device in the tree is refused with its name.
func TestBaseLayerPathCmd(t *testing.T) {
	base := t.TempDir()
	for _, d := range []string{"usr/bin", "etc"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(base, "usr/bin/tool"), []byte("#!/bin/true\n"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "etc/hosts"), []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/bin", filepath.Join(base, "bin")); err != nil {
		t.Fatal(err)
	}
	s := Spec{Binary: hello, Name: "vipcast/e2e-agnhost", Tag: "2.66.1", Created: epoch, Format: FormatDocker,
		Path: "/agnhost", Cmd: []string{"pause"}, Base: base}
	dir := t.TempDir()
	d1 := build(t, s, filepath.Join(dir, "a.tar"))
	if d2 := build(t, s, filepath.Join(dir, "b.tar")); d2 != d1 {
		t.Errorf("second build digest %s != %s", d2, d1)
	}
	img, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := cf.Config.Entrypoint; len(got) != 1 || got[0] != "/agnhost" {
		t.Errorf("entrypoint %q, want [/agnhost]", got)
	}
	if got := cf.Config.Cmd; len(got) != 1 || got[0] != "pause" {
		t.Errorf("cmd %q, want [pause]", got)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 2 {
		t.Fatalf("%d layers, want 2 (the tree, then the binary)", len(layers))
	}
	type entry struct {
		typ  byte
		mode int64
		link string
		body string
	}
	read := func(l v1.Layer) map[string]entry {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		got := map[string]entry{}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				return got
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(epoch) {
				t.Errorf("%s: owner %d:%d mtime %v, want 0:0 at %v", h.Name, h.Uid, h.Gid, h.ModTime, epoch)
			}
			b, _ := io.ReadAll(tr)
			if h.Typeflag == tar.TypeReg && len(b) > 64 {
				b = b[:0] // the binary: its size says enough here
			}
			got[h.Name] = entry{h.Typeflag, h.Mode, h.Linkname, string(b)}
		}
	}
	want := map[string]entry{
		"bin":          {tar.TypeSymlink, 0o777, "usr/bin", ""},
		"etc/":         {tar.TypeDir, 0o755, "", ""},
		"etc/hosts":    {tar.TypeReg, 0o644, "", "127.0.0.1 localhost\n"},
		"usr/":         {tar.TypeDir, 0o755, "", ""},
		"usr/bin/":     {tar.TypeDir, 0o755, "", ""},
		"usr/bin/tool": {tar.TypeReg, 0o750, "", "#!/bin/true\n"},
	}
	if got := read(layers[0]); !reflect.DeepEqual(got, want) {
		t.Errorf("the tree's layer:\n got %v\nwant %v", got, want)
	}
	if got := read(layers[1]); len(got) != 1 || got["agnhost"].typ != tar.TypeReg || got["agnhost"].mode != 0o755 {
		t.Errorf("the binary's layer: %v, want agnhost alone, a regular file 0755", got)
	}

	s.Path = "agnhost"
	if _, err := Build(s); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("a relative -path: error %v, want one that asks for an absolute path", err)
	}
	s.Path = "/agnhost"
	if err := syscall.Mkfifo(filepath.Join(base, "etc/fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Build(s); err == nil || !strings.Contains(err.Error(), "etc/fifo") {
		t.Errorf("a FIFO in the tree: error %v, want one that names etc/fifo", err)
	}
}
