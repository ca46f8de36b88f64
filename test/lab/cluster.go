package lab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/vipcast/vipcast/test/controlplane"
	"github.com/vipcast/vipcast/test/lab/nodeapi"
	"github.com/vipcast/vipcast/test/netns"
	"github.com/vipcast/vipcast/test/vm"
)

// ClusterOptions configure the real cluster (Options.Cluster): each node
// VM boots a Debian userland (vm.Rootfs) with containerd, runc, the bridge
// CNI plugin, a kubelet started with --cloud-provider=external and
// kube-proxy; kube-controller-manager and kube-scheduler run beside the API
// server; vipcast arrives as a user installs a release: `make release`
// pushes both images and the chart to an OCI registry beside the control
// plane, `helm install` takes the chart from there and the nodes'
// containerd pulls the images through the ToR.
type ClusterOptions struct {
	// ProxyMode is kube-proxy's mode on every node: iptables (default),
	// nftables, ipvs, or none.
	ProxyMode string
	// ImageTag names the release the lab installs (default "lab"): chart
	// and images ChartVersion(ImageTag).
	ImageTag string
	// ExtraTags name more releases the lab pushes to its registry beside
	// ImageTag's, for a `helm upgrade` to move to.
	ExtraTags []string
	// Boot is how many of the Options.Nodes nodes boot with the cluster
	// (default all); the others boot with them but start their kubelet
	// only when Lab.JoinSpare has them join.
	Boot int
	// Upstream adds the images Kubernetes' own e2e suite runs (agnhost,
	// pause) under upstream's names, for RunUpstream; it needs agnhost
	// from `make e2e-tools`.
	Upstream bool
}

// The real cluster's names and versions.
const (
	// VipcastNamespace is where the chart is installed.
	VipcastNamespace = "vipcast-system"
	// Release is the Helm release name.
	Release = "vipcast"
	// BackendImage and PauseImage are the lab's own images, imported at
	// boot; PauseImage must match test/lab/kubenode's.
	BackendImage = "vipcast/lab-backend:lab"
	PauseImage   = "vipcast/pause:lab"
	// HelmVersion is the helm the Makefile builds (HELM_VERSION).
	HelmVersion = "v3.22.0"
	// ContainerdVersion is the containerd the Makefile builds.
	ContainerdVersion = "v2.4.2"
	// clusterCIDR covers every node's pod range.
	clusterCIDR = "10.244.0.0/16"
)

func (o *ClusterOptions) withDefaults() {
	if o.ProxyMode == "" {
		o.ProxyMode = "iptables"
	}
	if o.ImageTag == "" {
		o.ImageTag = "lab"
	}
}

// HelmBin is the helm binary built by `make cluster-tools`.
func HelmBin() string {
	return filepath.Join(vm.CacheDir(), "helm-"+HelmVersion, "helm")
}

// containerdDir holds containerd, ctr and the runc shim.
func containerdDir() string {
	return filepath.Join(vm.CacheDir(), "containerd-"+ContainerdVersion)
}

// upCluster is Up for Options.Cluster.
func (l *Lab) upCluster(ctx context.Context, cancel context.CancelFunc) {
	t, logf := l.t, l.Opts.Logf
	t.Helper()
	co := &l.Opts.Cluster
	co.withDefaults()
	bins, venv := l.prepare(ctx)
	l.binDir = filepath.Dir(bins["kubectl-vipcast"])
	logf("==> building the lab's images (the backend, pause) without a daemon")
	images, err := l.buildImages(ctx, bins)
	if err != nil {
		t.Fatal(err)
	}
	var aliases map[string]string
	if co.Upstream {
		logf("==> building agnhost's image (%s) and CoreDNS's for Kubernetes' e2e suite", AgnhostImage)
		more, err := l.upstreamImages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		images = append(images, more...)
		aliases = map[string]string{"docker.io/" + agnhostLocal: AgnhostImage, "docker.io/" + PauseImage: UpstreamPauseImage}
	}
	rootfs, err := vm.FetchRootfs(ctx, vm.Logf(logf))
	if err != nil {
		t.Fatalf("node root filesystem: %v", err)
	}
	l.startControlPlane()
	l.registry = l.startRegistry(ctx)
	l.releaseAll(ctx, append([]string{co.ImageTag}, co.ExtraTags...))
	all := l.planNodes()
	for _, n := range all {
		n.Pods = nil // the Deployment's pods, wherever the scheduler puts them
		// The ToR routes the pod ranges to their nodes (as a fabric that
		// learns them does): pods reach the API server through it.
		l.TorNS.IP(t, "route", "add", n.PodCIDR.String(), "via", n.Addr.String())
	}
	boot := co.Boot
	if boot <= 0 || boot > len(all) {
		boot = len(all)
	}
	l.Nodes, l.spare = all[:boot], all[boot:]
	l.startToR()
	payload, err := l.payload(ctx, bins["lab-backend"])
	if err != nil {
		t.Fatal(err)
	}
	ctrRoot, err := l.containerdRoot(ctx, images, aliases)
	if err != nil {
		t.Fatal(err)
	}
	l.bootKubeNodes(ctx, cancel, venv, rootfs, payload, ctrRoot, bins["kubenode"], co)
	// After the VMs' cleanup, so before it: the nodes still answer.
	t.Cleanup(func() {
		if t.Failed() {
			l.dumpConsoles()
			l.dumpNodes()
		}
	})
	l.waitKubelets(ctx)
	if co.Upstream {
		if err := l.deployDNS(ctx); err != nil {
			t.Fatal(err)
		}
	}
	l.helmInstall(ctx, co)
}

