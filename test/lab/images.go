package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/vipcast/vipcast/test/proc"
)

// containerdRoot returns an ext4 image of the root directory the nodes'
// containerd starts from, with images imported and unpacked: the
// containerd the nodes run, started on the host with that root
// (`ctr images import` of each image, into the kubelet's k8s.io
// namespace), then stopped. Each node VM gets the image as a disk of its
// own, copy-on-write (vm.Options.Disk's snapshot=on), mounted on
// /var/lib/containerd before its containerd starts (test/lab/kubenode),
// which finds the images there as it would after a pull.
//
// Imported in the node VMs instead, each vipcast image took 30 to 60 s of
// a node's emulated CPU at every boot: ctr streams the archive to
// containerd and containerd hashes and writes it, and every copy of it
// runs under emulation. On the host the whole import takes seconds.
//
// aliases name more references of imported images (from → to): upstream's
// names for the images the lab builds under its own.
func (l *Lab) containerdRoot(ctx context.Context, images []string, aliases map[string]string) (string, error) {
	dir := filepath.Join(l.Opts.Dir, "containerd")
	// The socket's path must fit in a sockaddr_un.
	state, err := os.MkdirTemp("", "vipcast-containerd-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.RemoveAll(state) }()
	root := filepath.Join(dir, "root")
	sock := filepath.Join(state, "containerd.sock")
	config := filepath.Join(dir, "config.toml")
	// Nothing but the content store, the metadata and the overlayfs
	// snapshotter is needed to import: no CRI, no NRI.
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"]

[grpc]
  address = %q
`, root, state, sock)), 0o644); err != nil {
		return "", err
	}
	log := filepath.Join(dir, "containerd.log")
	p, err := proc.Start(log, filepath.Join(containerdDir(), "containerd"), "--config", config)
	if err != nil {
		return "", err
	}
	stopped := false
	defer func() {
		if !stopped {
			p.Stop(10 * time.Second)
		}
	}()
	if err := waitSocket(ctx, sock, 30*time.Second); err != nil {
		return "", fmt.Errorf("containerd on the host: %w (see %s)", err, log)
	}
	for _, img := range images {
		c := exec.CommandContext(ctx, filepath.Join(containerdDir(), "ctr"), "--address", sock, "-n", "k8s.io", "images", "import", "--no-unpack=false", img)
		if out, err := c.CombinedOutput(); err != nil {
			return "", fmt.Errorf("ctr images import %s: %w: %s", img, err, out)
		}
	}
	for from, to := range aliases {
		c := exec.CommandContext(ctx, filepath.Join(containerdDir(), "ctr"), "--address", sock, "-n", "k8s.io", "images", "tag", from, to)
		if out, err := c.CombinedOutput(); err != nil {
			return "", fmt.Errorf("ctr images tag %s %s: %w: %s", from, to, err, out)
		}
	}
	p.Stop(10 * time.Second)
	stopped = true
	disk := filepath.Join(l.Opts.Dir, "containerd.ext4")
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-d", root, disk, "4G").CombinedOutput(); err != nil {
		return "", fmt.Errorf("mkfs.ext4 containerd root: %w: %s", err, out)
	}
	return disk, os.RemoveAll(root)
}

// waitSocket waits until path exists.
func waitSocket(ctx context.Context, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", path, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
