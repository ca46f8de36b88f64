package vm

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Kernel is a Debian kernel package extracted into the cache: an uncompressed
// vmlinux bootable by qemu through PVH, and its loadable modules.
type Kernel struct {
	Package string // e.g. linux-image-6.1.0-56-amd64-unsigned
	Version string // Debian package version, e.g. 6.1.192-1
	Release string // uname -r, e.g. 6.1.0-56-amd64
	Dir     string // cache directory holding everything below
	Vmlinux string // uncompressed ELF kernel
	Modules string // lib/modules/<Release>

	index map[string]string // module name (underscores) -> .ko path
}

// CacheDir is $VIPCAST_CACHE, or ~/.cache/vipcast.
func CacheDir() string {
	if d := os.Getenv("VIPCAST_CACHE"); d != "" {
		return d
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".cache", "vipcast")
	}
	return filepath.Join(os.TempDir(), "vipcast-cache")
}

// Logf receives progress messages (t.Logf, log.Printf, ...). May be nil.
type Logf func(format string, args ...any)

func (l Logf) printf(format string, args ...any) {
	if l != nil {
		l(format, args...)
	}
}

// lockFile takes an exclusive flock on path, waiting as long as ctx allows:
// go test runs packages in parallel and each may want the same download.
func lockFile(ctx context.Context, path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); _ = f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			_ = f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("waiting for %s: %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func run(ctx context.Context, dir string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive", "LC_ALL=C")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// aptGet runs apt-get with a wait on the dpkg lock (other harnesses may be
// installing their own packages at the same time).
func aptGet(ctx context.Context, dir string, args ...string) error {
	full := append([]string{"-o", "DPkg::Lock::Timeout=600", "-q"}, args...)
	_, err := run(ctx, dir, "apt-get", full...)
	return err
}

// KernelPackage names the Debian kernel package to use and its version: the
// one apt offers for linux-image-amd64 (its unsigned variant when it exists),
// or $VIPCAST_KERNEL_PACKAGE.
func KernelPackage(ctx context.Context) (pkg, version string, err error) {
	pkg = os.Getenv("VIPCAST_KERNEL_PACKAGE")
	if pkg == "" {
		out, err := run(ctx, "", "apt-cache", "depends", "linux-image-amd64")
		if err != nil {
			return "", "", err
		}
		for _, l := range strings.Split(string(out), "\n") {
			l = strings.TrimSpace(l)
			if name, ok := strings.CutPrefix(l, "Depends: "); ok && strings.HasPrefix(name, "linux-image-") {
				pkg = strings.TrimSpace(name)
				break
			}
		}
		if pkg == "" {
			return "", "", fmt.Errorf("apt-cache depends linux-image-amd64: no linux-image dependency in %q", out)
		}
		if v, err := aptVersion(ctx, pkg+"-unsigned"); err == nil && v != "" {
			return pkg + "-unsigned", v, nil
		}
	}
	version, err = aptVersion(ctx, pkg)
	return pkg, version, err
}

func aptVersion(ctx context.Context, pkg string) (string, error) {
	out, err := run(ctx, "", "apt-cache", "show", "--no-all-versions", pkg)
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(l, "Version: "); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("apt-cache show %s: no Version", pkg)
}