// buildImages builds the lab's own images as docker-save tarballs in
// Dir/images: the backend and pause. vipcast's come from the lab's
// registry (release).
func (l *Lab) buildImages(ctx context.Context, bins map[string]string) ([]string, error) {
	dir := filepath.Join(l.Opts.Dir, "images")
	var out []string
	for _, img := range []struct{ bin, ref string }{{"lab-backend", BackendImage}, {"pause", PauseImage}} {
		name, itag, _ := strings.Cut(img.ref, ":")
		file := filepath.Join(dir, img.bin+".tar")
		if err := hackImage(ctx, "-binary", bins[img.bin], "-name", name, "-tag", itag, "-user", "65532:65532",
			"-description", "vipcast lab: "+img.bin, "-out", file); err != nil {
			return nil, err
		}
		out = append(out, file)
	}
	return out, nil
}

// startControlPlane starts the control plane, the ToR's namespace and the
// client's, and the ToR's relay to the API server.
func (l *Lab) startControlPlane() {
	t := l.t
	t.Helper()
	l.Opts.Logf("==> starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler %s", controlplane.KubernetesVersion)
	// kube-apiserver reaches the kubelets (kubectl logs and exec, and
	// the upstream e2e suite's exec pods) from inside the ToR's
	// namespace, where the rack is, as a konnectivity proxy would.
	var tor atomic.Pointer[netns.NS]
	egress := func(ctx context.Context, addr string) (net.Conn, error) {
		ns := tor.Load()
		if ns == nil {
			return nil, errors.New("the ToR's namespace is not up yet")
		}
		return ns.DialContext(ctx, "tcp", addr)
	}
	l.CP = controlplane.StartWith(t, controlplane.Options{AdvertiseAddress: torAddr.String(), ServiceAccounts: true, Nice: vm.Nice, Egress: egress})
	if err := l.CP.StartKubeControllers(); err != nil {
		t.Fatal(err)
	}
	l.startNetwork()
	tor.Store(l.TorNS)
	// Pods reach the API server through the kubernetes Service, whose
	// endpoint is the ToR's address on the API server's own port.
	port, err := l.CP.APIPort()
	if err != nil {
		t.Fatal(err)
	}
	apiHost := strings.TrimPrefix(l.CP.Config.Host, "https://")
	netns.Forward(t, l.TorNS, net.JoinHostPort(torAddr.String(), strconv.Itoa(port)), apiHost)
}

// upstreamImages builds the images Kubernetes' e2e suite needs beside the
// lab's: agnhost and CoreDNS.
func (l *Lab) upstreamImages(ctx context.Context) ([]string, error) {
	img, err := l.buildAgnhost(ctx)
	if err != nil {
		return nil, err
	}
	dns, err := l.buildCoreDNS(ctx)
	if err != nil {
		return nil, err
	}
	return []string{img, dns}, nil
}

// buildAgnhost builds agnhost's image as a docker-save tarball in
// Dir/images: `make e2e-tools`'s agnhost at /agnhost on agnhostUserland,
// with upstream's entrypoint and default command (pause).
func (l *Lab) buildAgnhost(ctx context.Context) (string, error) {
	bin := E2EBin("agnhost")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("agnhost: %w (run `make e2e-tools`)", err)
	}
	userland := filepath.Join(l.Opts.Dir, "agnhost-userland")
	if err := os.RemoveAll(userland); err != nil {
		return "", err
	}
	if err := agnhostUserland(ctx, userland); err != nil {
		return "", err
	}
	name, tag, _ := strings.Cut(agnhostLocal, ":")
	file := filepath.Join(l.Opts.Dir, "images", "agnhost.tar")
	if err := hackImage(ctx, "-binary", bin, "-name", name, "-tag", tag, "-path", "/agnhost", "-cmd", "pause",
		"-base", userland, "-description", "agnhost for Kubernetes' e2e suite (vipcast lab)", "-out", file); err != nil {
		return "", err
	}
	return file, os.RemoveAll(userland)
}

// buildCoreDNS builds the image of `make e2e-tools`'s CoreDNS as a
// docker-save tarball in Dir/images.
func (l *Lab) buildCoreDNS(ctx context.Context) (string, error) {
	bin := filepath.Join(vm.CacheDir(), "coredns-"+CoreDNSVersion, "coredns")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("coredns: %w (run `make e2e-tools`)", err)
	}
	name, tag, _ := strings.Cut(corednsImage, ":")
	file := filepath.Join(l.Opts.Dir, "images", "coredns.tar")
	if err := hackImage(ctx, "-binary", bin, "-name", name, "-tag", tag, "-user", "65532:65532",
		"-description", "CoreDNS for the vipcast lab's cluster", "-out", file); err != nil {
		return "", err
	}
	return file, nil
}

