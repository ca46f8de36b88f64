// Package routers runs real BGP routers — FRR's bgpd and BIRD 2 — on
// loopback for tests, and reads their routing tables back as structured
// data.
//
// Each router listens on a loopback address and a free port, lives in its
// own t.TempDir() and is killed at t.Cleanup (its process group, and by
// Pdeathsig if the test binary dies). Speakers under test connect to it
// from other loopback addresses (all of 127.0.0.0/8 is on lo on Linux),
// one address per session, since BGP identifies a neighbor by address.
//
// When a daemon is not installed the test is skipped, unless the CI
// environment variable is "true", where it fails.
package routers

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/vipcast/vipcast/test/proc"

	"github.com/vipcast/vipcast/test/harness"
)

// requireBinaries skips the test, or fails it on CI, when a binary is
// missing.
func requireBinaries(t harness.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if _, err := exec.LookPath(p); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is required on CI: %v", p, err)
			}
			t.Skipf("skipping: %s is not installed (apt-get install frr bird2): %v", p, err)
		}
	}
}

// startDaemon starts argv (program and arguments) with its output in
// logPath, stops it at the end of the test (showing the log's tail if the
// test failed), and waits until ready reports true; it fails the test if
// the daemon exits or is not ready within 10 s.
func startDaemon(t harness.T, name, logPath string, ready func() bool, argv ...string) *proc.Process {
	t.Helper()
	p, err := proc.Start(logPath, argv[0], argv[1:]...)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		p.Stop(2 * time.Second)
		if t.Failed() {
			if l, err := os.ReadFile(logPath); err == nil && len(l) > 0 {
				t.Logf("%s log:\n%s", name, tail(l, 40))
			}
		}
	})
	if !waitFor(10*time.Second, func() bool { return p.Exited() || ready() }) || p.Exited() {
		l, _ := os.ReadFile(logPath)
		t.Fatalf("%s did not start:\n%s", name, l)
	}
	return p
}

// freePort returns a TCP port that was free on host.
func freePort(host string) (int, error) {
	ports, err := proc.FreePorts(host, 1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// run runs argv with a timeout and returns its standard output.
func run(timeout time.Duration, argv ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s: %w: %s", argv[0], err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.Bytes(), nil
}

// waitFor polls cond every 50 ms until it returns true or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
