// Command benchreport writes docs/dev/performance.md from the outputs of
// `make bench` (_output/bench-*.txt), as its last step.
//
// It reads standard go test benchmark output (the goos:, goarch:, pkg: and
// cpu: headers; "BenchmarkName[/sub]-N  iterations  value unit ..."
// result lines), the "BENCH ..." lines the end-to-end benchmarks print, the
// "bench: ..." lines the dataplane benchmarks' guests print, and the go
// test -v output of TestSpeakerFabric and TestSpeakerFabricBFD, whose
// trial lines (a speaker frozen, thawed) it keeps.
//
// The page is the template performance.md.tmpl (embedded; -template reads
// another): the stable prose — what each benchmark measures, how, its
// floor, how to run it alone — around the current figures, which only the
// outputs give. The template calls summary (the table of every floor
// pair: value, floor, value/floor), bench NAME (a benchmark's table and
// what it printed) and trials NAME (a test's trial lines). The floor pairs
// are Go data (floors.go).
//
// It fails, naming what, and writes nothing, when a benchmark or test in
// the outputs has no place in the template, when the template places one
// the outputs lack, when a floor pair's metric is missing, when a result
// line is malformed, when go test reports a failure, and when the outputs
// disagree on the machine.
//
// Usage:
//
//	benchreport -commit REV[-dirty] [-date YYYY-MM-DD] [-kernel RELEASE] [-go VERSION] [-template FILE] [-o FILE] OUTPUT...
package main

import (
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// defaultTemplate is the page's template, kept beside this file.
//
//go:embed performance.md.tmpl
var defaultTemplate string

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, time.Now))
}

// config is what the flags set.
type config struct {
	commit, date, kernel, goVersion string
	template, out                   string
	files                           []string
}

// parseFlags reads the command line; now gives the default date.
func parseFlags(args []string, stderr io.Writer, now func() time.Time) (config, error) {
	var c config
	fs := flag.NewFlagSet("benchreport", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.commit, "commit", "", "the commit measured (required), with -dirty when the tree had other changes")
	fs.StringVar(&c.date, "date", now().UTC().Format(time.DateOnly), "the run's date, UTC")
	fs.StringVar(&c.kernel, "kernel", hostKernel(), "the host's kernel (default: this machine's, from uname)")
	fs.StringVar(&c.goVersion, "go", runtime.Version(), "the Go version the benchmarks ran with (default: this program's)")
	fs.StringVar(&c.template, "template", "", "the page's template (default: the embedded hack/benchreport/performance.md.tmpl)")
	fs.StringVar(&c.out, "o", "-", "the page to write; - for standard output")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	c.files = fs.Args()
	switch {
	case c.commit == "":
		return config{}, errors.New("-commit is required: the commit the benchmarks measured")
	case len(c.files) == 0:
		return config{}, errors.New("no output files: name make bench's _output/bench-*.txt")
	}
	if _, err := time.Parse(time.DateOnly, c.date); err != nil {
		return config{}, fmt.Errorf("-date %q: want YYYY-MM-DD: %w", c.date, err)
	}
	return c, nil
}

// run is main without the process: it returns the exit status.
func run(args []string, stdout, stderr io.Writer, now func() time.Time) int {
	c, err := parseFlags(args, stderr, now)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			_, _ = fmt.Fprintln(stderr, "benchreport:", err)
		}
		return 2
	}
	if err := generate(c, stdout); err != nil {
		_, _ = fmt.Fprintf(stderr, "benchreport: %s: not written:\n%v\n", c.out, err)
		return 1
	}
	return 0
}

// generate reads the outputs and the template and writes the page.
func generate(c config, stdout io.Writer) error {
	tmpl := defaultTemplate
	if c.template != "" {
		b, err := os.ReadFile(c.template)
		if err != nil {
			return fmt.Errorf("read the template: %w", err)
		}
		tmpl = string(b)
	}
	r := newOutputs()
	var errs []error
	for _, f := range c.files {
		if err := parsePath(r, f); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	page, err := render(tmpl, r, page{Commit: c.commit, Date: c.date, Machine: machine{Kernel: c.kernel, Go: c.goVersion}}, floorPairs())
	if err != nil {
		return err
	}
	if c.out == "-" {
		_, err := stdout.Write(page)
		return err
	}
	return writeFile(c.out, page)
}

// parsePath adds the output file path to r.
func parsePath(r *outputs, path string) error {
	f, err := os.Open(path) //nolint:gosec // a file the command line names
	if err != nil {
		return fmt.Errorf("open the output: %w", err)
	}
	defer func() { _ = f.Close() }()
	return r.parseFile(path, f)
}

// writeFile replaces path with data at once: a reader never sees half a
// page.
func writeFile(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write the page: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // after the rename: nothing
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("write the page: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil { //nolint:gosec // a documentation page, read by all
		_ = tmp.Close()
		return fmt.Errorf("write the page: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write the page: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write the page: %w", err)
	}
	return nil
}

// hostKernel is this machine's kernel name and release, as uname -sr.
func hostKernel() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return strings.TrimSpace(unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:]))
}
