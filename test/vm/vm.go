// Package vm runs Go test code inside a real Linux kernel: Debian's
// bookworm kernel (which has IPVS as modules, unlike many CI hosts) booted
// under qemu with a generated initramfs whose /init loads the modules, runs a
// static test binary and powers off.
//
// The usual pattern lets a plain `go test ./ipvs/` run its kernel tests in
// the VM:
//
//	func TestSomethingInKernel(t *testing.T) {
//		if !vm.InVM() {
//			vm.RunTest(t, vm.Options{}) // boots a VM running only this test
//			return
//		}
//		// ... the real checks, as root in the guest kernel ...
//	}
//
// Everything needed is fetched on first use and cached under
// $VIPCAST_CACHE (default ~/.cache/vipcast): the kernel package is
// downloaded with apt-get and extracted with dpkg -x (never installed), and
// qemu-system-x86 is installed with apt-get when missing. `go run
// ./test/vm/cmd/fetch` does the same ahead of time. `go test -short` skips
// VM tests, and so does VIPCAST_SKIP_VM=1.
//
// For VMs that need a Debian userland (Kubernetes nodes), FetchRootfs builds
// a cached ext4 image, Options.Disk attaches it, and the guest program
// mounts it with MountRootfs and runs programs chrooted into it
// (ChrootCommand); the initramfs stays the root of PID 1, so its module
// loading keeps working.
package vm

import (
	"bufio"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ExitMarker precedes the guest test's exit code on the console; keep in
// sync with test/vm/init.
const ExitMarker = "VIPCAST-VM-EXIT:"

// EnvInVM is set to 1 in the environment of the test binary in the guest.
const EnvInVM = "VIPCAST_IN_VM"

// DefaultModules are loaded in every VM: IPVS with its common schedulers,
// conntrack, and dummy/veth links for test topologies. The guest cannot run
// modprobe, so an IPVS scheduler that is not loaded makes NewService fail
// with ENOENT.
var DefaultModules = []string{
	"nf_defrag_ipv4", "nf_defrag_ipv6", "crc32c_generic", "libcrc32c", "nf_conntrack",
	"ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "ip_vs_mh", "ip_vs_lc", "ip_vs_wlc",
	"dummy", "veth",
}

// OptionalModules are loaded when the kernel has them: NAT with nftables for
// source NAT (externalTrafficPolicy: Cluster).
var OptionalModules = []string{
	"nf_nat", "nf_tables", "nft_ct", "nft_nat", "nft_chain_nat", "nft_masq", "nf_conntrack_netlink",
	// The host guard's metrics rules (fib saddr type local).
	"nft_fib", "nft_fib_ipv4", "nft_fib_ipv6",
	// The in-cluster map's and tier 2's slots (numgen random, jhash).
	"nft_numgen", "nft_hash",
}

// InVM reports whether this process is the test binary inside the VM.
func InVM() bool { return os.Getenv(EnvInVM) == "1" }

// Options configure one VM run.
type Options struct {
	// TestBinary is the static (CGO_ENABLED=0) program the guest runs.
	// RunTest fills it in.
	TestBinary string
	// Args are its arguments; Env is added to its environment.
	Args []string
	Env  []string
	// Timeout bounds the whole run, boot included. Default 5 minutes, and
	// never past the calling test's deadline.
	Timeout time.Duration
	// Modules must exist; OptionalModules are loaded when they exist. Nil
	// means DefaultModules / OptionalModules. Dependencies are added.
	Modules         []string
	OptionalModules []string
	// OnDemandModules (and their dependencies) are put in the initramfs
	// but not loaded at boot: the guest's /sbin/modprobe loads them, by
	// name or by alias, when the kernel asks for them (module autoloading)
	// or a program runs modprobe.
	OnDemandModules []string
	// MemoryMB (default 512) and CPUs (default 1) of the guest.
	MemoryMB int
	CPUs     int
	// CPU is qemu's -cpu model; default TCGCPU under TCG, the host's CPU
	// under KVM.
	CPU string
	// Background runs qemu at the idle scheduling policy (SCHED_IDLE): it
	// gets only the CPU time no other task wants. For a VM booted ahead
	// of need (a lab's spare node), until GiveWay.
	Background bool
	// Logf receives every console line as it arrives.
	Logf Logf
	// Files are added to the initramfs: guest path (relative to /, such
	// as "vm/bin/vipcast-speaker") to host path. They are executable.
	Files map[string]string
	// Netns runs qemu inside that network namespace (as root), so that
	// tap devices created there can back the guest's NICs (QEMUArgs).
	Netns string
	// QEMUArgs are appended to qemu's command line; the default has no
	// NIC at all.
	QEMUArgs []string
	// Started, when set, receives qemu's process id once it runs (to
	// freeze the whole guest with SIGSTOP, say).
	Started func(pid int)
	// Disk, when set, is a raw disk image (such as FetchRootfs's ext4
	// image) the guest sees as DiskDevice, /dev/vda. qemu opens it with
	// snapshot=on: the file is only read, so any number of VMs can share
	// it, and the guest's writes go to a temporary overlay that is gone
	// when qemu exits. DiskModules are added to Modules. MountRootfs
	// mounts it in the guest.
	Disk string
}

// Result of a VM run.
type Result struct {
	Output   string        // console output, \r removed
	ExitCode int           // the guest test's exit code
	Boot     time.Duration // until /init reported the modules loaded
	Total    time.Duration // qemu start to exit
}

// Env describes the prepared host side: kernel and qemu.
type Env struct {
	Kernel *Kernel
	QEMU   string
	Accel  string // "tcg" or "kvm"
}

// Prepare fetches the kernel and installs qemu when needed.
func Prepare(ctx context.Context, logf Logf) (*Env, error) {
	k, err := FetchKernel(ctx, logf)
	if err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		logf.printf("vm: installing qemu-system-x86 with apt-get (first time only)")
	}
	if err := ensureCommand(ctx, "qemu-system-x86_64", "qemu-system-x86"); err != nil {
		return nil, err
	}
	q, _ := exec.LookPath("qemu-system-x86_64")
	return &Env{Kernel: k, QEMU: q, Accel: accel()}, nil
}