// FetchKernel returns the cached kernel, downloading and extracting it the
// first time (apt-get download + dpkg -x; nothing is installed on the host).
// When apt cannot name a kernel (offline, no lists), the newest cached one
// is used.
func FetchKernel(ctx context.Context, logf Logf) (*Kernel, error) {
	cache := CacheDir()
	unlock, err := lockFile(ctx, filepath.Join(cache, ".kernel.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()

	pkg, version, cached, err := kernelToFetch(ctx, cache, logf)
	if err != nil {
		return nil, err
	}
	if cached != nil {
		return cached, nil
	}
	dir := filepath.Join(cache, "kernel-"+strings.TrimPrefix(pkg, "linux-image-")+"_"+version)
	if k, err := loadKernel(dir); err == nil {
		return k, nil
	}
	start := time.Now()
	logf.printf("vm: downloading %s=%s into %s (first time only)", pkg, version, dir)
	release, err := installKernel(ctx, cache, pkg, version, dir)
	if err != nil {
		return nil, err
	}
	logf.printf("vm: kernel %s (%s) ready in %s", release, version, time.Since(start).Round(time.Millisecond))
	return loadKernel(dir)
}

// kernelToFetch names the kernel package and version to use (see
// KernelPackage). When apt cannot name one and VIPCAST_KERNEL_PACKAGE is
// unset, it returns the newest cached kernel as cached instead or, with
// none cached, runs apt-get update and asks again.
func kernelToFetch(ctx context.Context, cache string, logf Logf) (pkg, version string, cached *Kernel, err error) {
	pkg, version, err = KernelPackage(ctx)
	if err == nil || os.Getenv("VIPCAST_KERNEL_PACKAGE") != "" {
		return pkg, version, nil, err
	}
	if k, cerr := newestCachedKernel(cache); cerr == nil {
		logf.printf("vm: apt cannot name a kernel (%v); using cached %s %s", err, k.Package, k.Version)
		return "", "", k, nil
	}
	logf.printf("vm: apt-get update (%v)", err)
	if uerr := aptGet(ctx, "", "update"); uerr != nil {
		return "", "", nil, uerr
	}
	pkg, version, err = KernelPackage(ctx)
	return pkg, version, nil, err
}

// installKernel downloads pkg=version and extracts its kernel (as an
// uncompressed vmlinux), its modules and a kernel.info naming them into
// dir, replacing whatever dir held. It returns the kernel's release.
func installKernel(ctx context.Context, cache, pkg, version, dir string) (release string, err error) {
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cache, ".kernel-tmp-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	root := filepath.Join(tmp, "root")
	if err := unpackPackage(ctx, tmp, pkg, version, root); err != nil {
		return "", err
	}
	vmlinuzs, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(vmlinuzs) != 1 {
		return "", fmt.Errorf("%s: expected one boot/vmlinuz-*, got %v", pkg, vmlinuzs)
	}
	release = strings.TrimPrefix(filepath.Base(vmlinuzs[0]), "vmlinuz-")
	stage := filepath.Join(tmp, "stage")
	if err := os.MkdirAll(stage, 0o755); err != nil {
		return "", err
	}
	if err := extractVmlinux(ctx, vmlinuzs[0], filepath.Join(stage, "vmlinux")); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(root, "lib", "modules", release), filepath.Join(stage, "modules")); err != nil {
		return "", err
	}
	meta := fmt.Sprintf("package=%s\nversion=%s\nrelease=%s\n", pkg, version, release)
	if err := os.WriteFile(filepath.Join(stage, "kernel.info"), []byte(meta), 0o644); err != nil {
		return "", err
	}
	return release, os.Rename(stage, dir)
}

// unpackPackage downloads the Debian package pkg=version into tmp and
// extracts its files under root (dpkg -x: nothing is installed).
func unpackPackage(ctx context.Context, tmp, pkg, version, root string) error {
	if err := aptGet(ctx, tmp, "download", pkg+"="+version); err != nil {
		return err
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download %s: expected one .deb, got %v", pkg, debs)
	}
	_, err := run(ctx, tmp, "dpkg", "-x", debs[0], root)
	return err
}

func loadKernel(dir string) (*Kernel, error) {
	b, err := os.ReadFile(filepath.Join(dir, "kernel.info"))
	if err != nil {
		return nil, err
	}
	k := &Kernel{Dir: dir, Vmlinux: filepath.Join(dir, "vmlinux"), Modules: filepath.Join(dir, "modules")}
	for _, l := range strings.Split(string(b), "\n") {
		key, val, _ := strings.Cut(l, "=")
		switch key {
		case "package":
			k.Package = val
		case "version":
			k.Version = val
		case "release":
			k.Release = val
		}
	}
	for _, p := range []string{k.Vmlinux, k.Modules} {
		if _, err := os.Stat(p); err != nil {
			return nil, err
		}
	}
	return k, nil
}

func newestCachedKernel(cache string) (*Kernel, error) {
	dirs, _ := filepath.Glob(filepath.Join(cache, "kernel-*"))
	var best *Kernel
	var bestTime time.Time
	for _, d := range dirs {
		k, err := loadKernel(d)
		if err != nil {
			continue
		}
		st, err := os.Stat(filepath.Join(d, "kernel.info"))
		if err == nil && (best == nil || st.ModTime().After(bestTime)) {
			best, bestTime = k, st.ModTime()
		}
	}
	if best == nil {
		return nil, fmt.Errorf("no kernel in %s", cache)
	}
	return best, nil
}

// extractVmlinux writes the ELF kernel inside a bzImage's xz payload. The
// payload is located through the boot protocol header (payload_offset and
// payload_length, boot protocol >= 2.08) and decompressed with xz(1), which
// understands the x86 BCJ filter the kernel build uses.
func extractVmlinux(ctx context.Context, bzImage, out string) error {
	b, err := os.ReadFile(bzImage)
	if err != nil {
		return err
	}
	if len(b) < 0x250 || string(b[0x202:0x206]) != "HdrS" {
		return fmt.Errorf("%s: not a bzImage", bzImage)
	}
	setupSects := int(b[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	pm := (setupSects + 1) * 512
	off := pm + int(binary.LittleEndian.Uint32(b[0x248:]))
	n := int(binary.LittleEndian.Uint32(b[0x24c:]))
	if off+n > len(b) || n < 6 {
		return fmt.Errorf("%s: payload out of range", bzImage)
	}
	payload := b[off : off+n]
	if !bytes.HasPrefix(payload, []byte("\xfd7zXZ\x00")) {
		return fmt.Errorf("%s: payload is not xz (magic % x); only xz kernels are supported", bzImage, payload[:6])
	}
	if err := ensureCommand(ctx, "xz", "xz-utils"); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "xz", "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(payload)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	elfBytes, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("xz -dc: %w: %s", err, stderr.String())
	}
	if !bytes.HasPrefix(elfBytes, []byte("\x7fELF")) {
		return fmt.Errorf("%s: decompressed payload is not ELF", bzImage)
	}
	return os.WriteFile(out, elfBytes, 0o644)
}

// ensureCommand installs pkg with apt-get when name is not in PATH.
func ensureCommand(ctx context.Context, name, pkg string) error {
	if _, err := exec.LookPath(name); err == nil {
		return nil
	}
	unlock, err := lockFile(ctx, filepath.Join(CacheDir(), ".apt.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := exec.LookPath(name); err == nil {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s not found and not root: apt-get install %s", name, pkg)
	}
	if err := aptGet(ctx, "", "install", "-y", "--no-install-recommends", pkg); err != nil {
		if uerr := aptGet(ctx, "", "update"); uerr != nil {
			return fmt.Errorf("%w (apt-get update: %w)", err, uerr)
		}
		if err := aptGet(ctx, "", "install", "-y", "--no-install-recommends", pkg); err != nil {
			return err
		}
	}
	_, err = exec.LookPath(name)
	return err
}

func modName(s string) string {
	s = strings.TrimSuffix(filepath.Base(s), ".ko")
	return strings.ReplaceAll(s, "-", "_")
}

func (k *Kernel) moduleIndex() (map[string]string, error) {
	if k.index != nil {
		return k.index, nil
	}
	idx := map[string]string{}
	err := filepath.WalkDir(k.Modules, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			idx[modName(p)] = p
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	k.index = idx
	return idx, nil
}

func (k *Kernel) builtin() map[string]bool {
	m := map[string]bool{}
	f, err := os.Open(filepath.Join(k.Modules, "modules.builtin"))
	if err != nil {
		return m
	}
	defer func() { _ = f.Close() }()
	s := bufio.NewScanner(f)
	for s.Scan() {
		m[modName(s.Text())] = true
	}
	return m
}

// modinfo returns the dependencies of a module: depends= then softdep pre:.
func modinfo(path string) (depends, softpre []string, err error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer func() { _ = f.Close() }()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, nil, fmt.Errorf("%s: no .modinfo (compressed module?)", path)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, nil, err
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		key, val, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		switch key {
		case "depends":
			for _, d := range strings.Split(val, ",") {
				if d = strings.TrimSpace(d); d != "" {
					depends = append(depends, modName(d))
				}
			}
		case "softdep":
			// "pre: a b post: c"
			pre := false
			for _, w := range strings.Fields(val) {
				switch w {
				case "pre:":
					pre = true
				case "post:":
					pre = false
				default:
					if pre {
						softpre = append(softpre, modName(w))
					}
				}
			}
		}
	}
	return depends, softpre, nil
}

// ResolveModules returns the .ko paths for the named modules and everything
// they depend on, in an order that loads (dependencies first). Names in
// optional are skipped when the kernel has no such module; built-in modules
// are skipped too. Soft pre-dependencies are loaded when they exist as
// modules (they are often aliases such as "crc32c": list the real module,
// e.g. crc32c_generic, explicitly).
func (k *Kernel) ResolveModules(required, optional []string) ([]string, error) {
	idx, err := k.moduleIndex()
	if err != nil {
		return nil, err
	}
	builtin := k.builtin()
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name string, must bool, chain []string) error
	visit = func(name string, must bool, chain []string) error {
		name = modName(name)
		switch state[name] {
		case 2:
			return nil
		case 1:
			return fmt.Errorf("module dependency cycle: %v", append(chain, name))
		}
		p, ok := idx[name]
		if !ok {
			if builtin[name] || !must {
				state[name] = 2
				return nil
			}
			return fmt.Errorf("kernel %s has no module %s (needed by %v)", k.Release, name, chain)
		}
		state[name] = 1
		deps, soft, err := modinfo(p)
		if err != nil {
			return err
		}
		for _, d := range soft {
			if err := visit(d, false, append(chain, name)); err != nil {
				return err
			}
		}
		for _, d := range deps {
			if err := visit(d, true, append(chain, name)); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, p)
		return nil
	}
	for _, m := range required {
		if err := visit(m, true, nil); err != nil {
			return nil, err
		}
	}
	for _, m := range optional {
		if err := visit(m, false, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}
