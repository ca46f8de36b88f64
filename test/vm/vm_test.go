//go:build kernel

package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vipcast/vipcast/test/netns"
)

func TestResolveModules(t *testing.T) {
	skipIfDisabled(t)
	env, err := prepareOnce()
	if err != nil {
		t.Fatal(err)
	}
	paths, err := env.Kernel.ResolveModules(DefaultModules, OptionalModules)
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	var names []string
	for i, p := range paths {
		pos[modName(p)] = i
		names = append(names, modName(p))
	}
	t.Logf("kernel %s: %d modules: %s", env.Kernel.Release, len(names), strings.Join(names, " "))
	for _, before := range [][2]string{
		{"libcrc32c", "nf_conntrack"}, {"nf_defrag_ipv6", "nf_conntrack"}, {"nf_conntrack", "ip_vs"},
		{"ip_vs", "ip_vs_rr"}, {"ip_vs", "ip_vs_mh"}, {"crc32c_generic", "libcrc32c"},
	} {
		a, aok := pos[before[0]]
		b, bok := pos[before[1]]
		if !aok || !bok || a > b {
			t.Errorf("%s must load before %s: %v", before[0], before[1], names)
		}
	}
}

// TestMain runs guestHelper instead of the tests in the guest that
// TestVMExitCode boots (VM_HELPER_EXIT set).
func TestMain(m *testing.M) {
	if InVM() && os.Getenv("VM_HELPER_EXIT") != "" {
		os.Exit(guestHelper())
	}
	os.Exit(m.Run())
}

// guestHelper is what TestVMExitCode runs in the guest: it reports the
// guest's kernel and whether ip_vs is loaded, sleeps VM_HELPER_SLEEP and
// returns VM_HELPER_EXIT as the exit code.
func guestHelper() int {
	var u unix.Utsname
	_ = unix.Uname(&u)
	fmt.Printf("guest uname release %s\n", unix.ByteSliceToString(u.Release[:]))
	mods, _ := os.ReadFile("/proc/modules")
	for _, l := range strings.Split(string(mods), "\n") {
		if strings.HasPrefix(l, "ip_vs ") {
			fmt.Println("guest has module ip_vs")
		}
	}
	if cpuinfo, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(cpuinfo), "\n") {
			if strings.HasPrefix(l, "flags") {
				var fast []string
				for _, f := range strings.Fields(l) {
					if f == "erms" || f == "fsrm" {
						fast = append(fast, f)
					}
				}
				fmt.Printf("guest fast string flags %q\n", fast)
				break
			}
		}
	}
	if mib, err := strconv.Atoi(os.Getenv("VM_HELPER_COPY_MIB")); err == nil {
		copyWorkload(mib)
	}
	if d, err := time.ParseDuration(os.Getenv("VM_HELPER_SLEEP")); err == nil {
		time.Sleep(d)
	}
	code, _ := strconv.Atoi(os.Getenv("VM_HELPER_EXIT"))
	return code
}

// TestVMExitCode boots the VM and checks the guest's exit code, kernel and
// modules come back to the host.
func TestVMExitCode(t *testing.T) {
	if InVM() {
		t.Skip("host side only")
	}
	skipIfDisabled(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin, err := TestBinary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	var affinity []int
	nice := "?"
	res := Run(t, Options{
		TestBinary: bin,
		Env:        []string{"VM_HELPER_EXIT=7", "VM_HELPER_SLEEP=1s"},
		Timeout:    3 * time.Minute,
		Started: func(pid int) {
			var set unix.CPUSet
			if err := unix.SchedGetaffinity(pid, &set); err == nil {
				affinity = cpusOf(&set)
			}
			nice = niceOf(pid)
		},
	})
	// A single-vCPU VM runs on one host CPU (pinCPU), when there are two,
	// at nice Nice.
	if mine.Count() > 1 && len(affinity) != 1 {
		t.Errorf("qemu's CPU affinity is %v, want one CPU of %v", affinity, cpusOf(&mine))
	}
	if nice != strconv.Itoa(Nice) {
		t.Errorf("qemu's nice is %s, want %d", nice, Nice)
	}
	env, _ := prepareOnce()
	if res.ExitCode != 7 {
		t.Errorf("exit code %d, want 7", res.ExitCode)
	}
	wants := []string{"guest uname release " + env.Kernel.Release, "guest has module ip_vs"}
	if env.Accel == "tcg" {
		// TCGCPU: TCG runs rep movsb/stosb a byte at a time.
		wants = append(wants, `guest fast string flags []`)
	}
	for _, want := range wants {
		if !strings.Contains(res.Output, want) {
			t.Errorf("guest output lacks %q", want)
		}
	}
}

// niceOf returns a process's nice value, "?" if unknown: the 19th field of
// its stat, after the command in parentheses.
func niceOf(pid int) string {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "?"
	}
	if i := strings.LastIndexByte(string(stat), ')'); i > 0 {
		if f := strings.Fields(string(stat[i+1:])); len(f) > 16 {
			return f[16]
		}
	}
	return "?"
}

