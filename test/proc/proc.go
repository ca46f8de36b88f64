// Package proc starts and stops the real components tests run (API server,
// etcd, routers, vipcast binaries) as child processes that never outlive
// the test: each gets its own process group, is killed if the test process
// dies, and is stopped by the caller, usually in t.Cleanup.
package proc

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// Process is a child process started by Start.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts path with args, its output appended to logPath. The child
// gets its own process group and is killed if the test process dies.
func Start(logPath, path string, args ...string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("log file: %w", err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = logFile.Close(); close(p.done) }()
	return p, nil
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Pid returns the process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process group.
func (p *Process) Signal(sig syscall.Signal) {
	_ = syscall.Kill(-p.cmd.Process.Pid, sig)
}

// Stop sends SIGTERM to the process group, waits up to grace for the
// process to exit and then kills the group. Safe to call more than once.
func (p *Process) Stop(grace time.Duration) {
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	p.Kill()
}

// Kill kills the process group at once and waits for the process.
func (p *Process) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// FreePorts returns n distinct TCP ports that were free on host (an IP
// address, such as 127.0.0.1).
func FreePorts(host string, n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("free port on %s: %w", host, err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
