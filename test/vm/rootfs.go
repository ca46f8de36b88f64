package vm

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// rootfsSuite is the Debian release of the node root filesystem; it matches
// the kernel's.
const rootfsSuite = "bookworm"

// rootfsRecipe names the build steps of FetchRootfs: change it whenever they
// change, so that cached images built the old way are not used.
const rootfsRecipe = "1"

// rootfsSize is the size of the ext4 image (a sparse file).
const rootfsSize = "4G"

// rootfsPackages are installed on top of debootstrap's minbase variant:
// what kubelet, containerd and kube-proxy (iptables and IPVS modes) need on
// a node, and a few tools to look around.
var rootfsPackages = []string{
	"iptables", "nftables", "conntrack", "ipset", "ipvsadm", "iproute2", "ca-certificates",
	"runc", "containernetworking-plugins", "kmod", "procps", "util-linux", "mount", "curl",
}

// Rootfs is a cached ext4 image holding a Debian userland for node VMs
// (see FetchRootfs).
type Rootfs struct {
	// Image is the ext4 file system image, for Options.Disk. Use it
	// read-only: VMs get it with qemu's snapshot=on.
	Image string
	// Dir is the cache directory holding Image and rootfs.info.
	Dir string
	// Suite is the Debian release, Packages those installed on top of
	// debootstrap's minbase variant, and Mirror the archive they came from.
	Suite    string
	Packages []string
	Mirror   string
}