// pinningTest skips unless the host side runs with two CPUs or more, and
// returns a context bounded for a few VMs, the VM environment, the test
// binary for the guest and this process's CPUs.
func pinningTest(t *testing.T) (context.Context, *Env, string, unix.CPUSet) {
	t.Helper()
	if InVM() {
		t.Skip("host side only")
	}
	skipIfDisabled(t)
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	if mine.Count() < 2 {
		t.Skip("one CPU: VMs run unpinned")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	bin, err := TestBinary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	env, err := prepareOnce()
	if err != nil {
		t.Fatal(err)
	}
	return ctx, env, bin, mine
}

// TestVMsSpreadOverCPUs boots two VMs at once from one process: each runs
// pinned to one host CPU, the one with the fewest other pinned VMs at its
// start (the first counts for the second, so on an idle host with two
// CPUs or more they take different ones).
// The second starts in the Background (the idle scheduling policy), then
// gives way (GiveWay): it runs at the normal policy and nice
// vmNiceGiveWay, the first at Nice.
func TestVMsSpreadOverCPUs(t *testing.T) {
	ctx, env, bin, _ := pinningTest(t)
	// Through ip netns exec, as the labs start their VMs: the window
	// between the fork and qemu's exec is the widest.
	netns.Require(t)
	ns := netns.New(t, "pin")
	var wg sync.WaitGroup
	affinity := make([][]int, 2)
	// others are, for each VM at its start, the CPUs of the other pinned
	// qemus on the host: make test runs other packages' VMs beside this
	// test, and a CPU they crowd is rightly passed over by both.
	others := make([][]int, 2)
	nice := []string{"?", "?"}
	errs := make([]error, 2)
	var giveWay error
	idle := false
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = RunContext(ctx, env, Options{
				TestBinary: bin,
				Netns:      ns.Name,
				Env:        []string{"VM_HELPER_EXIT=0", "VM_HELPER_SLEEP=2s"},
				Timeout:    3 * time.Minute,
				Background: i == 1,
				Started: func(pid int) {
					var set unix.CPUSet
					if err := unix.SchedGetaffinity(pid, &set); err == nil {
						affinity[i] = cpusOf(&set)
					}
					others[i] = pinnedQEMUs(pid)
					if i == 1 {
						if a, err := unix.SchedGetAttr(pid, 0); err == nil {
							idle = a.Policy == unix.SCHED_IDLE
						}
						giveWay = GiveWay(pid)
					}
					nice[i] = niceOf(pid)
				},
			})
		}()
	}
	wg.Wait()
	for _, err := range append(errs, giveWay) {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Each VM runs on one CPU, the least crowded at its start: with no
	// other VM on the host the two take different CPUs, since the second
	// one's count has the first.
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	for i, cpus := range affinity {
		if len(cpus) != 1 {
			t.Errorf("VM %d runs on CPUs %v, want one", i, cpus)
			continue
		}
		for _, c := range cpusOf(&mine) {
			if count(others[i], cpus[0]) > count(others[i], c) {
				t.Errorf("VM %d runs on CPU %d, which had %d other pinned VMs at its start, while CPU %d had %d (others' CPUs: %v; the two VMs: %v and %v)",
					i, cpus[0], count(others[i], cpus[0]), c, count(others[i], c), others[i], affinity[0], affinity[1])
			}
		}
	}
	if !idle {
		t.Error("the VM started in the Background does not run at the idle scheduling policy")
	}
	if want := []string{strconv.Itoa(Nice), strconv.Itoa(vmNiceGiveWay)}; !slices.Equal(nice, want) {
		t.Errorf("the VMs' qemu run at nice %v, want %v (the second gives way)", nice, want)
	}
}