// hackImage runs the repository's image builder (hack/image) with args.
func hackImage(ctx context.Context, args ...string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", append([]string{"-C", filepath.Join(root, "hack/image"), "run", "."}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("hack/image %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// payload writes the nodes' second disk: an ext4 image holding the node
// binaries, the nodes' kubeconfig and the backend binary (bin/lab-backend,
// for GETs from inside a pod's network namespace).
func (l *Lab) payload(ctx context.Context, backend string) (string, error) {
	dir := filepath.Join(l.Opts.Dir, "payload")
	files := map[string]string{
		"bin/kubelet":                 filepath.Join(controlplane.BinDir(), "kubelet"),
		"bin/kube-proxy":              filepath.Join(controlplane.BinDir(), "kube-proxy"),
		"bin/containerd":              filepath.Join(containerdDir(), "containerd"),
		"bin/ctr":                     filepath.Join(containerdDir(), "ctr"),
		"bin/containerd-shim-runc-v2": filepath.Join(containerdDir(), "containerd-shim-runc-v2"),
		"bin/lab-backend":             backend,
		"kubeconfig":                  l.clusterKubeconfig(),
	}
	for dst, src := range files {
		if err := copyFile(src, filepath.Join(dir, dst)); err != nil {
			return "", fmt.Errorf("payload: %w (run `make cluster-tools`)", err)
		}
	}
	img := filepath.Join(l.Opts.Dir, "payload.ext4")
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-d", dir, img, "1G").CombinedOutput(); err != nil {
		return "", fmt.Errorf("mkfs.ext4 payload: %w: %s", err, out)
	}
	return img, os.RemoveAll(dir)
}

// copyFile copies src to dst (creating its directory), executable.
func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755) //nolint:gosec // binaries for the VM
}