// FetchRootfs returns the cached node root filesystem, building it the first
// time (about a minute): `debootstrap --variant=minbase` of Debian bookworm
// with the packages a Kubernetes node needs (iptables and nftables with
// iptables in nf_tables mode, conntrack, ipset, ipvsadm, iproute2,
// ca-certificates, runc, containernetworking-plugins in /usr/lib/cni, kmod,
// procps, util-linux, mount, curl), written into a sparse ext4 image with
// mkfs.ext4 -d. The cache key is the package list and the build recipe;
// the archive is the host's own (its apt sources), or $VIPCAST_DEBIAN_MIRROR.
//
// Building needs root (debootstrap); debootstrap and e2fsprogs are installed
// with apt-get when missing. A lock file serialises concurrent callers, and
// the image appears in the cache only when complete.
//
// The image has no kernel modules (no /lib/modules): the VM's initramfs
// provides them, the kernel's module autoloading runs the initramfs's
// /sbin/modprobe (see Options.OnDemandModules), and MountRootfs puts that
// modprobe in place of the image's.
func FetchRootfs(ctx context.Context, logf Logf) (*Rootfs, error) {
	cache := CacheDir()
	dir := filepath.Join(cache, "rootfs-"+rootfsSuite+"-"+rootfsKey())
	if r, err := loadRootfs(dir); err == nil {
		return r, nil
	}
	unlock, err := lockFile(ctx, filepath.Join(cache, ".rootfs.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	if r, err := loadRootfs(dir); err == nil {
		return r, nil // built by another process while we waited
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("vm: building the node root filesystem needs root (debootstrap, chroot)")
	}
	// Leftovers of builds that were killed (we hold the lock: none runs).
	stale, _ := filepath.Glob(filepath.Join(cache, ".rootfs-tmp-*"))
	for _, d := range stale {
		if err := removeTree(d); err != nil {
			return nil, err
		}
	}
	for _, c := range [][2]string{{"debootstrap", "debootstrap"}, {"mkfs.ext4", "e2fsprogs"}} {
		if err := ensureCommand(ctx, c[0], c[1]); err != nil {
			return nil, err
		}
	}
	mirror, keyring, err := debianMirror(rootfsSuite)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	logf.printf("vm: building the node root filesystem (first time only, ~1-2 min): debootstrap %s from %s into %s",
		rootfsSuite, mirror, dir)
	tmp, err := os.MkdirTemp(cache, ".rootfs-tmp-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = removeTree(tmp) }()
	stage, err := buildRootfs(ctx, tmp, mirror, keyring, logf)
	if err != nil {
		return nil, fmt.Errorf("vm: node root filesystem: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.Rename(stage, dir); err != nil {
		return nil, err
	}
	logf.printf("vm: node root filesystem ready in %s: %s", time.Since(start).Round(time.Second), filepath.Join(dir, "disk.ext4"))
	return loadRootfs(dir)
}

// rootfsKey is the cache key of the node root filesystem.
func rootfsKey() string {
	sum := sha256.Sum256([]byte(rootfsRecipe + "\n" + rootfsSuite + "\n" + rootfsSize + "\n" + strings.Join(rootfsPackages, ",")))
	return hex.EncodeToString(sum[:6])
}

// buildRootfs builds the image in tmp and returns the directory, inside tmp,
// holding disk.ext4 and rootfs.info.
func buildRootfs(ctx context.Context, tmp, mirror, keyring string, logf Logf) (string, error) {
	root := filepath.Join(tmp, "root")
	if err := os.Mkdir(root, 0o755); err != nil { // mkfs -d copies its mode to /
		return "", err
	}
	args := []string{"--variant=minbase", "--include=" + strings.Join(rootfsPackages, ",")}
	if keyring != "" {
		args = append(args, "--keyring="+keyring)
	}
	args = append(args, rootfsSuite, root, mirror)
	t0 := time.Now()
	if err := runLogged(ctx, filepath.Join(tmp, "debootstrap.log"), "debootstrap", args...); err != nil {
		return "", err
	}
	logf.printf("vm: debootstrap done in %s", time.Since(t0).Round(time.Second))

	// iptables in nf_tables mode (bookworm's default: kept when already so).
	for _, name := range []string{"iptables", "ip6tables"} {
		out, err := run(ctx, "", "chroot", root, "update-alternatives", "--query", name)
		if err != nil {
			return "", err
		}
		want := "/usr/sbin/" + name + "-nft"
		if !strings.Contains(string(out), "\nValue: "+want+"\n") {
			logf.printf("vm: switching %s to %s", name, want)
			if _, err := run(ctx, "", "chroot", root, "update-alternatives", "--set", name, want); err != nil {
				return "", err
			}
		}
	}
	// Nothing of the build host: no resolver, no host name.
	if err := os.WriteFile(filepath.Join(root, "etc", "resolv.conf"), nil, 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(root, "etc", "hostname"), []byte("localhost\n"), 0o644); err != nil {
		return "", err
	}
	// apt's caches and package lists: the image is not for installing.
	if _, err := run(ctx, "", "chroot", root, "apt-get", "clean"); err != nil {
		return "", err
	}
	lists, _ := filepath.Glob(filepath.Join(root, "var", "lib", "apt", "lists", "*"))
	for _, p := range lists {
		if base := filepath.Base(p); base != "lock" && base != "partial" {
			if err := os.RemoveAll(p); err != nil {
				return "", err
			}
		}
	}

	stage := filepath.Join(tmp, "out")
	if err := os.Mkdir(stage, 0o755); err != nil {
		return "", err
	}
	t0 = time.Now()
	if _, err := run(ctx, "", "mkfs.ext4", "-q", "-F", "-L", "vipcast-node", "-m", "0",
		"-d", root, filepath.Join(stage, "disk.ext4"), rootfsSize); err != nil {
		return "", err
	}
	logf.printf("vm: mkfs.ext4 done in %s", time.Since(t0).Round(time.Millisecond))
	info := fmt.Sprintf("suite=%s\nmirror=%s\npackages=%s\nrecipe=%s\nbuilt=%s\n",
		rootfsSuite, mirror, strings.Join(rootfsPackages, ","), rootfsRecipe, time.Now().UTC().Format(time.RFC3339))
	return stage, os.WriteFile(filepath.Join(stage, "rootfs.info"), []byte(info), 0o644)
}

func loadRootfs(dir string) (*Rootfs, error) {
	b, err := os.ReadFile(filepath.Join(dir, "rootfs.info"))
	if err != nil {
		return nil, err
	}
	r := &Rootfs{Image: filepath.Join(dir, "disk.ext4"), Dir: dir}
	if _, err := os.Stat(r.Image); err != nil {
		return nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		key, val, _ := strings.Cut(l, "=")
		switch key {
		case "suite":
			r.Suite = val
		case "mirror":
			r.Mirror = val
		case "packages":
			r.Packages = strings.Split(val, ",")
		}
	}
	return r, nil
}

// runLogged runs name with its output in logPath, in its own process group,
// all of which is killed when ctx ends. Its error quotes the log's tail.
func runLogged(ctx context.Context, logPath, name string, args ...string) error {
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer func() { _ = log.Close() }()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(logPath)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, strings.Join(lines, "\n"))
	}
	return nil
}

// removeTree removes dir after detaching whatever is mounted below it
// (debootstrap mounts proc and sys in its target, and leaves them when
// killed): os.RemoveAll must not walk into them.
func removeTree(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if strings.HasPrefix(mp, abs+"/") {
			mounts = append(mounts, mp)
		}
	}
	_ = f.Close()
	// Deepest first.
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	for _, mp := range mounts {
		if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", mp, err)
		}
	}
	return os.RemoveAll(abs)
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// debianMirror returns the archive URI and keyring (Signed-By, "" when
// none) of the host's apt source for suite's main component, from
// /etc/apt/sources.list.d/*.sources, *.list and /etc/apt/sources.list; or
// $VIPCAST_DEBIAN_MIRROR when set.
func debianMirror(suite string) (uri, keyring string, err error) {
	if m := os.Getenv("VIPCAST_DEBIAN_MIRROR"); m != "" {
		return m, "", nil
	}
	var files []string
	deb822, _ := filepath.Glob("/etc/apt/sources.list.d/*.sources")
	files = append(files, deb822...)
	files = append(files, "/etc/apt/sources.list")
	lists, _ := filepath.Glob("/etc/apt/sources.list.d/*.list")
	files = append(files, lists...)
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		var srcs []aptSource
		if strings.HasSuffix(file, ".sources") {
			srcs = parseDeb822Sources(string(b))
		} else {
			srcs = parseOneLineSources(string(b))
		}
		for _, s := range srcs {
			if slices.Contains(s.types, "deb") && slices.Contains(s.suites, suite) &&
				slices.Contains(s.components, "main") {
				for _, u := range s.uris {
					if strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "file:") {
						return u, s.keyring, nil
					}
				}
			}
		}
	}
	return "", "", fmt.Errorf("vm: no apt source for %s main in /etc/apt (set VIPCAST_DEBIAN_MIRROR)", suite)
}