// TestVMLeavesACrowdedCPU: a VM pinned to the CPU other qemu processes
// are pinned to moves, every thread of it, to a less crowded one within a
// few seconds. The others are stand-ins: copies of sleep named like qemu,
// three of them, so that the CPU stays the most crowded while other
// packages' VMs run pinned beside this test (make test runs three packages
// at once: with one stand-in, a kernel test's VM on the other CPU made the
// counts even, and the VM rightly stayed).
func TestVMLeavesACrowdedCPU(t *testing.T) {
	ctx, env, bin, mine := pinningTest(t)
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	standIn := filepath.Join(t.TempDir(), "qemu-system-standin")
	if err := os.WriteFile(standIn, data, 0o755); err != nil { //nolint:gosec // an executable copy
		t.Fatal(err)
	}
	crowded := cpusOf(&mine)[0]
	var one unix.CPUSet
	one.Set(crowded)
	const standIns = 3
	for range standIns {
		other := exec.CommandContext(ctx, standIn, "60")
		if err := other.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = other.Process.Kill(); _ = other.Wait() }()
		if err := unix.SchedSetaffinity(other.Process.Pid, &one); err != nil {
			t.Fatal(err)
		}
	}
	moved := make(chan []int, 1)
	_, err = RunContext(ctx, env, Options{
		TestBinary: bin,
		Env:        []string{"VM_HELPER_EXIT=0", "VM_HELPER_SLEEP=20s"},
		Timeout:    3 * time.Minute,
		Started: func(pid int) {
			// Onto the stand-in's CPU, then watch it leave.
			tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*"))
			for _, task := range tasks {
				tid, _ := strconv.Atoi(filepath.Base(task))
				_ = unix.SchedSetaffinity(tid, &one)
			}
			go func() {
				for range 150 {
					var set unix.CPUSet
					if unix.SchedGetaffinity(pid, &set) == nil && !set.IsSet(crowded) && set.Count() == 1 {
						moved <- cpusOf(&set)
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
				moved <- nil
			}()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := <-moved; got == nil {
		t.Errorf("the VM stayed on CPU %d beside %d other pinned qemu for 15s, the most crowded CPU", crowded, standIns)
	}
}

// TestNodeRootfs boots a VM with the node root filesystem as its disk,
// mounts it and runs the node's networking tools chrooted into it.
func TestNodeRootfs(t *testing.T) {
	if !InVM() {
		// ip_set on demand: `ipset --version` asks the kernel, which fails
		// without ip_set; the kernel loads it through the initramfs's
		// modprobe, also for a program chrooted into the disk.
		RunTest(t, Options{Disk: RootfsImage(t), OnDemandModules: []string{"ip_set"}, Timeout: 4 * time.Minute})
		return
	}
	const root = "/node"
	start := time.Now()
	if err := MountRootfs(root); err != nil {
		t.Fatal(err)
	}
	t.Logf("rootfs mounted in %s", time.Since(start).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		argv []string
		want string // in the combined output
	}{
		{[]string{"iptables", "--version"}, "(nf_tables)"},
		{[]string{"ip6tables", "--version"}, "(nf_tables)"},
		{[]string{"nft", "list", "ruleset"}, ""},
		{[]string{"runc", "--version"}, "runc version"},
		{[]string{"conntrack", "--version"}, "conntrack v"},
		{[]string{"ipset", "--version"}, "ipset v"},
		{[]string{"ipvsadm", "--version"}, "ipvsadm v"},
		{[]string{"test", "-x", "/usr/lib/cni/bridge"}, ""},
		{[]string{"test", "-x", "/usr/lib/cni/host-local"}, ""},
		{[]string{"test", "-x", "/usr/lib/cni/loopback"}, ""},
		{[]string{"ip", "-br", "link", "show", "lo"}, "lo"},
		{[]string{"mount"}, "cgroup2 on /sys/fs/cgroup"},
		{[]string{"cat", "/sys/fs/cgroup/cgroup.controllers"}, "memory"},
		{[]string{"curl", "--version"}, "curl "},
		// kube-proxy's IPVS clean-up runs this first, and skips itself
		// when it fails.
		{[]string{"modprobe", "-va", "ip_vs"}, ""},
	} {
		cmd := ChrootCommand(ctx, root, c.argv[0], c.argv[1:]...)
		out, err := cmd.CombinedOutput()
		line := strings.Join(c.argv, " ")
		if err != nil {
			t.Errorf("%s (chrooted into %s): %v\n%s", line, root, err, out)
			continue
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("%s: output lacks %q:\n%s", line, c.want, out)
			continue
		}
		t.Logf("%s: %s", line, strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]))
	}
	if _, err := os.Stat("/sys/module/ip_set"); err != nil {
		t.Errorf("ip_set was not autoloaded for ipset: %v", err)
	}
}
