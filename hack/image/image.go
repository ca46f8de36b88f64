package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Output formats.
const (
	// FormatDocker is a `docker save`-compatible tarball (manifest.json +
	// RepoTags). Accepted by `docker load`, `podman load`, `ctr images
	// import` and `kind load image-archive`; containerd normalises the
	// short RepoTag (vipcast/x:v) to the same full name the kubelet asks
	// for, so the image is usable by a Pod without a registry.
	FormatDocker = "docker"
	// FormatOCI is an OCI image layout: a directory, or, when the output
	// path ends in ".tar", the same layout in a tar (an "oci-archive").
	FormatOCI = "oci"
)

// BinDir is where the binary lands inside the image.
const BinDir = "/usr/local/bin"

// Spec describes one image.
type Spec struct {
	Binary      string    // path of the (static) binary on the host
	Name        string    // repository, e.g. vipcast/vipcast-speaker (no registry host)
	Tag         string    // e.g. v0.1.0
	User        string    // numeric uid:gid; "" leaves it unset
	Description string    // org.opencontainers.image.description
	OS          string    // linux
	Arch        string    // amd64
	Created     time.Time // image creation time and mtime of every file in the layer
	Format      string    // FormatDocker or FormatOCI
	// Path is where the binary lands in the image and the entrypoint;
	// empty: BinDir/<last element of Name>.
	Path string
	// Cmd is the image's default arguments to the entrypoint (none when
	// empty).
	Cmd []string
	// Base, when set, is a directory whose tree (directories, regular
	// files, symbolic links; modes kept, owned by root) becomes a layer
	// under the binary's: a userland for a test image whose commands a
	// test runs in the container (a shell, curl, nc).
	Base string
}

// Known binaries: the defaults for user and description.
var known = map[string]struct{ user, description string }{
	// The CCM only talks to the API server: an unprivileged numeric user
	// (65532 is the conventional "nonroot" id; there is no /etc/passwd in
	// a scratch image, so it must be numeric).
	"vipcast-ccm": {
		user:        "65532:65532",
		description: "vipcast cloud controller manager: allocates LoadBalancer IPs and writes Service status",
	},
	// The speaker programs IPVS, netlink routes/addresses and nftables in
	// the host network namespace. That needs CAP_NET_ADMIN (and
	// CAP_NET_RAW) in the initial user namespace; Kubernetes only grants
	// added capabilities to a non-root process through file capabilities,
	// which a tar layer cannot carry portably. So it runs as root, and we
	// say so explicitly (User 0:0) rather than leaving it unset.
	"vipcast-speaker": {
		user:        "0:0",
		description: "vipcast speaker: announces LoadBalancer IPs (BGP) and programs IPVS on each node",
	},
}

// DefaultsFor fills User and Description for a known binary name
// (the last path element of the repository).
func DefaultsFor(s *Spec) {
	k, ok := known[path.Base(s.Name)]
	if !ok {
		return
	}
	if s.User == "" {
		s.User = k.user
	}
	if s.Description == "" {
		s.Description = k.description
	}
}

// Ref parses Name:Tag, refusing an explicit registry host: images are
// loaded into a runtime from a file, never pushed by this tool.
func (s Spec) Ref() (name.Tag, error) {
	if s.Name == "" || s.Tag == "" {
		return name.Tag{}, errors.New("image name and tag are required")
	}
	if first, _, ok := strings.Cut(s.Name, "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return name.Tag{}, fmt.Errorf("image name %q: give a repository without a registry host, e.g. vipcast/vipcast-speaker", s.Name)
	}
	return name.NewTag(s.Name + ":" + s.Tag)
}

// Build assembles the image in memory: an empty base, the layer of
// s.Base when set, one layer with the binary at s.Path, and the config.
func Build(s Spec) (v1.Image, error) {
	if s.OS == "" {
		s.OS = "linux"
	}
	if s.Arch == "" {
		s.Arch = "amd64"
	}
	bin, err := os.ReadFile(s.Binary)
	if err != nil {
		return nil, err
	}
	if err := checkELF(bin, s.Arch); err != nil {
		return nil, fmt.Errorf("%s: %w", s.Binary, err)
	}
	target := s.Path
	if target == "" {
		target = path.Join(BinDir, path.Base(s.Name))
	}
	if !path.IsAbs(target) || path.Clean(target) != target {
		return nil, fmt.Errorf("binary path %q: want a clean absolute path, e.g. /agnhost", target)
	}
	var layers []layerSpec
	if s.Base != "" {
		b, err := dirTar(s.Base, s.Created)
		if err != nil {
			return nil, fmt.Errorf("base %s: %w", s.Base, err)
		}
		layers = append(layers, layerSpec{b, "hack/image: add the tree of " + filepath.Base(s.Base), "userland for a test image"})
	}
	layerTar, err := layerTar(target, bin, s.Created)
	if err != nil {
		return nil, err
	}
	layers = append(layers, layerSpec{layerTar, "hack/image: add " + target, "static Go binary on an empty base"})
	img, err := withLayers(s, layers)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	img, err = mutate.ConfigFile(img, imageConfig(cf.DeepCopy(), s, target))
	if err != nil {
		return nil, err
	}
	return mutate.CreatedAt(img, v1.Time{Time: s.Created})
}

