package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// indexOptions are the index subcommand's flags.
type indexOptions struct {
	repository, tag, out, user, created string
	push, plainHTTP                     bool
}

func newIndexFlags() (*flag.FlagSet, *indexOptions) {
	fl := flag.NewFlagSet("image index", flag.ContinueOnError)
	o := &indexOptions{}
	fl.StringVar(&o.repository, "repository", "", "HOST[:PORT]/PATH of the image in a registry, e.g. registry.example:5000/vipcast/vipcast-speaker (required)")
	fl.StringVar(&o.tag, "tag", "", "image tag (required), e.g. the release's version")
	fl.StringVar(&o.out, "out", "", "also write the index as an OCI image layout in this directory")
	fl.BoolVar(&o.push, "push", true, "push the index to the registry and check what it serves")
	fl.BoolVar(&o.plainHTTP, "plain-http", false, "talk to the registry over HTTP instead of HTTPS (a registry on a lab network)")
	fl.StringVar(&o.user, "user", "", `numeric uid:gid; empty = default for the binary; "none" leaves it unset`)
	fl.StringVar(&o.created, "created", "", "creation time: RFC 3339 or Unix seconds (default $SOURCE_DATE_EPOCH, else 1970-01-01T00:00:00Z)")
	fl.Usage = func() {
		_, _ = fmt.Fprintln(fl.Output(), "usage: image index -repository HOST[:PORT]/PATH -tag TAG [flags] OS/ARCH=BINARY...")
		fl.PrintDefaults()
	}
	return fl, o
}

// inputs checks the flags and the OS/ARCH=BINARY arguments and returns
// the reference to push to, the images' shared spec and the binaries.
func (o *indexOptions) inputs(args []string) (name.Tag, Spec, []PlatformBinary, error) {
	if o.repository == "" || o.tag == "" || len(args) == 0 {
		return name.Tag{}, Spec{}, nil, errors.New("index needs -repository, -tag and at least one OS/ARCH=BINARY")
	}
	ref, err := name.NewTag(o.repository+":"+o.tag, nameOptions(o.plainHTTP)...)
	if err != nil {
		return name.Tag{}, Spec{}, nil, fmt.Errorf("-repository %q -tag %q: %w", o.repository, o.tag, err)
	}
	var bins []PlatformBinary
	for _, a := range args {
		b, err := ParsePlatformBinary(a)
		if err != nil {
			return name.Tag{}, Spec{}, nil, err
		}
		bins = append(bins, b)
	}
	t, err := createdTime(o.created)
	if err != nil {
		return name.Tag{}, Spec{}, nil, err
	}
	// The image's name without the registry: the title label and the
	// defaults for known binaries.
	s := Spec{Name: ref.RepositoryStr(), Tag: o.tag, User: o.user, Created: t}
	DefaultsFor(&s)
	if s.User == "none" {
		s.User = ""
	}
	return ref, s, bins, nil
}

// runIndex is the index subcommand: one image per OS/ARCH=BINARY argument,
// as one OCI index, pushed to -repository:-tag and checked as the registry
// serves it, and/or written as an OCI layout directory (-out).
func runIndex(args []string, stdout io.Writer) error {
	fl, o := newIndexFlags()
	if err := fl.Parse(args); err != nil {
		return err
	}
	ref, s, bins, err := o.inputs(fl.Args())
	if err != nil {
		fl.Usage()
		return err
	}
	idx, err := BuildIndex(s, bins)
	if err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	if o.out != "" {
		if err := writeIndexLayout(idx, ref, o.out); err != nil {
			return fmt.Errorf("OCI layout %s: %w", o.out, err)
		}
	}
	if o.push {
		if err := remote.WriteIndex(ref, idx, remoteOptions()...); err != nil {
			return fmt.Errorf("pushing %s: %w", ref, err)
		}
		if err := checkRemote(ref, d, stdout); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(stdout, "%s\t%s\n", ref, d)
	return err
}

// runCheck is the check subcommand: the index a registry serves under
// each reference, checked platform by platform (CheckIndex).
func runCheck(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("image check", flag.ContinueOnError)
	plainHTTP := fl.Bool("plain-http", false, "talk to the registry over HTTP instead of HTTPS")
	fl.Usage = func() {
		_, _ = fmt.Fprintln(fl.Output(), "usage: image check [-plain-http] HOST[:PORT]/PATH:TAG...")
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() == 0 {
		fl.Usage()
		return errors.New("check needs at least one image reference")
	}
	for _, a := range fl.Args() {
		ref, err := name.ParseReference(a, nameOptions(*plainHTTP)...)
		if err != nil {
			return fmt.Errorf("%q: %w", a, err)
		}
		if err := checkRemote(ref, v1.Hash{}, stdout); err != nil {
			return err
		}
	}
	return nil
}

// checkRemote reads ref's index from its registry and checks it; with
// want set, the registry must serve that digest.
func checkRemote(ref name.Reference, want v1.Hash, stdout io.Writer) error {
	idx, err := remote.Index(ref, remoteOptions()...)
	if err != nil {
		return fmt.Errorf("reading %s back: %w", ref, err)
	}
	got, err := idx.Digest()
	if err != nil {
		return err
	}
	if want != (v1.Hash{}) && got != want {
		return fmt.Errorf("%s: the registry serves %s, pushed %s", ref, got, want)
	}
	checks, err := CheckIndex(idx)
	if err != nil {
		return fmt.Errorf("%s: %w", ref, err)
	}
	for _, c := range checks {
		if _, err := fmt.Fprintf(stdout, "%s\t%s\n", ref, c); err != nil {
			return err
		}
	}
	return nil
}

func nameOptions(plainHTTP bool) []name.Option {
	if plainHTTP {
		return []name.Option{name.Insecure}
	}
	return nil
}

// remoteOptions authenticate as docker and helm do: the credentials of
// `docker login` (the Docker config's credentials and helpers).
func remoteOptions() []remote.Option {
	return []remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}
}

// writeIndexLayout writes idx as an OCI image layout at dir whose own
// index names it ref (org.opencontainers.image.ref.name), for tools that
// copy a layout to a registry (skopeo, crane, oras).
func writeIndexLayout(idx v1.ImageIndex, ref name.Tag, dir string) error {
	top := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), mutate.IndexAddendum{
		Add:        idx,
		Descriptor: v1.Descriptor{Annotations: map[string]string{"org.opencontainers.image.ref.name": ref.String()}},
	})
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	_, err := layout.Write(dir, top)
	return err
}
