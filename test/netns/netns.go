// Package netns builds throwaway network topologies for root-tier tests:
// named network namespaces joined by veth pairs and bridges, made with
// iproute2 and always removed when the test ends, even when it fails.
package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipcast/vipcast/test/harness"
)

// Require fails the test (in CI) or skips it (elsewhere) when this process
// cannot create network namespaces: not root, or no `ip` command.
func Require(t harness.T) {
	t.Helper()
	var why string
	if os.Geteuid() != 0 {
		why = "network-namespace tests need root"
	} else if _, err := exec.LookPath("ip"); err != nil {
		why = "network-namespace tests need iproute2's ip command (apt-get install iproute2)"
	}
	if why == "" {
		sweep(t)
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal(why + "; CI runs every tier")
	}
	t.Skip(why)
}

// sweep deletes the namespaces of test processes that are gone
// (SweepDead), logging to t.
func sweep(t harness.T) {
	t.Helper()
	SweepDead(t.Logf)
}

// SweepDead deletes the namespaces of processes that are gone, saying so
// through logf. Each namespace is named vc<pid>-<role> after the process
// that made it (New); one killed before its cleanups ran (go test's
// timeout panics, a SIGKILL) leaves them behind.
func SweepDead(logf func(format string, args ...any)) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		logf("listing network namespaces: %v", err)
		return
	}
	for _, name := range deadNamespaces(string(out), os.Getpid(), Alive) {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			logf("deleting namespace %s, left by a process that is gone: %v: %s", name, err, out)
			continue
		}
		logf("deleted namespace %s, left by a process that is gone", name)
	}
}

// deadNamespaces returns the namespaces of `ip netns list` (list) named
// vc<pid>-<role> whose process is neither self nor alive.
func deadNamespaces(list string, self int, alive func(pid int) bool) []string {
	var dead []string
	for _, line := range strings.Split(list, "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, "vc")
		if !ok {
			continue
		}
		digits, role, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(digits)
		if !ok || role == "" || err != nil || pid <= 0 || pid == self || alive(pid) {
			continue
		}
		dead = append(dead, name)
	}
	return dead
}

// Alive reports whether process pid exists (EPERM: it does, another
// user's).
func Alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// NS is a named network namespace created by a test.
type NS struct {
	Name string
}

// IP runs `ip args...` and fails the test on error.
func IP(t harness.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// New creates a namespace named vc<pid>-name (so parallel runs do not
// collide, and Require's sweep can tell whose it is), brings its loopback
// up, and deletes it at the end of the test. Processes started in it with
// Cmd must be stopped by the test first.
func New(t harness.T, name string) *NS {
	t.Helper()
	ns := &NS{Name: fmt.Sprintf("vc%d-%s", os.Getpid(), name)}
	_ = exec.Command("ip", "netns", "del", ns.Name).Run() // leftover of a killed run
	IP(t, "netns", "add", ns.Name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns.Name).CombinedOutput(); err != nil {
			t.Logf("deleting netns %s: %v: %s", ns.Name, err, out)
		}
	})
	ns.IP(t, "link", "set", "lo", "up")
	return ns
}

// IP runs `ip -n NS args...`.
func (ns *NS) IP(t harness.T, args ...string) string {
	t.Helper()
	return IP(t, append([]string{"-n", ns.Name}, args...)...)
}

// Command returns a command that runs name with args inside the namespace.
func (ns *NS) Command(name string, args ...string) []string {
	return append([]string{"ip", "netns", "exec", ns.Name, name}, args...)
}

// Veth connects two namespaces (either may be nil for the test's own
// namespace) with a veth pair named aName/bName, assigns the addresses
// (CIDR notation, may be empty) and brings both ends up. Deleting either
// namespace removes the pair.
func Veth(t harness.T, a *NS, aName, aAddr string, b *NS, bName, bAddr string) {
	t.Helper()
	tmpA, tmpB := fmt.Sprintf("vct%da", os.Getpid()%100000), fmt.Sprintf("vct%db", os.Getpid()%100000)
	IP(t, "link", "add", tmpA, "type", "veth", "peer", "name", tmpB)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", tmpA).Run() })
	for _, end := range []struct {
		ns        *NS
		tmp, name string
		addr      string
	}{{a, tmpA, aName, aAddr}, {b, tmpB, bName, bAddr}} {
		ip := IP
		if end.ns != nil {
			IP(t, "link", "set", end.tmp, "netns", end.ns.Name)
			ip = end.ns.IP
		} else {
			t.Cleanup(func() { _ = exec.Command("ip", "link", "del", end.name).Run() })
		}
		ip(t, "link", "set", end.tmp, "name", end.name)
		if end.addr != "" {
			ip(t, "addr", "add", end.addr, "dev", end.name)
		}
		ip(t, "link", "set", end.name, "up")
	}
}