// layerSpec is one layer's uncompressed tar and its history entry.
type layerSpec struct {
	tar                []byte
	createdBy, comment string
}

// withLayers is the empty base with layers, in order, in s's format
// (Docker or OCI media types).
func withLayers(s Spec, layers []layerSpec) (v1.Image, error) {
	oci := s.Format == FormatOCI
	layerType := types.DockerLayer
	if oci {
		layerType = types.OCILayer
	}
	img := empty.Image
	if oci {
		img = mutate.MediaType(img, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	}
	var adds []mutate.Addendum
	for _, l := range layers {
		// gzip's fastest level: a release compresses four binaries of
		// 65-70 MB, and the lab releases twice per run. For the speaker's
		// layer it takes 0.6 s for 22.8 MB, the default level 3.2 s for
		// 19.8 MB.
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(l.tar)), nil
		}, tarball.WithMediaType(layerType), tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.Addendum{
			Layer:     layer,
			MediaType: layerType,
			History:   v1.History{Created: v1.Time{Time: s.Created}, CreatedBy: l.createdBy, Comment: l.comment},
		})
	}
	return mutate.Append(img, adds...)
}

// dirTar is the uncompressed layer of dir's tree: every directory,
// regular file and symbolic link under it in lexical order, with its
// permission bits, owned by root, at mtime, PAX-free; anything else (a
// device, a socket) is refused.
func dirTar(dir string, mtime time.Time) ([]byte, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer func() { _ = root.Close() }()
	fsys := root.FS()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime = mtime.UTC().Truncate(time.Second)
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h := &tar.Header{Name: p, Mode: int64(info.Mode().Perm()), ModTime: mtime, Format: tar.FormatUSTAR}
		switch {
		case d.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
			return tw.WriteHeader(h)
		case info.Mode()&fs.ModeSymlink != 0:
			link, err := fs.ReadLink(fsys, p)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname = tar.TypeSymlink, link
			return tw.WriteHeader(h)
		case info.Mode().IsRegular():
			b, err := fs.ReadFile(fsys, p)
			if err != nil {
				return err
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(b))
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		default:
			return fmt.Errorf("%s: %v is neither a directory, a regular file nor a symbolic link", p, info.Mode().Type())
		}
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// imageConfig sets cf's platform, entrypoint (target), user, environment
// and labels from s, and returns it.
func imageConfig(cf *v1.ConfigFile, s Spec, target string) *v1.ConfigFile {
	cf.OS = s.OS
	cf.Architecture = s.Arch
	cf.Config.Entrypoint = []string{target}
	cf.Config.Cmd = s.Cmd
	cf.Config.User = s.User
	cf.Config.WorkingDir = "/"
	cf.Config.Env = []string{"PATH=" + BinDir + ":/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":   path.Base(s.Name),
		"org.opencontainers.image.version": s.Tag,
		"org.opencontainers.image.created": s.Created.UTC().Format(time.RFC3339),
	}
	if s.Description != "" {
		cf.Config.Labels["org.opencontainers.image.description"] = s.Description
	}
	return cf
}

// layerTar is the uncompressed layer: the parent directories and the
// binary, root-owned, fixed mtime, no user/group names, PAX-free.
func layerTar(target string, bin []byte, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime = mtime.UTC().Truncate(time.Second)
	var dirs []string
	for d := path.Dir(target); d != "/"; d = path.Dir(d) {
		dirs = append([]string{d}, dirs...)
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{
			Typeflag: tar.TypeDir,
			Name:     strings.TrimPrefix(d, "/") + "/",
			Mode:     0o755,
			ModTime:  mtime,
			Format:   tar.FormatUSTAR,
		}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg,
		Name:     strings.TrimPrefix(target, "/"),
		Mode:     0o755,
		Size:     int64(len(bin)),
		ModTime:  mtime,
		Format:   tar.FormatUSTAR,
	}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// checkELF refuses what cannot run on an empty base: a non-ELF file, the
// wrong architecture, or a dynamically linked binary (no loader, no libc).
func checkELF(b []byte, arch string) error {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("not an ELF binary: %w", err)
	}
	// A File from NewFile has nothing to close.
	want := map[string]elf.Machine{
		"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "386": elf.EM_386,
		"arm": elf.EM_ARM, "ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390, "riscv64": elf.EM_RISCV,
	}
	if m, ok := want[arch]; ok && f.Machine != m {
		return fmt.Errorf("ELF machine %s does not match architecture %s", f.Machine, arch)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked (has an ELF interpreter); build with CGO_ENABLED=0 for an empty base")
		}
	}
	return nil
}

