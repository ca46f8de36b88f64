// Command image builds container images of the vipcast binaries without a
// Docker daemon: an empty (scratch) base plus one layer holding a static
// binary, written as a `docker save`-compatible tarball (default) or an OCI
// image layout. Builds are reproducible: the same binary, name, tag and
// creation time give the same image digest.
//
// One image:
//
//	go run . -binary ../../bin/vipcast-speaker -name vipcast/vipcast-speaker \
//	    -tag v0.1.0 -out ../../_output/images/vipcast-speaker.tar
//
// Several images (name = <repo>/<binary base name>, file = <outdir>/<base>.tar):
//
//	go run . -tag v0.1.0 -outdir ../../_output/images ../../bin/vipcast-ccm ../../bin/vipcast-speaker
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fl := flag.NewFlagSet("image", flag.ContinueOnError)
	var (
		binary  = fl.String("binary", "", "single-image mode: path of the static binary")
		imgName = fl.String("name", "", "single-image mode: repository without registry host, e.g. vipcast/vipcast-speaker")
		out     = fl.String("out", "", "single-image mode: output file (docker), or OCI layout directory / .tar (oci)")
		tag     = fl.String("tag", "", "image tag (required), e.g. the output of git describe")
		repo    = fl.String("repo", "vipcast", "multi-image mode: repository prefix")
		outdir  = fl.String("outdir", "_output/images", "multi-image mode: output directory")
		format  = fl.String("format", FormatDocker, "docker (docker save tarball) or oci (OCI image layout; a .tar out path gives an oci-archive)")
		user    = fl.String("user", "", `numeric uid:gid; empty = default for the binary (vipcast-ccm 65532:65532, vipcast-speaker 0:0); "none" leaves it unset`)
		desc    = fl.String("description", "", "org.opencontainers.image.description (default for known binaries)")
		goos    = fl.String("os", "linux", "image OS")
		goarch  = fl.String("arch", "amd64", "image architecture (must match the binary)")
		created = fl.String("created", "", "creation time and file mtime: RFC 3339 or Unix seconds (default $SOURCE_DATE_EPOCH, else 1970-01-01T00:00:00Z)")
	)
	fl.Usage = func() {
		_, _ = fmt.Fprintln(fl.Output(), "usage: image -binary PATH -name REPO -tag TAG -out FILE [flags]\n       image -tag TAG [-outdir DIR] [flags] BINARY...")
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *tag == "" {
		return errors.New("-tag is required")
	}
	if *format != FormatDocker && *format != FormatOCI {
		return fmt.Errorf("-format %q: want docker or oci", *format)
	}
	t, err := createdTime(*created)
	if err != nil {
		return err
	}
	base := Spec{Tag: *tag, User: *user, Description: *desc, OS: *goos, Arch: *goarch, Created: t, Format: *format}

	type job struct {
		spec Spec
		out  string
	}
	var jobs []job
	switch {
	case *binary != "":
		if fl.NArg() > 0 {
			return errors.New("give either -binary or positional binaries, not both")
		}
		if *imgName == "" || *out == "" {
			return errors.New("-binary needs -name and -out")
		}
		s := base
		s.Binary, s.Name = *binary, *imgName
		jobs = append(jobs, job{s, *out})
	case fl.NArg() > 0:
		if *imgName != "" || *out != "" {
			return errors.New("-name and -out are for single-image mode (-binary)")
		}
		for _, b := range fl.Args() {
			s := base
			s.Binary = b
			s.Name = strings.TrimSuffix(*repo, "/") + "/" + filepath.Base(b)
			o := filepath.Join(*outdir, filepath.Base(b)+".tar")
			if *format == FormatOCI {
				o = filepath.Join(*outdir, filepath.Base(b)+".oci.tar")
			}
			jobs = append(jobs, job{s, o})
		}
	default:
		fl.Usage()
		return errors.New("nothing to build")
	}

	for _, j := range jobs {
		s := j.spec
		DefaultsFor(&s)
		if s.User == "none" {
			s.User = ""
		}
		if _, err := s.Ref(); err != nil {
			return err
		}
		img, err := Build(s)
		if err != nil {
			return err
		}
		d, err := Write(s, img, j.out)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(stdout, "%s:%s\t%s\t%s\n", s.Name, s.Tag, d, j.out); err != nil {
			return fmt.Errorf("listing %s: %w", j.out, err)
		}
	}
	return nil
}

func createdTime(v string) (time.Time, error) {
	if v == "" {
		v = os.Getenv("SOURCE_DATE_EPOCH")
	}
	if v == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.Unix(n, 0).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("creation time %q: want RFC 3339 or Unix seconds", v)
	}
	return t.UTC(), nil
}