type aptSource struct {
	types, uris, suites, components []string
	keyring                         string // Signed-By when it names a file
}

// parseDeb822Sources parses the stanzas of a .sources file; disabled ones
// (Enabled: no) are left out.
func parseDeb822Sources(text string) []aptSource {
	var out []aptSource
	for _, stanza := range strings.Split(text, "\n\n") {
		var s aptSource
		enabled := true
		for _, l := range strings.Split(stanza, "\n") {
			if strings.HasPrefix(l, "#") || strings.HasPrefix(l, " ") || strings.HasPrefix(l, "\t") {
				continue // comments and continuation lines (an inline key)
			}
			key, val, ok := strings.Cut(l, ":")
			if !ok {
				continue
			}
			val = strings.TrimSpace(val)
			switch strings.ToLower(key) {
			case "types":
				s.types = strings.Fields(val)
			case "uris":
				s.uris = strings.Fields(val)
			case "suites":
				s.suites = strings.Fields(val)
			case "components":
				s.components = strings.Fields(val)
			case "signed-by":
				if strings.HasPrefix(val, "/") {
					s.keyring = val
				}
			case "enabled":
				enabled = strings.ToLower(val) != "no"
			}
		}
		if enabled && len(s.uris) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// parseOneLineSources parses sources.list lines such as
// "deb [arch=amd64 signed-by=/k.gpg] URI suite main contrib".
func parseOneLineSources(text string) []aptSource {
	var out []aptSource
	for _, l := range strings.Split(text, "\n") {
		if i := strings.Index(l, "#"); i >= 0 {
			l = l[:i]
		}
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		s := aptSource{types: []string{f[0]}}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			for len(f) > 0 {
				opt := strings.Trim(f[0], "[]")
				if k, v, ok := strings.Cut(opt, "="); ok && k == "signed-by" && strings.HasPrefix(v, "/") {
					s.keyring = v
				}
				done := strings.HasSuffix(f[0], "]")
				f = f[1:]
				if done {
					break
				}
			}
		}
		if len(f) < 2 {
			continue
		}
		s.uris, s.suites, s.components = f[:1], f[1:2], f[2:]
		out = append(out, s)
	}
	return out
}

var rootfsOnce = sync.OnceValues(func() (*Rootfs, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	return FetchRootfs(ctx, func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) })
})

// RootfsImage returns the node root filesystem's image for Options.Disk
// (see FetchRootfs), building it once per process when not cached. It skips
// t like the VM tests (-short, VIPCAST_SKIP_VM) and fails t when the image
// cannot be built.
func RootfsImage(t testing.TB) string {
	t.Helper()
	skipIfDisabled(t)
	r, err := rootfsOnce()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return r.Image
}

// DiskModules are added to a run's modules when Options.Disk is set: what
// the guest needs to mount an ext4 file system on a virtio disk (their
// dependencies follow; crc32c_generic is ext4's and jbd2's soft dependency,
// known to them only by the alias crypto-crc32c).
var DiskModules = []string{"virtio_pci", "virtio_blk", "crc32c_generic", "ext4"}

// DiskDevice is the guest's block device for Options.Disk.
const DiskDevice = "/dev/vda"