// elfMachine is b's ELF machine, as debug/elf names it (EM_AARCH64).
func elfMachine(b []byte) (string, error) {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return "", fmt.Errorf("not an ELF binary: %w", err)
	}
	return f.Machine.String(), nil
}

// Write stores img at out in the spec's format and returns its manifest
// digest.
func Write(s Spec, img v1.Image, out string) (v1.Hash, error) {
	ref, err := s.Ref()
	if err != nil {
		return v1.Hash{}, err
	}
	// An output directory like any other build's: readable by all.
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil { //nolint:gosec // G301: see above
		return v1.Hash{}, err
	}
	switch s.Format {
	case FormatDocker, "":
		tmp := out + ".tmp"
		if err := tarball.WriteToFile(tmp, ref, img); err != nil {
			_ = os.Remove(tmp) // the write error says what went wrong
			return v1.Hash{}, err
		}
		if err := os.Rename(tmp, out); err != nil {
			return v1.Hash{}, err
		}
	case FormatOCI:
		if err := writeOCI(ref, img, out); err != nil {
			return v1.Hash{}, err
		}
	default:
		return v1.Hash{}, fmt.Errorf("unknown format %q (docker or oci)", s.Format)
	}
	return img.Digest()
}

// writeOCI writes an OCI image layout whose index annotates the manifest
// with org.opencontainers.image.ref.name = repository:tag. Runtimes use
// OCI ref names as given (containerd does not normalise them the way it
// normalises docker RepoTags), which is why FormatDocker is the default
// for loading into a node.
func writeOCI(ref name.Tag, img v1.Image, out string) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	idx := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{
		Add: img,
		Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: cf.OS, Architecture: cf.Architecture},
			Annotations: map[string]string{
				"org.opencontainers.image.ref.name": ref.String(),
			},
		},
	})
	dir := out
	asTar := strings.HasSuffix(out, ".tar")
	if asTar {
		d, err := os.MkdirTemp(filepath.Dir(out), ".oci-layout-")
		if err != nil {
			return err
		}
		defer func() { _ = os.RemoveAll(d) }() // a leftover only costs space
		dir = d
	} else if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if _, err := layout.Write(dir, idx); err != nil {
		return err
	}
	if !asTar {
		return nil
	}
	return tarDir(dir, out)
}

// tarDir archives dir reproducibly: sorted entries, fixed mode and mtime.
func tarDir(dir, out string) error {
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(files)
	tmp := out + ".tmp"
	f, err := os.Create(tmp) //nolint:gosec // G304: the output path the command line names
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp) }() // nothing left to remove once renamed
	if err := errors.Join(writeTar(f, dir, files), f.Close()); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// writeTar writes the files (slash-separated, relative to dir, sorted) and
// their parent directories to w as a tar archive.
func writeTar(w io.Writer, dir string, files []string) error {
	tw := tar.NewWriter(w)
	seen := map[string]bool{}
	for _, rel := range files {
		for _, d := range parents(rel) {
			if seen[d] {
				continue
			}
			seen[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatUSTAR}); err != nil {
				return err
			}
		}
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(rel))) //nolint:gosec // G304: a file of the layout just written
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: 0o644, Size: int64(len(b)), ModTime: time.Unix(0, 0), Format: tar.FormatUSTAR}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	return tw.Close()
}

func parents(rel string) []string {
	var ps []string
	for d := path.Dir(rel); d != "."; d = path.Dir(d) {
		ps = append([]string{d}, ps...)
	}
	return ps
}
