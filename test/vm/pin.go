package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A single-vCPU VM's qemu runs pinned to one host CPU, all its threads:
// its vCPU thread and its I/O thread wake each other for every timer and
// packet, and across two CPUs each wake-up is a rescheduling interrupt.
// On this kind of machine, itself a VM, those interrupts are dear:
// measured beside the lab's real cluster (two such VMs on two cores), about
// 1,000 a second per CPU, and the host spent ~43% of its CPU as system
// time, most of it in interrupt handling; pinned, 12 a second and ~8%.
// Everything else (the API server, the tests, other VMs) still runs on any
// CPU.

// Nice is the nice value of a pinned VM's qemu (and of the real cluster's
// control plane in test/lab, which shares the CPU with its VMs). A pinned
// qemu at nice 0 keeps its CPU from the host's other tasks: a task
// sleeping 20 ms at a time, beside the real cluster's two pinned VMs and
// the rest of make test, woke up to 1.4 s late at the 99th percentile and
// 4.4 s at worst, which took a 100 ms x 3 BFD session and a 5 s read of
// the ToR's routes down in test/e2e. At nice 10: 15-80 ms and 0.1-0.5 s
// (unpinned at nice 0, as before pinning: 180 ms and 0.7 s). The VM still
// has every cycle the host's tasks leave, and they are the API servers,
// routers and speakers the tests time.
const Nice = 10

// vmNiceGiveWay is the nice value GiveWay gives a VM's qemu: beside a VM
// at Nice on its CPU it gets about a quarter of it when both are busy (CFS
// weights 36 and 110), and all of what the other leaves. A node VM that
// booted beside a serving one at equal weight took half its CPU for
// minutes; the serving node's kubelet and speaker then missed their
// deadlines (a BGP hold timer, readiness probes) as no real node would.
const vmNiceGiveWay = 15

// GiveWay moves the qemu process pid (Options.Started gives it), every
// thread of it, to the normal scheduling policy at nice vmNiceGiveWay, so
// that the VMs serving on its CPU keep most of it: for a node that joins
// a running lab, whose start on real hardware would take no CPU from the
// others. A VM started in the Background leaves the idle policy.
func GiveWay(pid int) error {
	tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
	if err != nil {
		return fmt.Errorf("threads of %d: %w", pid, err)
	}
	attr := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: 0 /* SCHED_OTHER */, Nice: vmNiceGiveWay}
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetAttr(tid, attr, 0); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("scheduling of thread %d of %d: %w", tid, pid, err)
		}
	}
	return nil
}

// pinCPU returns the host CPU to pin a new single-vCPU VM to: of the CPUs
// this process may use, the one the fewest other pinned qemu processes run
// on, ties broken by tiebreak (so that two test processes starting VMs at
// once spread them). ok is false on a single CPU: nothing to gain.
func pinCPU(tiebreak int) (cpu int, ok bool) {
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		return 0, false
	}
	allowed := cpusOf(&mine)
	return leastUsed(allowed, pinnedQEMUs(0), tiebreak)
}

// leastUsed picks, of allowed, the CPU that appears least in pinned, the
// CPUs other VMs run on; among equals, the tiebreak-th (modulo their
// number). It needs two CPUs or more.
func leastUsed(allowed, pinned []int, tiebreak int) (int, bool) {
	if len(allowed) < 2 {
		return 0, false
	}
	count := map[int]int{}
	for _, c := range pinned {
		count[c]++
	}
	low := -1
	var best []int
	for _, c := range allowed {
		switch n := count[c]; {
		case low < 0 || n < low:
			low, best = n, []int{c}
		case n == low:
			best = append(best, c)
		}
	}
	if tiebreak < 0 {
		tiebreak = -tiebreak
	}
	return best[tiebreak%len(best)], true
}