// accel picks KVM only when a real KVM module is loaded: a /dev/kvm provided
// by other means (software nesting) can hang a stock kernel.
func accel() string {
	if a := os.Getenv("VIPCAST_VM_ACCEL"); a != "" {
		return a
	}
	for _, m := range []string{"/sys/module/kvm_intel", "/sys/module/kvm_amd"} {
		if _, err := os.Stat(m); err == nil {
			if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err == nil {
				_ = f.Close()
				return "kvm"
			}
		}
	}
	return "tcg"
}

// modulesCPIO returns a cached cpio archive holding the resolved modules and
// their load order (/vm/modules/<name>.ko, /vm/modules.order).
func (k *Kernel) modulesCPIO(required, optional []string) (string, []string, error) {
	paths, err := k.ResolveModules(required, optional)
	if err != nil {
		return "", nil, err
	}
	var names []string
	for _, p := range paths {
		names = append(names, modName(p))
	}
	sum := sha256.Sum256([]byte(strings.Join(names, ",")))
	out := filepath.Join(k.Dir, "initrd-modules-"+hex.EncodeToString(sum[:8])+".cpio")
	if _, err := os.Stat(out); err == nil {
		return out, names, nil
	}
	f, err := os.CreateTemp(k.Dir, ".initrd-modules-*")
	if err != nil {
		return "", nil, err
	}
	defer func() { _ = os.Remove(f.Name()) }()
	bw := bufio.NewWriter(f)
	w := newCPIOWriter(bw)
	for i, p := range paths {
		w.CopyFile("vm/modules/"+names[i]+".ko", 0o644, p)
	}
	w.File("vm/modules.order", 0o644, []byte(strings.Join(names, "\x00")))
	err = w.Close()
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", nil, err
	}
	return out, names, os.Rename(f.Name(), out)
}

// workDir is a per-process scratch directory in the cache for built
// binaries and initrds; directories of dead processes are removed.
var workDir = sync.OnceValues(func() (string, error) {
	base := filepath.Join(CacheDir(), "vm-run")
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	old, _ := filepath.Glob(filepath.Join(base, "pid-*"))
	for _, d := range old {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "pid-"))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); errors.Is(err, os.ErrNotExist) {
			_ = os.RemoveAll(d)
		}
	}
	d := filepath.Join(base, fmt.Sprintf("pid-%d", os.Getpid()))
	if err := os.RemoveAll(d); err != nil {
		return "", err
	}
	return d, os.MkdirAll(d, 0o755)
})

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	// Without go on PATH (sudo's secure_path), fall back to the toolchain
	// that built this test binary, which is the one go test ran.
	return filepath.Join(runtime.GOROOT(), "bin", "go") //nolint:staticcheck // SA1019: see above
}