// clusterKubeconfig writes the admin kubeconfig with the API server reached
// through the ToR at its own port, as the kubelets and kube-proxy use it.
func (l *Lab) clusterKubeconfig() string {
	t := l.t
	data, err := os.ReadFile(l.CP.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	port, err := l.CP.APIPort()
	if err != nil {
		t.Fatal(err)
	}
	s := strings.ReplaceAll(string(data), "127.0.0.1:"+strconv.Itoa(port), net.JoinHostPort(torAddr.String(), strconv.Itoa(port)))
	path := l.NodesKubeconfig()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// NodesKubeconfig is the path of the kubeconfig the nodes use: the admin
// through the ToR's relay to the API server, reachable from the client.
func (l *Lab) NodesKubeconfig() string {
	return filepath.Join(l.Opts.Dir, "kubeconfig-nodes")
}

// netfilterModules are every module of the kernel's netfilter, bridge and
// IPVS directories: the guest's modprobe loads them when iptables, nft,
// ipset or kube-proxy first use them, as a node's kernel does.
func netfilterModules(k *vm.Kernel) []string {
	var out []string
	for _, d := range []string{"net/netfilter", "net/ipv4/netfilter", "net/ipv6/netfilter", "net/bridge", "net/sched"} {
		_ = filepath.WalkDir(filepath.Join(k.Modules, "kernel", d), func(path string, _ fs.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(path, ".ko") {
				out = append(out, strings.ReplaceAll(strings.TrimSuffix(filepath.Base(path), ".ko"), "-", "_"))
			}
			return nil
		})
	}
	return out
}

// kubeBoot is what booting a node of the real cluster needs.
type kubeBoot struct {
	ctx     context.Context
	wg      sync.WaitGroup
	venv    *vm.Env
	rootfs  *vm.Rootfs
	payload string
	// ctrRoot is the ext4 image of containerd's root (containerdRoot).
	ctrRoot string
	agent   string
	co      *ClusterOptions
	all     []*Node
}

// bootKubeNodes boots every node VM of the real cluster: l.Nodes, and the
// spare ones held before their kubelet until JoinSpare.
func (l *Lab) bootKubeNodes(ctx context.Context, cancel context.CancelFunc, venv *vm.Env, rootfs *vm.Rootfs, payload, ctrRoot, agent string, co *ClusterOptions) {
	t := l.t
	t.Helper()
	l.Opts.Logf("==> booting %d node VMs (Debian %s userland, kubelet and kube-proxy %s in %s mode, containerd %s)",
		len(l.Nodes), rootfs.Suite, controlplane.KubernetesVersion, co.ProxyMode, ContainerdVersion)
	if len(l.spare) > 0 {
		l.Opts.Logf("    and %d more, held before their kubelet until they join", len(l.spare))
	}
	l.boot = &kubeBoot{ctx: ctx, venv: venv, rootfs: rootfs, payload: payload, ctrRoot: ctrRoot, agent: agent, co: co, all: append(slices.Clone(l.Nodes), l.spare...)}
	t.Cleanup(func() { cancel(); l.boot.wg.Wait() })
	for _, n := range l.Nodes {
		l.bootKubeNode(n, false)
	}
	// The spare nodes start once the others have their CPUs (vm pins each
	// new VM to the CPU fewest VMs use): a spare one must not leave two
	// serving nodes on one CPU.
	for _, n := range l.Nodes {
		select {
		case <-n.started:
		case <-n.done:
		}
	}
	for _, n := range l.spare {
		l.bootKubeNode(n, true)
	}
}

// spareHeld is what test/lab/kubenode prints once it holds a spare node
// before its kubelet.
const spareHeld = "kubenode: held before the kubelet"

// JoinSpare has the next spare node (see ClusterOptions.Boot) join the
// cluster: its kubelet starts and registers it. It adds the node to Nodes
// and returns it.
//
// A spare node boots in the background (vm.Options.Background: the idle
// scheduling policy) and waits before its kubelet, with nothing but the
// node agent running. To join, it gives way (vm.GiveWay) to the nodes
// serving: on the emulated host it shares a CPU with one of them, which
// on real hardware it would not. Its join then takes the time its
// kubelet takes, not a VM's boot.
func (l *Lab) JoinSpare(ctx context.Context) (*Node, error) {
	if len(l.spare) == 0 || l.boot == nil {
		return nil, fmt.Errorf("no spare node (ClusterOptions.Boot)")
	}
	n := l.spare[0]
	select {
	case <-n.done:
		return nil, fmt.Errorf("%s: the VM ended before it joined: %v (console %s)", n.Name, n.err, n.Console) //nolint:errorlint // n.err may be nil
	default:
	}
	if err := vm.GiveWay(n.pid); err != nil {
		return nil, err
	}
	start := time.Now()
	// A guard against a VM that never comes up, not a figure.
	err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(context.Context) (bool, error) {
		select {
		case <-n.done:
			return false, fmt.Errorf("the VM ended: %v", n.err) //nolint:errorlint // n.err may be nil
		default:
		}
		lines, err := n.ConsoleLines(spareHeld)
		return err == nil && len(lines) > 0, nil
	})
	if err != nil {
		l.dumpConsoles()
		return nil, fmt.Errorf("%s: not held before its kubelet: %w (console %s)", n.Name, err, n.Console)
	}
	if d := time.Since(start); d > time.Second {
		l.Opts.Logf("    %s was still booting: held before its kubelet %s later", n.Name, d.Round(time.Second))
	}
	l.Opts.Logf("==> %s joins the cluster: its kubelet starts", n.Name)
	if _, err := n.post(ctx, "/join", nil, 10*time.Second); err != nil {
		return nil, err
	}
	l.spare = l.spare[1:]
	l.Nodes = append(l.Nodes, n)
	return n, nil
}

// bootKubeNode boots one node VM of the real cluster on its tap; a spare
// one in the background, to wait before its kubelet until JoinSpare.
func (l *Lab) bootKubeNode(n *Node, spare bool) {
	t, b := l.t, l.boot
	i := slices.Index(b.all, n)
	tap := fmt.Sprintf("tap%d", i+1)
	l.TorNS.IP(t, "tuntap", "add", "dev", tap, "mode", "tap")
	l.TorNS.IP(t, "link", "set", tap, "master", "rack", "up")
	opts := l.vmBase(n, i, tap)
	var routes []string
	for _, o := range b.all {
		if o != n {
			routes = append(routes, o.PodCIDR.String()+"="+o.Addr.String())
		}
	}
	opts.TestBinary = b.agent
	opts.Args = []string{
		"-name", n.Name,
		"-addr", fmt.Sprintf("%s/%d", n.Addr, rackBits),
		"-gateway", torAddr.String(),
		"-pod-cidr", n.PodCIDR.String(),
		"-routes", strings.Join(routes, ","),
		"-proxy-mode", b.co.ProxyMode,
		"-cluster-cidr", clusterCIDR,
		"-node-port-addresses", netip.PrefixFrom(n.Addr, rackBits).Masked().String(),
		"-ipvs-exclude-cidrs", PoolPrefix.String(),
		"-registry", NodeRegistry(),
	}
	if b.co.Upstream {
		opts.Args = append(opts.Args, "-cluster-dns", ClusterDNS)
	}
	opts.Disk = b.rootfs.Image
	opts.Modules = append(opts.Modules, "overlay", "br_netfilter", "veth", "nf_conntrack_netlink")
	opts.OnDemandModules = netfilterModules(b.venv.Kernel)
	opts.MemoryMB = 2048
	if spare {
		opts.Args = append(opts.Args, "-hold", "-prepull", strings.Join(l.speakerImages(), ","))
		opts.Background = true
	}
	// /dev/vdb: the payload, read-only; /dev/vdc: containerd's root, a
	// copy of its own (snapshot=on; cache=unsafe: it is thrown away).
	opts.QEMUArgs = append(opts.QEMUArgs, "-drive", "file="+b.payload+",if=virtio,format=raw,readonly=on",
		"-drive", "file="+b.ctrRoot+",if=virtio,format=raw,snapshot=on,cache=unsafe")
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer close(n.done)
		res, err := vm.RunContext(b.ctx, b.venv, opts)
		n.err = err
		if b.ctx.Err() == nil {
			code := -1
			if res != nil {
				code = res.ExitCode
			}
			l.Opts.Logf("    %s: its VM ended (exit code %d, %v); console %s", n.Name, code, err, n.Console)
		}
	}()
}

