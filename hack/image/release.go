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

// runIndex is the index subcommand: one image per OS/ARCH=BINARY argument,
// as one OCI index, pushed to -repository:-tag and checked as the registry
// serves it, and/or written as an OCI layout directory (-out).
func runIndex(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("image index", flag.ContinueOnError)
	repository := fl.String("repository", "", "HOST[:PORT]/PATH of the image in a registry, e.g. registry.example:5000/vipcast/vipcast-speaker (required)")
	tag := fl.String("tag", "", "image tag (required), e.g. the release's version")
	out := fl.String("out", "", "also write the index as an OCI image layout in this directory")
	push := fl.Bool("push", true, "push the index to the registry and check what it serves")
	plainHTTP := fl.Bool("plain-http", false, "talk to the registry over HTTP instead of HTTPS (a registry on a lab network)")
	user := fl.String("user", "", `numeric uid:gid; empty = default for the binary; "none" leaves it unset`)
	created := fl.String("created", "", "creation time: RFC 3339 or Unix seconds (default $SOURCE_DATE_EPOCH, else 1970-01-01T00:00:00Z)")
	fl.Usage = func() {
		_, _ = fmt.Fprintln(fl.Output(), "usage: image index -repository HOST[:PORT]/PATH -tag TAG [flags] OS/ARCH=BINARY...")
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *repository == "" || *tag == "" || fl.NArg() == 0 {
		fl.Usage()
		return errors.New("index needs -repository, -tag and at least one OS/ARCH=BINARY")
	}
	ref, err := name.NewTag(*repository+":"+*tag, nameOptions(*plainHTTP)...)
	if err != nil {
		return fmt.Errorf("-repository %q -tag %q: %w", *repository, *tag, err)
	}
	var bins []PlatformBinary
	for _, a := range fl.Args() {
		b, err := ParsePlatformBinary(a)
		if err != nil {
			return err
		}
		bins = append(bins, b)
	}
	t, err := createdTime(*created)
	if err != nil {
		return err
	}
	// The image's name without the registry: the title label and the
	// defaults for known binaries.
	s := Spec{Name: ref.RepositoryStr(), Tag: *tag, User: *user, Created: t}
	DefaultsFor(&s)
	if s.User == "none" {
		s.User = ""
	}
	idx, err := BuildIndex(s, bins)
	if err != nil {
		return err
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	if *out != "" {
		if err := writeIndexLayout(idx, ref, *out); err != nil {
			return fmt.Errorf("OCI layout %s: %w", *out, err)
		}
	}
	if *push {
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