func goBuild(ctx context.Context, dir string, args ...string) error {
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Dir = dir
	// The guest has no libc: no cgo, hence no -race/-msan/-asan either.
	var flags []string
	for _, f := range strings.Fields(os.Getenv("GOFLAGS")) {
		if !strings.HasPrefix(f, "-race") && !strings.HasPrefix(f, "-msan") && !strings.HasPrefix(f, "-asan") {
			flags = append(flags, f)
		}
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOFLAGS="+strings.Join(flags, " "))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

var initOnce = sync.OnceValues(func() (string, error) {
	wd, err := workDir()
	if err != nil {
		return "", err
	}
	out := filepath.Join(wd, "init")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	return out, goBuild(ctx, "", "build", "-ldflags=-s -w", "-o", out, "github.com/vipcast/vipcast/test/vm/init")
})

// BuildStatic builds the Go package pkg (an import path or ./relative to
// dir) into out as a static binary for the guest. It compiles as go test
// does under make test (CGO_ENABLED=0, no -trimpath), so that the two share
// their compiled packages.
func BuildStatic(ctx context.Context, dir, pkg, out string) error {
	return goBuild(ctx, dir, "build", "-ldflags=-s -w", "-o", out, pkg)
}

// StaticBinary returns pkg built as BuildStatic builds it, named name, in
// the process's work directory: each package is built once per process,
// so that the labs a test binary boots one after another share one build.
func StaticBinary(ctx context.Context, pkg, name string) (string, error) {
	return buildOnce("static", pkg, name, func(out string) error { return BuildStatic(ctx, "", pkg, out) })
}

// buildOnce returns the file build wrote for key, building it on the
// first call for (kind, key) in this process: at <work dir>/<kind>-<hash
// of key>/<name>.
func buildOnce(kind, key, name string, build func(out string) error) (string, error) {
	builtMu.Lock()
	defer builtMu.Unlock()
	if p, ok := built[kind+" "+key]; ok {
		return p, nil
	}
	wd, err := workDir()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(key))
	out := filepath.Join(wd, kind+"-"+hex.EncodeToString(sum[:6]), name)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", err
	}
	if err := build(out); err != nil {
		return "", err
	}
	built[kind+" "+key] = out
	return out, nil
}

// BuildInit builds the guest /init (once per process).
func BuildInit() (string, error) { return initOnce() }

var (
	// builtMu guards built: what buildOnce built in this process.
	builtMu sync.Mutex
	built   = map[string]string{}
)

// IsStatic reports whether the ELF file at path has no program interpreter.
func IsStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	if f.Machine != elf.EM_X86_64 {
		return false
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// TestBinary returns a static test binary of the package under test (the
// current directory): os.Args[0] when it is already static, otherwise one
// built with `CGO_ENABLED=0 go test -c` (once per package per process) with
// the build tags of this binary, so that the guest has the same tests (the
// kernel tier's tests are in files with a build tag).
func TestBinary(ctx context.Context) (string, error) {
	if IsStatic(os.Args[0]) {
		return os.Args[0], nil
	}
	cwd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	bi, ok := debug.ReadBuildInfo()
	return buildOnce("test", cwd, "test.bin", func(out string) error {
		return goBuild(ctx, cwd, testBuildArgs(bi, ok, out)...)
	})
}

// testBuildArgs returns the arguments of `go test -c` for a test binary at
// out built with the same build tags as the binary whose build info is bi
// (ok false: none known, no tags).
func testBuildArgs(bi *debug.BuildInfo, ok bool, out string) []string {
	args := []string{"test", "-c", "-vet=off"}
	if ok {
		for _, s := range bi.Settings {
			if s.Key == "-tags" && s.Value != "" {
				args = append(args, "-tags", s.Value)
			}
		}
	}
	return append(args, "-o", out, ".")
}

// RunContext boots a VM that runs opts.TestBinary and returns its output
// and exit code. An error means the harness failed (no exit marker: boot
// failure, guest panic, timeout).
func RunContext(ctx context.Context, env *Env, opts Options) (*Result, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()

	rd, initrd, err := runInitrd(env, opts)
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(rd) }()

	start := time.Now()
	argv := qemuArgv(env, opts, initrd)
	if opts.Background {
		argv = append([]string{"chrt", "--idle", "0"}, argv...)
	}
	cmd, console, err := startQEMU(ctx, argv, opts.CPUs == 1)
	if err != nil {
		return nil, err
	}
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }()
	if opts.Started != nil {
		opts.Started(cmd.Process.Pid)
	}
	if opts.CPUs == 1 {
		go rebalance(ctx, cmd.Process.Pid)
	}

	res := readConsole(console, start, opts.Logf)
	_ = console.Close()
	werr := cmd.Wait()
	res.Total = time.Since(start)
	if res.ExitCode < 0 {
		if ctx.Err() != nil {
			return res, fmt.Errorf("vm: no result after %s (timeout): %w", opts.Timeout, ctx.Err())
		}
		// werr is nil when qemu exited cleanly: %v, not %w.
		return res, fmt.Errorf("vm: qemu ended without an exit marker (boot failure or guest panic): %v", werr) //nolint:errorlint // see above
	}
	return res, nil
}