// speakerImages are the speaker's images of every release the lab pushed
// (ClusterOptions.ImageTag and ExtraTags), as the nodes pull them: a spare
// node pulls them while it is held, so its join pulls nothing.
func (l *Lab) speakerImages() []string {
	co := l.boot.co
	var refs []string
	for _, tag := range append([]string{co.ImageTag}, co.ExtraTags...) {
		v, err := ChartVersion(tag)
		if err != nil {
			l.t.Fatal(err)
		}
		refs = append(refs, NodeRegistry()+"/"+registryPath+"/vipcast-speaker:"+v)
	}
	return refs
}

// waitKubelets waits until every booted node has registered and is Ready.
func (l *Lab) waitKubelets(ctx context.Context) {
	for _, n := range l.Nodes {
		l.WaitKubelet(ctx, n)
	}
}

// WaitKubelet waits until the node's kubelet has registered it and it is
// Ready.
func (l *Lab) WaitKubelet(ctx context.Context, n *Node) {
	t := l.t
	t.Helper()
	start := time.Now()
	{
		// A guard against a node that never comes up, not a figure (the
		// log gives each node's time): a joining node gives way to the
		// serving ones and may take longer than the first two.
		err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
			select {
			case <-n.done:
				return false, fmt.Errorf("the VM ended: %v", n.err) //nolint:errorlint // n.err may be nil
			default:
			}
			node, err := l.CP.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return false, nil //nolint:nilerr // not registered yet
			}
			for _, c := range node.Status.Conditions {
				if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			l.dumpConsoles()
			t.Fatalf("%s: the kubelet did not register a Ready node: %v (console %s)", n.Name, err, n.Console)
		}
		l.Opts.Logf("    %s is Ready (%s after boot started)", n.Name, time.Since(start).Round(time.Second))
	}
}

// Helm runs the helm binary against the lab's API server and returns what
// it printed.
func (l *Lab) Helm(ctx context.Context, args ...string) (string, error) {
	c := exec.CommandContext(ctx, HelmBin(), args...)
	c.Env = l.toolEnv()
	out, err := c.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// toolEnv is the environment of the lab's kubectl, helm and shell: the
// lab's API server, helm's caches in the lab's directory, and kubectl,
// helm and the lab's binaries (kubectl-vipcast) first on the PATH.
func (l *Lab) toolEnv() []string {
	return append(os.Environ(), "KUBECONFIG="+l.CP.Kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(l.Opts.Dir, "helm/cache"),
		"HELM_CONFIG_HOME="+filepath.Join(l.Opts.Dir, "helm/config"),
		"HELM_DATA_HOME="+filepath.Join(l.Opts.Dir, "helm/data"),
		"PATH="+strings.Join([]string{controlplane.BinDir(), filepath.Dir(HelmBin()), l.binDir, os.Getenv("PATH")}, string(os.PathListSeparator)))
}

// Shell runs script with bash in dir, as a reader of the docs would in a
// terminal: kubectl, helm and kubectl-vipcast on the PATH, KUBECONFIG the
// lab's API server, helm's caches the lab's. It returns what the script
// printed.
func (l *Lab) Shell(ctx context.Context, dir, script string) (string, error) {
	c := exec.CommandContext(ctx, "bash", "-c", script)
	c.Dir = dir
	c.Env = l.toolEnv()
	out, err := c.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", script, err, out)
	}
	return string(out), nil
}

// SpeakerValues are the chart values the lab sets for a helm install or
// upgrade: the tag of both images and the speakers' dataplane.
type SpeakerValues struct {
	// Tag names the release to install or upgrade to (ClusterOptions.ImageTag
	// or ExtraTags): chart and images ChartVersion(Tag).
	Tag string
	// TunnelPrefix, when set, is speaker.ipvs.tunnelPrefix: two tiers.
	TunnelPrefix string
	// ConnSyncInterface and ConnSyncTransport, when set, are
	// speaker.ipvs.connSync's interface ("none": no connection sync) and
	// transport ("relay").
	ConnSyncInterface, ConnSyncTransport string
	// AllAtOnce rolls the speakers out on every node at once
	// (speaker.updateStrategy maxUnavailable 100%) instead of the chart's
	// one node at a time: for a switch of dataplane that no traffic is held
	// across. The change of strategy alone restarts no pod.
	AllAtOnce bool
}

// OutageSettle is the lab speakers' speaker.outageSettle: shorter than
// the chart's 2m, so that TestCluster/outage sees the hold end, and long
// enough for the node monitor to mark the nodes (at once, or up to a grace
// period later when a kubelet's last Lease renewal landed as the API
// server resumed) and for the kubelets the test stops past the return to
// mark their pods ready again (about 25 s after they continue).
const OutageSettle = 70 * time.Second