// MountRootfs mounts the VM's disk (Options.Disk, an ext4 file system on
// /dev/vda) at dir and, below it, what programs chrooted into dir expect:
// proc, sysfs, devtmpfs, devpts on dev/pts, tmpfs on dev/shm, run and tmp,
// and cgroup2 on sys/fs/cgroup. The disk's mount is made recursively
// shared (what `mount --make-rshared /` gives kubelet and containerd on a
// regular node). It runs in the guest, once; nothing is unmounted on
// failure (the VM is powered off at the end anyway).
//
// Run programs in dir with ChrootCommand, or move the whole process there
// with SwitchRoot.
func MountRootfs(dir string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := os.Stat(DiskDevice)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("vm: no disk (is Options.Disk set?): %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// noinit_itable: the image is sparse, its inode tables read as zeros;
	// the background zeroing would only fill qemu's overlay.
	if err := unix.Mount(DiskDevice, dir, "ext4", 0, "noinit_itable"); err != nil {
		return fmt.Errorf("vm: mount %s on %s: %w", DiskDevice, dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("vm: make %s rshared: %w", dir, err)
	}
	const nosuid, nodev, noexec = unix.MS_NOSUID, unix.MS_NODEV, unix.MS_NOEXEC
	for _, m := range []struct {
		src, dst, typ string
		flags         uintptr
		data          string
	}{
		{"proc", "proc", "proc", nosuid | nodev | noexec, ""},
		{"sysfs", "sys", "sysfs", nosuid | nodev | noexec, ""},
		{"cgroup2", "sys/fs/cgroup", "cgroup2", nosuid | nodev | noexec, ""},
		{"devtmpfs", "dev", "devtmpfs", nosuid, "mode=0755"},
		{"devpts", "dev/pts", "devpts", nosuid | noexec, "gid=5,mode=0620,ptmxmode=0666"},
		{"tmpfs", "dev/shm", "tmpfs", nosuid | nodev, "mode=1777"},
		{"tmpfs", "run", "tmpfs", nosuid | nodev, "mode=0755"},
		{"tmpfs", "tmp", "tmpfs", nosuid | nodev, "mode=1777"},
	} {
		dst := filepath.Join(dir, m.dst)
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, dst, m.typ, m.flags, m.data); err != nil {
			return fmt.Errorf("vm: mount %s on %s: %w", m.typ, dst, err)
		}
	}
	// devtmpfs has no /dev/fd and friends.
	for name, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dir, "dev", name)); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	return rootModprobe(dir)
}

// rootModprobe makes the root's modprobe the initramfs's (with its
// modules on /vm/modules), as the kernel's own module loading is: the
// image has no /lib/modules for its kmod, and programs inside the root
// run modprobe and act on its answer (kube-proxy runs `modprobe -va
// ip_vs` before it cleans up IPVS, and skips the clean-up when that
// fails, which it does not on a real node).
func rootModprobe(dir string) error {
	modules := filepath.Join(dir, "vm", "modules")
	if err := os.MkdirAll(modules, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("/vm/modules", modules, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("vm: bind /vm/modules into %s: %w", dir, err)
	}
	modprobe := filepath.Join(dir, "usr", "sbin", "modprobe")
	if err := os.Remove(modprobe); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.WriteFile(modprobe, nil, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("/init", modprobe, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("vm: bind the initramfs's modprobe into %s: %w", dir, err)
	}
	return nil
}

// SwitchRoot makes dir (see MountRootfs) the root of the guest's mount
// tree and the calling process's root and working directory, as
// switch_root does at the end of a regular node's initramfs: the disk's
// mount, with everything mounted below it, moves onto "/" and the process
// changes its root to it. It changes the whole process: its own files,
// such as the initramfs's /vm, are out of reach afterwards.
//
// A chroot into dir alone is not enough for a container runtime: `runc
// exec` enters a container's mount namespace, which puts the new process
// at the namespace's root mount and whatever is mounted on top of it — the
// container's root after its pivot_root when the node's root is the top
// mount on "/", but the initramfs's own root when the node's root is a
// mount further down, where no command of the container's image is found
// (`kubectl exec` failed with "stat /bin/sh: no such file or directory").
func SwitchRoot(dir string) error {
	if err := os.Chdir(dir); err != nil {
		return fmt.Errorf("vm: switch root: %w", err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("vm: switch root: move %s onto /: %w", dir, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("vm: switch root: chroot: %w", err)
	}
	return os.Chdir("/")
}

// chrootPath is where ChrootCommand looks for a program, in order.
var chrootPath = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// ChrootCommand is exec.CommandContext for a program that runs chrooted into
// dir (see MountRootfs), in its root directory. A name without a slash is
// looked up in dir's /usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin,
// /sbin and /bin; os/exec itself would look in the caller's file system.
// The command inherits the caller's environment unless its Env is set.
func ChrootCommand(ctx context.Context, dir, name string, args ...string) *exec.Cmd {
	path := name
	var lookErr error
	if !strings.Contains(name, "/") {
		lookErr = fmt.Errorf("vm: %s: not found in %s's %s", name, dir, strings.Join(chrootPath, ":"))
		for _, d := range chrootPath {
			// Lstat: the link may be absolute (/etc/alternatives/...),
			// meaningful only inside dir.
			if _, err := os.Lstat(filepath.Join(dir, d, name)); err == nil {
				path, lookErr = d+"/"+name, nil
				break
			}
		}
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Err = lookErr
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: dir}
	return cmd
}