// withDefaults checks that o names a static test binary and fills in the
// defaults of the fields left zero.
func (o Options) withDefaults() (Options, error) {
	if o.TestBinary == "" {
		return o, errors.New("vm: Options.TestBinary is empty")
	}
	if !IsStatic(o.TestBinary) {
		return o, fmt.Errorf("vm: %s is not a static amd64 binary (build it with CGO_ENABLED=0)", o.TestBinary)
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.Modules == nil {
		o.Modules = DefaultModules
	}
	if o.OptionalModules == nil {
		o.OptionalModules = OptionalModules
	}
	if o.Disk != "" {
		if _, err := os.Stat(o.Disk); err != nil {
			return o, fmt.Errorf("vm: Options.Disk: %w", err)
		}
		o.Modules = slices.Concat(o.Modules, DiskModules)
	}
	if o.MemoryMB == 0 {
		o.MemoryMB = 512
	}
	if o.CPUs == 0 {
		o.CPUs = 1
	}
	return o, nil
}

// runInitrd writes the initramfs of one run (the cached modules, /init, the
// test binary and opts' files) into a new directory of the work directory.
// The caller removes dir.
func runInitrd(env *Env, opts Options) (dir, initrd string, err error) {
	mods, _, err := env.Kernel.modulesCPIO(opts.Modules, opts.OptionalModules)
	if err != nil {
		return "", "", err
	}
	initBin, err := BuildInit()
	if err != nil {
		return "", "", err
	}
	wd, err := workDir()
	if err != nil {
		return "", "", err
	}
	if opts, err = withOnDemand(env.Kernel, opts); err != nil {
		return "", "", err
	}
	dir, err = os.MkdirTemp(wd, "run-")
	if err != nil {
		return "", "", err
	}
	initrd = filepath.Join(dir, "initrd")
	if err := writeInitrd(initrd, mods, initBin, opts); err != nil {
		_ = os.RemoveAll(dir)
		return "", "", err
	}
	return dir, initrd, nil
}

// withOnDemand adds opts.OnDemandModules and their dependencies to
// opts.Files, under /vm/modules where the guest's modprobe finds them; those
// loaded at boot are left out.
func withOnDemand(k *Kernel, opts Options) (Options, error) {
	if len(opts.OnDemandModules) == 0 {
		return opts, nil
	}
	boot, err := k.ResolveModules(opts.Modules, opts.OptionalModules)
	if err != nil {
		return opts, err
	}
	loaded := map[string]bool{}
	for _, p := range boot {
		loaded[modName(p)] = true
	}
	paths, err := k.ResolveModules(opts.OnDemandModules, nil)
	if err != nil {
		return opts, fmt.Errorf("on-demand modules: %w", err)
	}
	files := maps.Clone(opts.Files)
	if files == nil {
		files = map[string]string{}
	}
	for _, p := range paths {
		if !loaded[modName(p)] {
			files["vm/modules/"+modName(p)+".ko"] = p
		}
	}
	opts.Files = files
	return opts, nil
}

// TCGCPU is the guest CPU under TCG: every feature qemu emulates, but the
// fast string operations ERMS and FSRM. With them, the guest kernel copies
// and clears memory with `rep movsb`/`rep stosb` (copy_user, clear_page,
// memcpy), which TCG runs a byte at a time; without them it uses wider
// moves. Writing a file, reading it, faulting in memory and every packet
// copied to or from a socket then cost half as much of an emulated CPU
// (BenchmarkGuestCopy).
const TCGCPU = "max,-erms,-fsrm"

// qemuArgv is the command line booting env's kernel with initrd: qemu
// itself, inside opts.Netns when set.
func qemuArgv(env *Env, opts Options, initrd string) []string {
	cpu := TCGCPU
	if env.Accel == "kvm" {
		cpu = "host"
	}
	if opts.CPU != "" {
		cpu = opts.CPU
	}
	// no_timer_check: the kernel's boot-time check that the timer
	// interrupt arrives within a busy loop fails, and panics ("IO-APIC +
	// timer doesn't work"), in an emulated CPU that the host starves (a
	// Background VM), as on any loaded hypervisor; the timer works.
	args := []string{
		"-machine", "pc,accel=" + env.Accel, "-cpu", cpu,
		"-m", strconv.Itoa(opts.MemoryMB), "-smp", strconv.Itoa(opts.CPUs),
		"-nographic", "-no-reboot", "-nic", "none",
		"-kernel", env.Kernel.Vmlinux, "-initrd", initrd,
		"-append", "console=ttyS0 quiet panic=-1 mitigations=off no_timer_check",
	}
	if opts.Disk != "" {
		// cache=unsafe: the writes are thrown away anyway.
		args = append(args, "-drive", "file="+strings.ReplaceAll(opts.Disk, ",", ",,")+
			",if=virtio,format=raw,snapshot=on,cache=unsafe")
	}
	args = append(args, opts.QEMUArgs...)
	argv := append([]string{env.QEMU}, args...)
	if opts.Netns != "" {
		argv = append([]string{"ip", "netns", "exec", opts.Netns}, argv...)
	}
	return argv
}

// startQEMU starts argv in its own process group, which dies with this
// process and is killed when ctx ends, and returns the command and the read
// end of its console (standard output and error). With pin, qemu runs on
// one host CPU (see pinCPU) at nice Nice. The caller closes the console
// and waits for the command.
func startQEMU(ctx context.Context, argv []string, pin bool) (*exec.Cmd, *os.File, error) {
	if pin {
		argv = append([]string{"nice", "-n", strconv.Itoa(Nice)}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	// Pdeathsig follows the thread that forked: keep it alive while
	// starting. The thread's affinity, when pinned, passes to qemu.
	runtime.LockOSThread()
	if pin {
		err = startPinned(cmd, rand.IntN(1<<20)) //nolint:gosec // a tie-break, not a secret
	} else {
		err = cmd.Start()
	}
	runtime.UnlockOSThread()
	_ = pw.Close()
	if err != nil {
		_ = pr.Close()
		return nil, nil, err
	}
	return cmd, pr, nil
}

// readConsole reads the guest's console until it closes, passing every
// cleaned line to logf (nil: none), and returns the output, the exit code
// after ExitMarker (-1 without one) and the boot time counted from start.
func readConsole(console io.Reader, start time.Time, logf Logf) *Result {
	res := &Result{ExitCode: -1}
	var out strings.Builder
	sc := bufio.NewScanner(console)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line, ok := consoleLine(sc.Text())
		if !ok {
			continue
		}
		out.WriteString(line)
		out.WriteByte('\n')
		if res.Boot == 0 && strings.Contains(line, "vm-init: modules loaded") {
			res.Boot = time.Since(start)
		}
		if i := strings.Index(line, ExitMarker); i >= 0 {
			if n, err := strconv.Atoi(strings.TrimSpace(line[i+len(ExitMarker):])); err == nil {
				res.ExitCode = n
			}
		}
		if logf != nil {
			logf("%s", line)
		}
	}
	res.Output = out.String()
	return res
}

// consoleLine strips carriage returns and SeaBIOS's terminal control
// sequences and boot message from a console line; it reports false for a
// line that is SeaBIOS's banner.
func consoleLine(raw string) (string, bool) {
	line := ansiEscape.ReplaceAllString(strings.ReplaceAll(raw, "\r", ""), "")
	if strings.HasPrefix(line, "SeaBIOS (version ") {
		return "", false
	}
	return strings.TrimPrefix(line, "Booting from ROM.."), true
}

// ansiEscape matches the terminal control sequences SeaBIOS prints.
var ansiEscape = regexp.MustCompile(`\x1b(\[[0-9;?]*[a-zA-Z]|c)`)

func writeInitrd(path, modules, initBin string, opts Options) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }() // for the error paths: the end closes and checks
	m, err := os.Open(modules)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, m)
	_ = m.Close()
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	w := newCPIOWriter(bw)
	w.Dir("dev")
	w.CharDev("dev/console", 0o600, 5, 1)
	w.Dir("proc")
	w.Dir("sys")
	w.Dir("tmp")
	w.Dir("run")
	w.CopyFile("init", 0o755, initBin)
	w.Symlink("sbin/modprobe", "/init")
	w.CopyFile("vm/test", 0o755, opts.TestBinary)
	for _, guest := range slices.Sorted(maps.Keys(opts.Files)) {
		w.CopyFile(guest, 0o755, opts.Files[guest])
	}
	w.File("vm/args", 0o644, []byte(strings.Join(opts.Args, "\x00")))
	w.File("vm/env", 0o644, []byte(strings.Join(opts.Env, "\x00")))
	if err := w.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return f.Close()
}