// HelmValuesFile writes the lab's values for charts/vipcast: v, the lab's
// convergence delay and outage settle time (OutageSettle), with Options.Resync the speakers' resync periods and,
// with Options.Password, the demo's password Secret for the speakers to
// read. One CCM replica (and so no PodDisruptionBudget, which must stay
// below the replicas): each node is one emulated CPU, and with the chart's
// two, a rollout restart placed the new CCM pod beside the old one still
// running (preferred anti-affinity ties while the other old pod
// terminates); both starting on one starved node took 7.5 minutes to be
// Ready and the rollout passed its bound (CI, twice). Leader election stays
// on; the handover between two CCMs is test/e2e's TestLeaderChange.
func (l *Lab) HelmValuesFile(v SpeakerValues) (string, error) {
	// The pods' range, as kube-proxy's clusterCIDR: with one tier, a pod
	// on a node without an endpoint of a Local Service reaches its VIP.
	ipvs := fmt.Sprintf("{tunnelPrefix: %q, clusterCIDRs: [%s]", v.TunnelPrefix, clusterCIDR)
	if v.ConnSyncInterface != "" || v.ConnSyncTransport != "" {
		sync := map[string]string{"interface": "auto", "transport": "multicast"}
		if v.ConnSyncInterface != "" {
			sync["interface"] = v.ConnSyncInterface
		}
		if v.ConnSyncTransport != "" {
			sync["transport"] = v.ConnSyncTransport
		}
		ipvs += fmt.Sprintf(", connSync: {interface: %q, transport: %q}", sync["interface"], sync["transport"])
	}
	speaker := ""
	if r := l.Opts.Resync; r > 0 {
		speaker = fmt.Sprintf("  resyncPeriod: %s\n", r)
		ipvs += fmt.Sprintf(", resyncPeriod: %s", r)
	}
	if v.AllAtOnce {
		speaker += "  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 100%}}\n"
	}
	if l.Opts.Password != "" {
		speaker += fmt.Sprintf("  bgpPasswordSecrets: {secrets: [%s/%s]}\n", PasswordNamespace, PasswordSecret)
	}
	values := fmt.Sprintf(`ccm:
  replicas: 1
  podDisruptionBudget: {enabled: false}
speaker:
  convergenceDelay: 2s
  outageSettle: %s
  metrics: {allowedSources: [%s/32]}
%s  ipvs: %s}
`, fmt.Sprintf("%ds", int(OutageSettle.Seconds())), torAddr, speaker, ipvs)
	l.values++
	path := filepath.Join(l.Opts.Dir, fmt.Sprintf("values-%d-%s.yaml", l.values, v.Tag))
	return path, os.WriteFile(path, []byte(values), 0o600)
}

// UpgradeSpeakers runs helm upgrade of the release with v and waits until
// the speakers' DaemonSet and then the CCM's Deployment have rolled out
// (each within bound, a guard against a rollout that hangs); it returns
// how long the speakers took, and the CCM after them.
func (l *Lab) UpgradeSpeakers(ctx context.Context, v SpeakerValues, bound time.Duration) (speakers, ccm time.Duration, err error) {
	version, err := ChartVersion(v.Tag)
	if err != nil {
		return 0, 0, err
	}
	values, err := l.HelmValuesFile(v)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	if _, err := l.Helm(ctx, "upgrade", Release, l.chartRef(), "--version", version, "--plain-http", "-n", VipcastNamespace, "-f", values); err != nil {
		return 0, 0, err
	}
	if err := l.WaitRollout(ctx, bound, "daemonset/"+Release+"-speaker"); err != nil {
		return 0, 0, err
	}
	speakers = time.Since(start)
	if err := l.WaitRollout(ctx, bound, "deployment/"+Release+"-ccm"); err != nil {
		return 0, 0, err
	}
	return speakers, time.Since(start) - speakers, nil
}

// helmInstall installs charts/vipcast with the command docs/install.md
// gives, then waits until vipcast-ccm has initialized every node and the
// speakers run.
func (l *Lab) helmInstall(ctx context.Context, co *ClusterOptions) {
	t := l.t
	t.Helper()
	version, err := ChartVersion(co.ImageTag)
	if err != nil {
		t.Fatal(err)
	}
	values, err := l.HelmValuesFile(SpeakerValues{Tag: co.ImageTag})
	if err != nil {
		t.Fatal(err)
	}
	l.Opts.Logf("==> helm install %s %s --version %s --plain-http -n %s --create-namespace -f %s", Release, l.chartRef(), version, VipcastNamespace, filepath.Base(values))
	if _, err := l.Helm(ctx, "install", Release, l.chartRef(), "--version", version, "--plain-http", "-n", VipcastNamespace, "--create-namespace", "-f", values); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := l.WaitInitialized(ctx, 5*time.Minute); err != nil {
		l.dumpConsoles()
		t.Fatal(err)
	}
	l.Opts.Logf("    vipcast-ccm initialized every node (%s)", time.Since(start).Round(time.Second))
	if err := l.WaitRollout(ctx, 5*time.Minute, "daemonset/"+Release+"-speaker", "deployment/"+Release+"-ccm"); err != nil {
		l.dumpConsoles()
		t.Fatal(err)
	}
	l.Opts.Logf("    the speakers and the CCM run (%s)", time.Since(start).Round(time.Second))
}

