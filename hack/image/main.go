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
//
// One image for several platforms, as one OCI index, pushed to a registry
// (and checked there) or written as an OCI layout:
//
//	go run . index -repository registry.example:5000/vipcast/vipcast-speaker -tag v0.1.0 \
//	    linux/amd64=../../_output/release/linux_amd64/vipcast-speaker \
//	    linux/arm64=../../_output/release/linux_arm64/vipcast-speaker
//
// Check that every platform of a pushed index runs a static binary of its
// own architecture:
//
//	go run . check registry.example:5000/vipcast/vipcast-speaker:v0.1.0
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
	if len(args) > 0 {
		switch args[0] {
		case "index":
			return runIndex(args[1:], stdout)
		case "check":
			return runCheck(args[1:], stdout)
		}
	}
	fl, o := newFlags()
	if err := fl.Parse(args); err != nil {
		return err
	}
	base, err := o.baseSpec()
	if err != nil {
		return err
	}
	if o.binary == "" && fl.NArg() == 0 {
		fl.Usage()
		return errors.New("nothing to build")
	}
	jobs, err := o.jobs(base, fl.Args())
	if err != nil {
		return err
	}
	for _, j := range jobs {
		if err := j.build(stdout); err != nil {
			return err
		}
	}
	return nil
}

// options are the values of the command line's flags.
type options struct {
	binary, imgName, out                           string // single-image mode
	repo, outdir                                   string // multi-image mode
	tag, format, user, desc, goos, goarch, created string
	path, cmd, base                                string // single-image mode
}

// newFlags defines the command line's flags, which fill in the options.
func newFlags() (*flag.FlagSet, *options) {
	fl := flag.NewFlagSet("image", flag.ContinueOnError)
	o := &options{}
	fl.StringVar(&o.binary, "binary", "", "single-image mode: path of the static binary")
	fl.StringVar(&o.imgName, "name", "", "single-image mode: repository without registry host, e.g. vipcast/vipcast-speaker")
	fl.StringVar(&o.out, "out", "", "single-image mode: output file (docker), or OCI layout directory / .tar (oci)")
	fl.StringVar(&o.path, "path", "", "single-image mode: where the binary lands and the entrypoint (default "+BinDir+"/<name's last element>)")
	fl.StringVar(&o.cmd, "cmd", "", "single-image mode: the image's default arguments, separated by spaces")
	fl.StringVar(&o.base, "base", "", "single-image mode: a directory whose tree becomes a layer under the binary's (a test image's userland)")
	fl.StringVar(&o.tag, "tag", "", "image tag (required), e.g. the output of git describe")
	fl.StringVar(&o.repo, "repo", "vipcast", "multi-image mode: repository prefix")
	fl.StringVar(&o.outdir, "outdir", "_output/images", "multi-image mode: output directory")
	fl.StringVar(&o.format, "format", FormatDocker, "docker (docker save tarball) or oci (OCI image layout; a .tar out path gives an oci-archive)")
	fl.StringVar(&o.user, "user", "", `numeric uid:gid; empty = default for the binary (vipcast-ccm 65532:65532, vipcast-speaker 0:0); "none" leaves it unset`)
	fl.StringVar(&o.desc, "description", "", "org.opencontainers.image.description (default for known binaries)")
	fl.StringVar(&o.goos, "os", "linux", "image OS")
	fl.StringVar(&o.goarch, "arch", "amd64", "image architecture (must match the binary)")
	fl.StringVar(&o.created, "created", "", "creation time and file mtime: RFC 3339 or Unix seconds (default $SOURCE_DATE_EPOCH, else 1970-01-01T00:00:00Z)")
	fl.Usage = func() {
		_, _ = fmt.Fprintln(fl.Output(), "usage: image -binary PATH -name REPO -tag TAG -out FILE [flags]\n       image -tag TAG [-outdir DIR] [flags] BINARY...")
		fl.PrintDefaults()
	}
	return fl, o
}

// baseSpec checks the flags every image shares and returns the Spec they
// give, without binary and name.
func (o *options) baseSpec() (Spec, error) {
	if o.tag == "" {
		return Spec{}, errors.New("-tag is required")
	}
	if o.format != FormatDocker && o.format != FormatOCI {
		return Spec{}, fmt.Errorf("-format %q: want docker or oci", o.format)
	}
	t, err := createdTime(o.created)
	if err != nil {
		return Spec{}, err
	}
	return Spec{Tag: o.tag, User: o.user, Description: o.desc, OS: o.goos, Arch: o.goarch, Created: t, Format: o.format}, nil
}

// job is one image to build and the file or directory to write it to.
type job struct {
	spec Spec
	out  string
}

// jobs returns the images to build from base: the one of -binary, or one
// per binary in args (multi-image mode).
func (o *options) jobs(base Spec, args []string) ([]job, error) {
	if o.binary != "" {
		if len(args) > 0 {
			return nil, errors.New("give either -binary or positional binaries, not both")
		}
		if o.imgName == "" || o.out == "" {
			return nil, errors.New("-binary needs -name and -out")
		}
		s := base
		s.Binary, s.Name, s.Path, s.Cmd, s.Base = o.binary, o.imgName, o.path, strings.Fields(o.cmd), o.base
		return []job{{s, o.out}}, nil
	}
	if o.imgName != "" || o.out != "" || o.path != "" || o.cmd != "" || o.base != "" {
		return nil, errors.New("-name, -out, -path, -cmd and -base are for single-image mode (-binary)")
	}
	var jobs []job
	for _, b := range args {
		s := base
		s.Binary = b
		s.Name = strings.TrimSuffix(o.repo, "/") + "/" + filepath.Base(b)
		out := filepath.Join(o.outdir, filepath.Base(b)+".tar")
		if o.format == FormatOCI {
			out = filepath.Join(o.outdir, filepath.Base(b)+".oci.tar")
		}
		jobs = append(jobs, job{s, out})
	}
	return jobs, nil
}

// build builds and writes j's image and lists it on stdout: name:tag,
// digest and file.
func (j job) build(stdout io.Writer) error {
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