func deadlineCtx(t testing.TB) (context.Context, context.CancelFunc) {
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if dl, ok := d.Deadline(); ok {
			return context.WithDeadline(context.Background(), dl.Add(-5*time.Second))
		}
	}
	return context.WithCancel(context.Background())
}

func skipIfDisabled(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("VM test: skipped with -short")
	}
	if os.Getenv("VIPCAST_SKIP_VM") != "" {
		t.Skip("VM test: skipped by VIPCAST_SKIP_VM")
	}
}

var prepareOnce = sync.OnceValues(func() (*Env, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	return Prepare(ctx, func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) })
})

// Run boots a VM for t (see RunContext), streaming the console into t's log.
// Harness failures are fatal; the guest's exit code is in the result.
func Run(t testing.TB, opts Options) *Result {
	t.Helper()
	skipIfDisabled(t)
	env, err := prepareOnce()
	if err != nil {
		t.Fatalf("vm: prepare: %v", err)
	}
	ctx, cancel := deadlineCtx(t)
	defer cancel()
	if opts.Logf == nil {
		opts.Logf = func(f string, a ...any) { t.Logf("vm| "+f, a...) }
	}
	res, err := RunContext(ctx, env, opts)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Logf("vm: kernel %s (%s, %s), boot %s, total %s, exit %d",
		env.Kernel.Release, env.Kernel.Version, env.Accel, res.Boot.Round(time.Millisecond), res.Total.Round(time.Millisecond), res.ExitCode)
	return res
}