// WaitInitialized waits until every Node has a provider ID and no
// uninitialized taint: vipcast-ccm's node controller has run.
func (l *Lab) WaitInitialized(ctx context.Context, timeout time.Duration) error {
	var pending []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		nodes, err := l.CP.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // retry until the timeout
		}
		pending = nil
		for _, n := range nodes.Items {
			if n.Spec.ProviderID == "" || slices.ContainsFunc(n.Spec.Taints, func(t v1.Taint) bool {
				return t.Key == "node.cloudprovider.kubernetes.io/uninitialized"
			}) {
				pending = append(pending, n.Name)
			}
		}
		return len(nodes.Items) > 0 && len(pending) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("nodes not initialized by vipcast-ccm after %v: %v: %w\n%s", timeout, pending, err, l.ccmState(context.WithoutCancel(ctx)))
	}
	return nil
}

// ccmState describes the CCM for a failure message: its pods, who holds
// its Lease, the Nodes' taints and what each CCM pod logged about nodes,
// leadership and errors.
func (l *Lab) ccmState(ctx context.Context) string {
	return l.clusterState(ctx, [][]string{
		{"-n", VipcastNamespace, "get", "pods", "-o", "wide"},
		{"get", "leases", "-A", "-o", "custom-columns=NAME:.metadata.name,HOLDER:.spec.holderIdentity,RENEWED:.spec.renewTime,TRANSITIONS:.spec.leaseTransitions"},
		{"get", "nodes", "-o", "custom-columns=NAME:.metadata.name,PROVIDER:.spec.providerID,TAINTS:.spec.taints[*].key,CREATED:.metadata.creationTimestamp"},
	}, "the CCM's log (nodes, leadership, errors)",
		fmt.Sprintf("grep -hE 'node|leader|lease|rror|E[0-9]{4} ' /var/log/pods/%s_%s-ccm*/*/*.log | tail -n 60", VipcastNamespace, Release))
}

// clusterState is a failure message's description of the cluster: what
// each kubectl command printed, then what the shell command node printed
// on each node, under the heading what. Bounded at a minute.
func (l *Lab) clusterState(ctx context.Context, kubectl [][]string, what, node string) string {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var b strings.Builder
	for _, args := range kubectl {
		out, err := l.Kubectl(ctx, args...)
		fmt.Fprintf(&b, "kubectl %s: %v\n%s\n", strings.Join(args, " "), err, out)
	}
	for _, n := range l.Nodes {
		out, err := n.Exec(ctx, "sh", "-c", node)
		fmt.Fprintf(&b, "%s: %s: %v\n%s\n", n.Name, what, err, out)
	}
	return b.String()
}

// WaitRollout runs `kubectl rollout status` for each workload in the
// vipcast namespace. Its error says where the rollout stands (see
// rolloutState).
func (l *Lab) WaitRollout(ctx context.Context, timeout time.Duration, workloads ...string) error {
	for _, w := range workloads {
		if _, err := l.Kubectl(ctx, "-n", VipcastNamespace, "rollout", "status", w, "--timeout", timeout.String()); err != nil {
			return fmt.Errorf("%w\n%s", err, l.rolloutState(context.WithoutCancel(ctx)))
		}
	}
	return nil
}

// rolloutState describes vipcast's pods for a failed rollout: each pod's
// conditions and container states with their times, the namespace's
// Events in order, and the last lines of every vipcast container's log
// still on each node (old pods' included), so that the step the rollout
// stuck on is told from the output alone.
func (l *Lab) rolloutState(ctx context.Context) string {
	return l.clusterState(ctx, [][]string{
		{"-n", VipcastNamespace, "get", "pods", "-o", "wide"},
		{"-n", VipcastNamespace, "get", "pods", "-o", `jsonpath={range .items[*]}{.metadata.name} created {.metadata.creationTimestamp} deleted {.metadata.deletionTimestamp}{"\n"}  conditions {range .status.conditions[*]}{.type}={.status}@{.lastTransitionTime} {end}{"\n"}  init {.status.initContainerStatuses[*].state}{"\n"}  containers {.status.containerStatuses[*].state}{"\n"}{end}`},
		{"-n", VipcastNamespace, "get", "events", "--sort-by=.lastTimestamp", "-o", "custom-columns=LAST:.lastTimestamp,COUNT:.count,OBJECT:.involvedObject.name,REASON:.reason,MESSAGE:.message"},
	}, "vipcast's container logs", fmt.Sprintf("tail -n 40 /var/log/pods/%s_%s-*/*/*.log", VipcastNamespace, Release))
}

// BackendsPerNode is how many replicas of the demo Deployment each node
// runs (spread by a topology constraint).
const BackendsPerNode = 2

