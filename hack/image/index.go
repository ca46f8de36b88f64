package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// PlatformBinary is one platform's static binary for a multi-platform
// image: "linux/arm64=bin/linux_arm64/vipcast-speaker" on the command line.
type PlatformBinary struct {
	OS, Arch string
	Binary   string
}

// ParsePlatformBinary parses OS/ARCH=PATH.
func ParsePlatformBinary(arg string) (PlatformBinary, error) {
	platform, bin, ok := strings.Cut(arg, "=")
	goos, arch, ok2 := strings.Cut(platform, "/")
	if !ok || !ok2 || goos == "" || arch == "" || bin == "" || strings.Contains(arch, "/") {
		return PlatformBinary{}, fmt.Errorf("%q: want OS/ARCH=BINARY, e.g. linux/arm64=bin/linux_arm64/vipcast-speaker", arg)
	}
	return PlatformBinary{OS: goos, Arch: arch, Binary: bin}, nil
}

// BuildIndex builds one OCI image per platform from base (its Binary, OS,
// Arch and Format are replaced) and returns them as one OCI image index,
// each manifest's descriptor naming its platform: what a registry serves
// under one tag so that each node pulls its own architecture. Like Build,
// it is reproducible: the same binaries, name, tag and creation time give
// the same index digest.
func BuildIndex(base Spec, bins []PlatformBinary) (v1.ImageIndex, error) {
	if len(bins) == 0 {
		return nil, errors.New("no platform binaries")
	}
	seen := map[string]bool{}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var adds []mutate.IndexAddendum
	for _, b := range bins {
		platform := b.OS + "/" + b.Arch
		if seen[platform] {
			return nil, fmt.Errorf("platform %s given twice", platform)
		}
		seen[platform] = true
		s := base
		s.Binary, s.OS, s.Arch, s.Format = b.Binary, b.OS, b.Arch, FormatOCI
		img, err := Build(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", platform, err)
		}
		adds = append(adds, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: b.OS, Architecture: b.Arch}},
		})
	}
	return mutate.AppendManifests(idx, adds...), nil
}

// PlatformCheck is what CheckIndex found for one manifest of an index.
type PlatformCheck struct {
	Platform   string  // OS/ARCH of the index's descriptor
	Digest     v1.Hash // the manifest's
	Entrypoint string  // the binary the image runs
	Machine    string  // its ELF machine, e.g. EM_AARCH64
}

func (c PlatformCheck) String() string {
	return fmt.Sprintf("%s %s: %s is a static ELF binary for %s", c.Platform, c.Digest, c.Entrypoint, c.Machine)
}

// CheckIndex reads every image of idx and checks that it runs on the
// platform its descriptor names: the config's OS and architecture agree
// with the descriptor, and the entrypoint, read from the layers, is a
// static ELF binary for that architecture. A release runs it on what it
// pushed, since no machine that builds it runs arm64.
func CheckIndex(idx v1.ImageIndex) ([]PlatformCheck, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("index manifest: %w", err)
	}
	if len(m.Manifests) == 0 {
		return nil, errors.New("the index lists no image")
	}
	var out []PlatformCheck
	for _, d := range m.Manifests {
		if d.Platform == nil {
			return nil, fmt.Errorf("manifest %s: no platform in the index", d.Digest)
		}
		platform := d.Platform.OS + "/" + d.Platform.Architecture
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", platform, err)
		}
		c, err := checkImagePlatform(img, *d.Platform)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", platform, d.Digest, err)
		}
		c.Platform, c.Digest = platform, d.Digest
		out = append(out, c)
	}
	return out, nil
}

// checkImagePlatform checks img's config and entrypoint against p.
func checkImagePlatform(img v1.Image, p v1.Platform) (PlatformCheck, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return PlatformCheck{}, fmt.Errorf("config: %w", err)
	}
	if cf.OS != p.OS || cf.Architecture != p.Architecture {
		return PlatformCheck{}, fmt.Errorf("the image's config says %s/%s", cf.OS, cf.Architecture)
	}
	if len(cf.Config.Entrypoint) == 0 {
		return PlatformCheck{}, errors.New("no entrypoint")
	}
	entry := cf.Config.Entrypoint[0]
	bin, err := fileFromLayers(img, entry)
	if err != nil {
		return PlatformCheck{}, err
	}
	if err := checkELF(bin, p.Architecture); err != nil {
		return PlatformCheck{}, fmt.Errorf("%s: %w", entry, err)
	}
	m, err := elfMachine(bin)
	if err != nil {
		return PlatformCheck{}, err
	}
	return PlatformCheck{Entrypoint: entry, Machine: m}, nil
}

// fileFromLayers returns the content of the file at the absolute path p
// as the image's layers leave it (the topmost layer that has it).
func fileFromLayers(img v1.Image, p string) ([]byte, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("layers: %w", err)
	}
	want := strings.TrimPrefix(path.Clean(p), "/")
	var found []byte
	for _, l := range layers {
		b, ok, err := readFromLayer(l, want)
		if err != nil {
			return nil, err
		}
		if ok {
			found = b
		}
	}
	if found == nil {
		return nil, fmt.Errorf("%s is in no layer", p)
	}
	return found, nil
}

// readFromLayer reads the regular file name (no leading slash) from l.
func readFromLayer(l v1.Layer, name string) ([]byte, bool, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return nil, false, fmt.Errorf("layer: %w", err)
	}
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("layer: %w", err)
		}
		if strings.TrimPrefix(path.Clean(h.Name), "/") != name || h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		return b, err == nil, err
	}
}