// runPattern is a -test.run pattern matching exactly the (sub)test name.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	return strings.Join(parts, "/")
}

// RunTest runs the calling test inside a VM: it builds a static binary of the
// package under test, boots the VM with -test.run matching only t, streams
// the guest's output into t's log and fails t unless the guest test passed.
// Call it when !InVM() and return.
func RunTest(t *testing.T, opts Options) {
	t.Helper()
	skipIfDisabled(t)
	if InVM() {
		t.Fatal("vm.RunTest called inside the VM")
	}
	ctx, cancel := deadlineCtx(t)
	defer cancel()
	bin, err := TestBinary(ctx)
	if err != nil {
		t.Fatalf("vm: build test binary: %v", err)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Minute
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < opts.Timeout {
		opts.Timeout = time.Until(dl)
	}
	opts.TestBinary = bin
	// The guest test times out first, so its goroutine dump reaches us.
	inner := opts.Timeout - 30*time.Second
	if inner < opts.Timeout/2 {
		inner = opts.Timeout / 2
	}
	opts.Args = append([]string{"-test.run", runPattern(t.Name()), "-test.v", "-test.count=1",
		"-test.timeout", inner.String()}, opts.Args...)
	res := Run(t, opts)
	if res.ExitCode != 0 {
		t.Fatalf("vm: guest test exited %d", res.ExitCode)
	}
	if strings.Contains(res.Output, "--- SKIP: "+t.Name()+" ") {
		t.Skip("vm: the guest test skipped")
	}
	if !strings.Contains(res.Output, "--- PASS: "+t.Name()+" ") {
		t.Fatalf("vm: guest did not report --- PASS: %s", t.Name())
	}
}

// ModulesCPIO builds (or reuses) the cached initramfs part holding the
// resolved modules and returns its path.
func (k *Kernel) ModulesCPIO(required, optional []string) (string, error) {
	p, _, err := k.modulesCPIO(required, optional)
	return p, err
}