// applyBackends creates the demo Deployment: BackendsPerNode backends per
// node, spread evenly, and waits until they are ready.
func (l *Lab) applyBackends(ctx context.Context) error {
	replicas := int32(BackendsPerNode * len(l.Nodes)) //nolint:gosec // a handful of nodes
	labels := map[string]string{"app": DemoService}
	fieldEnv := func(name, path string) v1.EnvVar {
		return v1.EnvVar{Name: name, ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: path}}}
	}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: DemoService, Namespace: DemoNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: v1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: v1.PodSpec{
					Containers: []v1.Container{{
						Name:            "backend",
						Image:           BackendImage,
						ImagePullPolicy: v1.PullNever,
						Env:             []v1.EnvVar{fieldEnv("POD_NAME", "metadata.name"), fieldEnv("NODE_NAME", "spec.nodeName"), {Name: "PORT", Value: strconv.Itoa(nodeapi.BackendPort)}, {Name: "DRAIN_SECONDS", Value: "5"}},
						Ports:           []v1.ContainerPort{{ContainerPort: nodeapi.BackendPort}},
						// Burstable, not BestEffort: a BestEffort pod gets the
						// least CPU weight, and the nodes have one emulated CPU.
						Resources: v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("200m")}},
						ReadinessProbe: &v1.Probe{
							ProbeHandler:  v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromInt32(nodeapi.BackendPort)}},
							PeriodSeconds: 2,
						},
					}},
					TopologySpreadConstraints: []v1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: "kubernetes.io/hostname", WhenUnsatisfiable: v1.DoNotSchedule,
						LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
					}},
				},
			},
		},
	}
	if _, err := l.CP.Client.AppsV1().Deployments(DemoNamespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("deployment %s/%s: %w", DemoNamespace, DemoService, err)
	}
	if _, err := l.Kubectl(ctx, "-n", DemoNamespace, "rollout", "status", "deployment/"+DemoService, "--timeout", "5m"); err != nil {
		return err
	}
	return l.refreshPods(ctx)
}

// refreshPods reads the demo's ready pods into each Node's Pods.
func (l *Lab) refreshPods(ctx context.Context) error {
	pods, err := l.CP.Client.CoreV1().Pods(DemoNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + DemoService})
	if err != nil {
		return err
	}
	for _, n := range l.Nodes {
		n.Pods = nil
		for _, p := range pods.Items {
			a, err := netip.ParseAddr(p.Status.PodIP)
			if p.Spec.NodeName != n.Name || err != nil || p.DeletionTimestamp != nil {
				continue
			}
			n.Pods = append(n.Pods, Pod{Name: p.Name, Node: n.Name, Addr: a})
		}
		slices.SortFunc(n.Pods, func(a, b Pod) int { return strings.Compare(a.Name, b.Name) })
	}
	return nil
}

// SpeakerLogFiles are the files of the node's speaker pod's logs (a shell
// pattern): one per run of its container the kubelet keeps (all of them,
// in the lab's nodes).
const SpeakerLogFiles = "/var/log/pods/" + VipcastNamespace + "_" + Release + "-speaker-*/vipcast-speaker/*.log"

// SpeakerLogLines returns the lines of the node's speaker pod's logs that
// contain substr.
func (n *Node) SpeakerLogLines(ctx context.Context, substr string) ([]string, error) {
	out, err := n.Exec(ctx, "sh", "-c", `grep -hF -- "$0" `+SpeakerLogFiles+` || true`, substr)
	if err != nil {
		return nil, err
	}
	return strings.FieldsFunc(out, func(r rune) bool { return r == '\n' }), nil
}

// Exec runs a command on the node through its agent and returns its
// output.
func (n *Node) Exec(ctx context.Context, argv ...string) (string, error) {
	out, err := n.post(ctx, "/exec", strings.NewReader(strings.Join(argv, "\n")), 40*time.Second)
	if err != nil {
		return out, fmt.Errorf("exec %v: %w", argv, err)
	}
	return out, nil
}

// RestartKubeProxy restarts kube-proxy on the node, as a rollout of its
// DaemonSet would; with mode set (iptables, nftables, ipvs) it moves it to
// that mode as kube-proxy's documentation says: stop, kube-proxy
// --cleanup, start in the new mode.
func (n *Node) RestartKubeProxy(ctx context.Context, mode string) error {
	path := "/kube-proxy"
	if mode != "" {
		path += "?mode=" + url.QueryEscape(mode)
	}
	if _, err := n.post(ctx, path, nil, 2*time.Minute); err != nil {
		return fmt.Errorf("restart kube-proxy: %w", err)
	}
	return nil
}

// Logs returns the logs of the containers on the node whose pod name
// starts with prefix (the kubelet's files under /var/log/pods).
func (n *Node) Logs(ctx context.Context, namespace, prefix string) (string, error) {
	return n.Exec(ctx, "sh", "-c", fmt.Sprintf("tail -n 400 /var/log/pods/%s_%s*/*/*.log", namespace, prefix))
}
