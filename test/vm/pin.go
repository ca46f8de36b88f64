package vm

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

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
	return leastUsed(allowed, pinnedQEMUs(), tiebreak)
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
// CPU, that CPU.
func pinnedQEMUs() []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []int
	for _, d := range dirs {
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil || !strings.HasPrefix(string(comm), "qemu-system") {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
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