// pinnedQEMUs returns, for every running qemu process pinned to a single
// CPU other than the process except (0: none), that CPU.
func pinnedQEMUs(except int) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []int
	for _, d := range dirs {
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil || !strings.HasPrefix(string(comm), "qemu-system") {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == except {
			continue
		}
		var set unix.CPUSet
		if unix.SchedGetaffinity(pid, &set) != nil {
			continue
		}
		if cpus := cpusOf(&set); len(cpus) == 1 {
			out = append(out, cpus[0])
		}
	}
	return out
}

// cpusOf lists the CPUs in set.
func cpusOf(set *unix.CPUSet) []int {
	var out []int
	for c := range 1024 {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out
}

// hostLock takes the lock that every process on the host holds while it
// places a VM; unlock releases it. ok is false when it cannot be had.
func hostLock() (unlock func(), ok bool) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "vipcast-vm-pin.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, false
	}
	return func() { _ = f.Close() }, true
}

// rebalance moves the pinned qemu pid, every thread of it, to a CPU with
// fewer other pinned VMs than its own, until ctx ends: VMs come and go (a
// kernel test's for seconds, a lab node's for most of an hour), and a lab
// node placed beside a short one should not stay crowded after it went.
// A VM moves only when that makes the counts more even, so two VMs never
// chase each other.
func rebalance(ctx context.Context, pid int) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !moveIfCrowded(pid) {
			return
		}
	}
}

// moveIfCrowded moves pid to the least used CPU if its own has more other
// pinned VMs than that one; false when pid is no longer a pinned qemu.
func moveIfCrowded(pid int) bool {
	unlock, ok := hostLock()
	if !ok {
		return false
	}
	defer unlock()
	var set, mine unix.CPUSet
	if unix.SchedGetaffinity(pid, &set) != nil || unix.SchedGetaffinity(0, &mine) != nil {
		return false
	}
	cur := cpusOf(&set)
	if len(cur) != 1 {
		return false
	}
	others := pinnedQEMUs(pid)
	best, ok := leastUsed(cpusOf(&mine), others, 0)
	if !ok || best == cur[0] || count(others, cur[0]) <= count(others, best) {
		return true
	}
	var one unix.CPUSet
	one.Set(best)
	tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*"))
	for _, task := range tasks {
		if tid, err := strconv.Atoi(filepath.Base(task)); err == nil {
			_ = unix.SchedSetaffinity(tid, &one)
		}
	}
	return true
}

// count is how many times v is in l.
func count(l []int, v int) int {
	n := 0
	for _, x := range l {
		if x == v {
			n++
		}
	}
	return n
}

// startPinned starts cmd, a qemu (or a command that execs one), pinned
// to the CPU pinCPU picks. Picking and starting hold a lock shared by
// every process on the host, released once the new process is qemu (its
// exec done): until then the next VM's pick would not count it. Pinning
// is best effort: without the lock, or on one CPU, cmd starts unpinned.
// The caller has locked the OS thread.
func startPinned(cmd *exec.Cmd, tiebreak int) error {
	unlock, ok := hostLock()
	if !ok {
		return cmd.Start()
	}
	defer unlock()
	cpu, ok := pinCPU(tiebreak)
	if !ok {
		return cmd.Start()
	}
	if err := withCPU(cpu, cmd.Start); err != nil {
		return err
	}
	comm := filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "comm")
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, err := os.ReadFile(comm)
		if err != nil || strings.HasPrefix(string(b), "qemu-system") {
			break // gone, or qemu: counted from now on
		}
	}
	return nil
}

// withCPU runs start on the calling OS thread pinned to cpu, so that the
// process it forks (and every thread that process makes) inherits the
// affinity, and gives the thread its own affinity back. The caller has
// locked the OS thread.
func withCPU(cpu int, start func() error) error {
	var saved, one unix.CPUSet
	if err := unix.SchedGetaffinity(0, &saved); err != nil {
		return start()
	}
	one.Set(cpu)
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		return start()
	}
	defer func() { _ = unix.SchedSetaffinity(0, &saved) }()
	return start()
}
