// Command init is /init of the test VM's initramfs (see package
// github.com/vipcast/vipcast/test/vm). It mounts the pseudo file systems,
// loads the kernel modules listed in /vm/modules.order, runs /vm/test with
// the NUL-separated arguments in /vm/args and the environment in /vm/env,
// prints the exit code behind a marker line, and powers the VM off.
//
// It must be built with CGO_ENABLED=0: the initramfs has no libc.
package main

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ExitMarker precedes the test's exit code on the console; keep in sync
// with test/vm.
const ExitMarker = "VIPCAST-VM-EXIT:"

func main() {
	if filepath.Base(os.Args[0]) == "modprobe" {
		os.Exit(modprobe(os.Args[1:]))
	}
	code := 120
	defer func() {
		if r := recover(); r != nil {
			fmt.Printf("vm-init: panic: %v\n", r)
			code = 121
		}
		fmt.Printf("\n%s %d\n", ExitMarker, code)
		unix.Sync()
		_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		// Should not be reached; PID 1 exiting panics the kernel, and
		// panic=-1 with qemu -no-reboot ends the VM anyway.
		select {}
	}()
	code = run()
}

func run() int {
	start := time.Now()
	for _, m := range []struct{ src, dst, typ string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/tmp", "tmpfs"},
		{"tmpfs", "/run", "tmpfs"},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.typ, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			fmt.Printf("vm-init: mount %s: %v\n", m.dst, err)
		}
	}
	_ = os.MkdirAll("/run/netns", 0o755)
	_ = os.MkdirAll("/var", 0o755)
	_ = os.Symlink("/run", "/var/run")
	_ = os.Symlink("/proc/self/fd", "/dev/fd")

	if err := loadModules(); err != nil {
		fmt.Printf("vm-init: %v\n", err)
		return 122
	}
	if err := linkUp("lo"); err != nil {
		fmt.Printf("vm-init: lo up: %v\n", err)
	}
	fmt.Printf("vm-init: modules loaded, %s after init start\n", time.Since(start).Round(time.Millisecond))

	args := readList("/vm/args")
	env := append([]string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin", "HOME=/tmp", "TMPDIR=/tmp", "VIPCAST_IN_VM=1"}, readList("/vm/env")...)
	cmd := exec.Command("/vm/test", args...)
	cmd.Stdin = nil
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stdout
	cmd.Env = env
	cmd.Dir = "/"
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ee.ExitCode() < 0 {
			fmt.Printf("vm-init: test: %v\n", err)
			return 124
		}
		return ee.ExitCode()
	default:
		fmt.Printf("vm-init: test: %v\n", err)
		return 123
	}
}

// modprobe is /sbin/modprobe in the guest (a symlink to /init): it loads
// the named modules from /vm/modules, with their dependencies first, so
// that programs that run modprobe (moby/ipvs does) find what they expect
// and the kernel's module autoloading works. The kernel asks by alias (such
// as net-pf-16-proto-16-family-IPVS): an argument that is no module file's
// name is looked up in the modules' alias= entries.
func modprobe(args []string) int {
	code := 0
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			continue
		}
		name := strings.ReplaceAll(a, "-", "_")
		if _, err := os.Stat(filepath.Join("/vm/modules", name+".ko")); err != nil {
			if name = moduleByAlias(a); name == "" {
				fmt.Fprintf(os.Stderr, "modprobe: module %s not found in the VM's initramfs\n", a)
				code = 1
				continue
			}
		}
		if err := loadModule(name, 0); err != nil {
			fmt.Fprintf(os.Stderr, "modprobe: %s: %v\n", a, err)
			code = 1
		}
	}
	return code
}

// loadModule loads /vm/modules/<name>.ko after its depends= modules,
// unless it is loaded already.
func loadModule(name string, depth int) error {
	if _, err := os.Stat("/sys/module/" + name); err == nil {
		return nil
	}
	if depth > 16 {
		return fmt.Errorf("module dependencies nested too deep at %s", name)
	}
	p := filepath.Join("/vm/modules", name+".ko")
	for _, d := range modinfo(p)["depends"] {
		for _, dep := range strings.Split(d, ",") {
			if dep = strings.ReplaceAll(strings.TrimSpace(dep), "-", "_"); dep != "" {
				if err := loadModule(dep, depth+1); err != nil {
					return err
				}
			}
		}
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", name, err)
	}
	return nil
}

// moduleByAlias returns the module in /vm/modules one of whose alias=
// patterns matches alias, or "".
func moduleByAlias(alias string) string {
	paths, _ := filepath.Glob("/vm/modules/*.ko")
	for _, p := range paths {
		for _, pat := range modinfo(p)["alias"] {
			if ok, _ := filepath.Match(pat, alias); ok {
				return strings.TrimSuffix(filepath.Base(p), ".ko")
			}
		}
	}
	return ""
}

// modinfo returns the key=value entries of a module's .modinfo section; an
// unreadable module has none.
func modinfo(path string) map[string][]string {
	out := map[string][]string{}
	f, err := elf.Open(path)
	if err != nil {
		return out
	}
	defer func() { _ = f.Close() }()
	sec := f.Section(".modinfo")
	if sec == nil {
		return out
	}
	data, err := sec.Data()
	if err != nil {
		return out
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok {
			out[k] = append(out[k], v)
		}
	}
	return out
}

// readList reads a NUL-separated list; a missing file is an empty list.
func readList(path string) []string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

func loadModules() error {
	for _, name := range readList("/vm/modules.order") {
		if name == "" {
			continue
		}
		p := filepath.Join("/vm/modules", name+".ko")
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		_ = f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load module %s: %w", name, err)
		}
	}
	return nil
}

func linkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(fd) }()
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
