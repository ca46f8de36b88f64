// Package harness lets the test harnesses (test/controlplane, test/routers,
// test/netns) run outside `go test`: they take a T, which *testing.T and
// *testing.B satisfy, and which Runner implements for commands such as the
// lab (test/lab), with the same cleanup-on-failure guarantees.
package harness

import (
	"fmt"
	"os"
	"runtime"
	"sync"
)

// T is the part of testing.TB the harnesses use.
type T interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skip(args ...any)
	Skipf(format string, args ...any)
	Cleanup(f func())
	TempDir() string
	Failed() bool
}

// Runner is a T for programs: Fatal and Skip end the calling goroutine
// (as in a test, call them only from the goroutine running Run's function),
// and Close runs the cleanups, last registered first.
type Runner struct {
	logf func(format string, args ...any)

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	dir      string
	ndir     int
}

// NewRunner returns a Runner that logs with logf (nil: standard error).
func NewRunner(logf func(format string, args ...any)) *Runner {
	if logf == nil {
		logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	return &Runner{logf: logf}
}

// Run calls f(r) in a new goroutine and waits for it to return or to end
// by Fatal or Skip. It reports an error when f failed.
func (r *Runner) Run(f func(T)) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	if r.Failed() {
		return fmt.Errorf("failed (see the messages above)")
	}
	return nil
}

// Close runs the registered cleanups, last first, and removes the
// temporary directories.
func (r *Runner) Close() {
	for {
		r.mu.Lock()
		n := len(r.cleanups)
		if n == 0 {
			r.mu.Unlock()
			break
		}
		f := r.cleanups[n-1]
		r.cleanups = r.cleanups[:n-1]
		r.mu.Unlock()
		f()
	}
	r.mu.Lock()
	dir := r.dir
	r.dir = ""
	r.mu.Unlock()
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

// Helper does nothing: messages carry no file positions.
func (r *Runner) Helper() {}

// Logf logs a message.
func (r *Runner) Logf(format string, args ...any) { r.logf(format, args...) }

// Errorf logs a message and marks the run failed.
func (r *Runner) Errorf(format string, args ...any) {
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
	r.logf("error: "+format, args...)
}

// Fatal logs, marks the run failed and ends the calling goroutine.
func (r *Runner) Fatal(args ...any) { r.Fatalf("%s", fmt.Sprint(args...)) }

// Fatalf logs, marks the run failed and ends the calling goroutine.
func (r *Runner) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

// Skip is fatal for a program: it needs every component it asks for.
func (r *Runner) Skip(args ...any) { r.Fatal(args...) }

// Skipf is fatal for a program, like Skip.
func (r *Runner) Skipf(format string, args ...any) { r.Fatalf(format, args...) }

// Cleanup registers f to run at Close.
func (r *Runner) Cleanup(f func()) {
	r.mu.Lock()
	r.cleanups = append(r.cleanups, f)
	r.mu.Unlock()
}

// TempDir returns a new directory, removed at Close.
func (r *Runner) TempDir() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dir == "" {
		d, err := os.MkdirTemp("", "vipcast-run-")
		if err != nil {
			r.failed = true
			r.logf("error: temporary directory: %v", err)
			r.mu.Unlock()
			runtime.Goexit()
		}
		r.dir = d
	}
	r.ndir++
	d := fmt.Sprintf("%s/%03d", r.dir, r.ndir)
	if err := os.Mkdir(d, 0o700); err != nil {
		r.failed = true
		r.logf("error: temporary directory: %v", err)
		runtime.Goexit() // runs the deferred Unlock
	}
	return d
}

// Failed reports whether Errorf, Fatal or Skip was called.
func (r *Runner) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}