// Bridge creates a bridge in ns (nil: the test's namespace) with an
// optional address, up.
func Bridge(t harness.T, ns *NS, name, addr string) {
	t.Helper()
	ip := IP
	if ns != nil {
		ip = ns.IP
	} else {
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", name).Run() })
	}
	ip(t, "link", "add", name, "type", "bridge")
	if addr != "" {
		ip(t, "addr", "add", addr, "dev", name)
	}
	ip(t, "link", "set", name, "up")
}

// Enslave attaches a link to a bridge in ns (nil: the test's namespace).
func Enslave(t harness.T, ns *NS, link, bridge string) {
	t.Helper()
	ip := IP
	if ns != nil {
		ip = ns.IP
	}
	ip(t, "link", "set", link, "master", bridge)
}

// Forward accepts TCP connections on listen, an address in ns (nil: the
// test's namespace) that the test created, such as a bridge address other
// namespaces or VMs can reach, and relays each to target in the test's
// own namespace (such as an API server on loopback), until the test ends.
func Forward(t harness.T, ns *NS, listen, target string) {
	t.Helper()
	forward(t, ns, listen, target, nil)
}

// Metered is Forward that counts the bytes target sends back (what a
// client in ns receives, such as an API server's answers and watch
// events); it returns the address it listens on (listen may have port 0)
// and the count.
func Metered(t harness.T, ns *NS, listen, target string) (string, *atomic.Int64) {
	t.Helper()
	down := &atomic.Int64{}
	return forward(t, ns, listen, target, down), down
}

func forward(t harness.T, ns *NS, listen, target string, down *atomic.Int64) string {
	t.Helper()
	ln, err := ns.Listen("tcp", listen)
	if err != nil {
		t.Fatalf("forwarder on %s: %v", listen, err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go relay(in, target, down)
		}
	}()
	return ln.Addr().String()
}

// Listen opens a listener inside ns (nil: this process's namespace). The
// socket stays in ns; accepting and serving work from any goroutine.
func (ns *NS) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := ns.do(func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// DialContext connects from inside ns (nil: this process's namespace), so
// a test can be a client in a namespace it created. addr must be an IP
// literal: name resolution would run outside ns.
func (ns *NS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := ns.do(func() (err error) {
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// do runs f inside ns (nil: this process's namespace); see Do.
func (ns *NS) do(f func() error) error {
	if ns == nil {
		return f()
	}
	target, err := os.Open("/run/netns/" + ns.Name)
	if err != nil {
		return fmt.Errorf("netns %s: %w", ns.Name, err)
	}
	defer func() { _ = target.Close() }()
	return Do(int(target.Fd()), f)
}

// Do runs f on an OS thread that has entered the network namespace open as
// fd (a /run/netns file, a /proc/PID/ns/net file or a namespace handle),
// and moves the thread back afterwards. Sockets f opens stay in that
// namespace. A thread that cannot move back is not reused: it stays locked
// and ends with the goroutine.
func Do(fd int, f func() error) error {
	runtime.LockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer func() { _ = self.Close() }()
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering network namespace: %w", err)
	}
	ferr := f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("leaving network namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// relay copies between in and a connection to target until either side
// ends, adding what target sends to down (when not nil).
func relay(in net.Conn, target string, down *atomic.Int64) {
	defer func() { _ = in.Close() }()
	out, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		return
	}
	defer func() { _ = out.Close() }()
	var back io.Writer = in
	if down != nil {
		back = countingWriter{in, down}
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
	go func() { _, _ = io.Copy(back, out); done <- struct{}{} }()
	<-done
}

// countingWriter adds what it writes to n.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}
