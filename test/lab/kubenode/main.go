// Command kubenode is what a node VM of the lab's real cluster runs (see
// package github.com/vipcast/vipcast/test/lab, Options.Cluster): it turns
// the VM into a Kubernetes node the way a node's boot scripts do, then
// leaves everything to the real components.
//
//   - the Debian root filesystem (the VM's first disk, vm.Rootfs) is mounted
//     and becomes the root of every daemon (chroot), with the payload disk
//     (kubelet, kube-proxy, containerd and the kubeconfig) on /opt/vipcast
//     and containerd's root, the images already imported, on
//     /var/lib/containerd;
//   - eth0 gets the node's address on the rack network and a default route
//     to the ToR; routes to the other nodes' pod ranges go via those nodes
//     (a flat "host-gw" pod network: the bridge CNI plugin on each node);
//   - containerd starts, then the
//     kubelet (--cloud-provider=external: the node registers with the
//     uninitialized taint) and kube-proxy in the mode given; with -hold,
//     the kubelet waits for POST /join, so that a node booted ahead joins
//     the cluster when a test says;
//   - a control server on the node's address (nodeapi.Port) lets the host
//     read the node's IPVS table, VIPs, nftables tables and links (GET
//     /state), to check what vipcast leaves behind, its logs (GET /logs/,
//     the containers' under /logs/pods/) and run a command there (POST
//     /exec), as kubectl logs and exec would through a kubelet the API
//     server cannot reach here.
//
// Each daemon's log goes to /var/log/<name>.log in the VM and its error
// lines to the console. It is built static (CGO_ENABLED=0) and runs as root
// in the guest until the VM is stopped.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vipcast/vipcast/test/lab/nodeapi"
	"github.com/vipcast/vipcast/test/vm"
)

// Where things are, inside the node's root.
const (
	root       = "/node"
	payloadDir = "/opt/vipcast"
	binDir     = payloadDir + "/bin"
	kubeconfig = payloadDir + "/kubeconfig"
	containerd = "/run/containerd/containerd.sock"
	// containerdRoot is containerd's root, its own disk (-containerd-root)
	// with the images already imported.
	containerdRoot = "/var/lib/containerd"
)

// config is the command line.
type config struct {
	nodeapi.NetFlags
	name           string
	payload        string
	containerdRoot string
	proxyMode      string
	// hold: wait for POST /join before starting containerd and the
	// kubelet (a node booted ahead of the moment it joins the cluster).
	hold bool
	// clusterCIDR covers every node's pod range (kube-proxy's
	// clusterCIDR); excludeCIDRs are kube-proxy's ipvs.excludeCIDRs and
	// nodePortAddresses its nodePortAddresses.
	clusterCIDR       string
	excludeCIDRs      []string
	nodePortAddresses []string
	// clusterDNS is the cluster DNS Service's address the kubelet gives
	// pods (with cluster.local as their domain); empty: none.
	clusterDNS string
	// registry is HOST:PORT of a registry containerd pulls from over plain
	// HTTP (the lab's, at the ToR); empty: none.
	registry string
	// prepull are images containerd pulls while the node is held (-hold).
	prepull []string
}

func main() {
	cfg, err := parse(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubenode:", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "kubenode:", err)
		os.Exit(1)
	}
}

func parse(args []string) (*config, error) {
	fs := flag.NewFlagSet("kubenode", flag.ContinueOnError)
	var exclude, nodePorts string
	cfg := &config{}
	fs.StringVar(&cfg.name, "name", "", "node name")
	cfg.Register(fs, "this node's pod range (the bridge CNI plugin's)")
	fs.StringVar(&cfg.payload, "payload", "/dev/vdb", "block device of the payload (binaries, kubeconfig)")
	fs.StringVar(&cfg.containerdRoot, "containerd-root", "/dev/vdc", "block device of containerd's root, with the images imported (writable)")
	fs.StringVar(&cfg.proxyMode, "proxy-mode", "iptables", "kube-proxy's mode: iptables, nftables or ipvs; none runs no kube-proxy")
	fs.StringVar(&cfg.clusterCIDR, "cluster-cidr", "10.244.0.0/16", "kube-proxy's clusterCIDR")
	fs.StringVar(&exclude, "ipvs-exclude-cidrs", "", "kube-proxy's ipvs.excludeCIDRs, comma-separated")
	fs.StringVar(&nodePorts, "node-port-addresses", "", "kube-proxy's nodePortAddresses, comma-separated")
	fs.StringVar(&cfg.clusterDNS, "cluster-dns", "", "the kubelet's clusterDNS (the cluster DNS Service's address, domain cluster.local); empty: none")
	fs.StringVar(&cfg.registry, "registry", "", "HOST:PORT of an OCI registry containerd pulls from over plain HTTP; empty: none")
	fs.BoolVar(&cfg.hold, "hold", false, "wait for POST /join before starting the kubelet and kube-proxy (and containerd, unless -prepull)")
	var prepull string
	fs.StringVar(&prepull, "prepull", "", "with -hold: image references, comma-separated, that containerd pulls from -registry while the node is held, so that its join pulls nothing")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if cfg.name == "" {
		return nil, errors.New("-name is required")
	}
	for _, ref := range strings.Split(prepull, ",") {
		if ref = strings.TrimSpace(ref); ref != "" {
			cfg.prepull = append(cfg.prepull, ref)
		}
	}
	if len(cfg.prepull) > 0 && (!cfg.hold || cfg.registry == "") {
		return nil, errors.New("-prepull needs -hold and -registry: it pulls while a node is held")
	}
	if cfg.registry != "" {
		if _, err := netip.ParseAddrPort(cfg.registry); err != nil {
			return nil, fmt.Errorf("-registry %q: want the registry's IP:PORT: %w", cfg.registry, err)
		}
	}
	if cfg.clusterDNS != "" {
		if _, err := netip.ParseAddr(cfg.clusterDNS); err != nil {
			return nil, fmt.Errorf("-cluster-dns %q: want the DNS Service's IP address: %w", cfg.clusterDNS, err)
		}
	}
	if err := cfg.Parse(); err != nil {
		return nil, err
	}
	switch cfg.proxyMode {
	case "iptables", "nftables", "ipvs", "none":
	default:
		return nil, fmt.Errorf("-proxy-mode %q: want iptables, nftables, ipvs or none", cfg.proxyMode)
	}
	cfg.excludeCIDRs, cfg.nodePortAddresses = splitList(exclude), splitList(nodePorts)
	return cfg, nil
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

func run(cfg *config) error {
	start := time.Now()
	// Orphans (containerd's shims, once their parent exits) are reparented
	// here, not to the VM's init, and reaped below.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("subreaper: %w", err)
	}
	if err := mountDisks(cfg); err != nil {
		return err
	}
	if err := network(cfg); err != nil {
		return err
	}
	env := []string{"PATH=" + binDir + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	d := newDaemons(env)
	join := make(chan struct{})
	serveControl(cfg, d, join)
	if err := unix.Sethostname([]byte(cfg.name)); err != nil {
		return fmt.Errorf("hostname: %w", err)
	}
	if err := vm.SwitchRoot(root); err != nil {
		return err
	}
	if err := prepareNode(cfg); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if ok, err := startContainerd(ctx, cfg, d, join, start); !ok || err != nil {
		return err
	}
	if err := d.start("kubelet", binDir+"/kubelet",
		"--config", "/etc/kubernetes/kubelet.yaml",
		"--kubeconfig", kubeconfig,
		"--cloud-provider", "external",
		"--node-ip", cfg.Addr.Addr().String(),
		"--hostname-override", cfg.name,
		// cAdvisor's per-container housekeeping every minute, not every
		// 10 s: the lab reads no container statistics.
		"--housekeeping-interval", "1m",
		// The logs of a container's earlier runs stay (the kubelet keeps
		// one by default): the lab counts what each run of a speaker
		// logged, through the restarts POST /speaker causes.
		"--maximum-dead-containers-per-container", "100",
		"--v", "1"); err != nil {
		return err
	}
	if cfg.proxyMode != "none" {
		if err := d.start("kube-proxy", binDir+"/kube-proxy", "--config", "/etc/kubernetes/kube-proxy.yaml", "--v", "1"); err != nil {
			return err
		}
	}
	fmt.Printf("kubenode: kubelet and kube-proxy (%s) started, %s after start\n", cfg.proxyMode, time.Since(start).Round(time.Millisecond))
	return d.reap(ctx)
}

// mountDisks mounts the root filesystem at root and the payload on
// payloadDir inside it.
func mountDisks(cfg *config) error {
	if err := vm.MountRootfs(root); err != nil {
		return err
	}
	if err := os.MkdirAll(root+payloadDir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(cfg.payload, root+payloadDir, "ext4", unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mount payload %s: %w", cfg.payload, err)
	}
	if err := os.MkdirAll(root+containerdRoot, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(cfg.containerdRoot, root+containerdRoot, "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount containerd's root %s: %w", cfg.containerdRoot, err)
	}
	return nil
}

// startContainerd starts containerd, holding the node first with -hold
// (after pulling the -prepull images, for which containerd starts before
// the hold). It reports false, with no error, when ctx ended during the
// hold.
func startContainerd(ctx context.Context, cfg *config, d *daemons, join <-chan struct{}, start time.Time) (bool, error) {
	up := func() error {
		if err := d.start("containerd", binDir+"/containerd", "--config", "/etc/containerd/config.toml"); err != nil {
			return err
		}
		if err := waitFile(ctx, containerd, time.Minute); err != nil {
			return fmt.Errorf("containerd did not start: %w", err)
		}
		fmt.Printf("kubenode: containerd up, %s after start\n", time.Since(start).Round(time.Millisecond))
		return nil
	}
	if len(cfg.prepull) > 0 {
		if err := up(); err != nil {
			return false, err
		}
		prepullImages(ctx, cfg.prepull)
	}
	if cfg.hold && !holdUntilJoin(ctx, join, start) {
		return false, nil
	}
	if len(cfg.prepull) == 0 {
		if err := up(); err != nil {
			return false, err
		}
	}
	return true, nil
}

// prepullImages has containerd pull each image into the kubelet's
// namespace, through the registry hosts of /etc/containerd/certs.d, while
// the node is held: the VM runs at the idle scheduling policy then, so the
// pull takes only CPU the serving nodes leave, and the join that follows
// pulls nothing. A pull that fails is reported and left to the kubelet.
func prepullImages(ctx context.Context, refs []string) {
	for _, ref := range refs {
		t := time.Now()
		ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		out, err := exec.CommandContext(ctx, binDir+"/ctr", "--address", containerd, "-n", "k8s.io",
			"images", "pull", "--hosts-dir", "/etc/containerd/certs.d", ref).CombinedOutput()
		cancel()
		if err != nil {
			fmt.Printf("kubenode: pre-pulling %s failed after %s (the kubelet pulls it at the join): %v: %s\n", ref, time.Since(t).Round(time.Millisecond), err, lastLine(out))
			continue
		}
		fmt.Printf("kubenode: pre-pulled %s in %s\n", ref, time.Since(t).Round(time.Millisecond))
	}
}

// lastLine is the last non-empty line of out.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

// holdUntilJoin holds the node before its kubelet, running nothing but
// this agent (and containerd, idle, after -prepull), until POST /join
// closes join; it reports false when ctx ended first.
func holdUntilJoin(ctx context.Context, join <-chan struct{}, start time.Time) bool {
	fmt.Println("kubenode: held before the kubelet until POST /join")
	select {
	case <-join:
	case <-ctx.Done():
		return false
	}
	fmt.Printf("kubenode: joining, %s after start\n", time.Since(start).Round(time.Millisecond))
	return true
}

// network configures eth0, the default route and the routes to the other
// nodes' pod ranges.
func network(cfg *config) error {
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer nl.Close()
	return nodeapi.Uplink(nl, cfg.NetFlags)
}

// serveControl serves the lab's view of the node (GET /state: IPVS, VIPs,
// nftables tables, links), its logs, commands, kube-proxy's restart and,
// for a node booted with -hold, the start of its kubelet (POST /join
// closes join) on the node's address.
func serveControl(cfg *config, d *daemons, join chan struct{}) {
	mux := http.NewServeMux()
	var joinOnce sync.Once
	mux.HandleFunc("POST /join", func(w http.ResponseWriter, _ *http.Request) {
		joinOnce.Do(func() { close(join) })
		w.Header().Set("Content-Type", "text/plain")
		_, _ = fmt.Fprintln(w, "joining")
	})
	mux.HandleFunc("GET /state", nodeapi.StateHandler)
	// The node's logs (/var/log/pods holds the containers'): the API
	// server on the host cannot reach the kubelets for kubectl logs.
	mux.Handle("GET /logs/", http.StripPrefix("/logs/", http.FileServer(http.Dir("/var/log"))))
	// A command on the node (ipvsadm, nft, iptables-save, conntrack), for
	// tests to show what the kernel holds: POST /exec with one argument
	// per line.
	mux.HandleFunc("POST /exec", d.execHandler)
	// The node's vipcast-speaker, as the test of an agent-run speaker
	// drives it: POST /speaker?signal=TERM|KILL|STOP|CONT (&wait=1: until
	// it exited), or ?start=1: until the kubelet has started it again.
	mux.HandleFunc("POST /speaker", d.speakerHandler)
	// Restart kube-proxy (POST /kube-proxy), or move it to another mode
	// (?mode=nftables) the way kube-proxy's documentation says: stop it,
	// run kube-proxy --cleanup (which removes every mode's rules, and
	// flushes IPVS), start it in the new mode.
	var proxyMu sync.Mutex // one restart at a time
	mux.HandleFunc("POST /kube-proxy", func(w http.ResponseWriter, r *http.Request) {
		proxyMu.Lock()
		defer proxyMu.Unlock()
		if err := restartKubeProxy(cfg, d, r.URL.Query().Get("mode")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = fmt.Fprintf(w, "kube-proxy restarted in %s mode\n", cfg.proxyMode) //nolint:gosec // plain text, to the lab's tests
	})
	srv := &http.Server{Addr: net.JoinHostPort(cfg.Addr.Addr().String(), nodeapi.Port), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil {
			fmt.Printf("kubenode: control server: %v\n", err)
		}
	}()
}

// prepareNode does, inside the node's root, what a node's boot does
// before the kubelet: sysctls, cgroup controllers, and the configuration
// of containerd, the CNI plugin, the kubelet and kube-proxy.
func prepareNode(cfg *config) error {
	for key, value := range map[string]string{
		"net/ipv4/ip_forward":                 "1",
		"net/bridge/bridge-nf-call-iptables":  "1",
		"net/bridge/bridge-nf-call-ip6tables": "1",
	} {
		if err := os.WriteFile("/proc/sys/"+key, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s: %w", key, err)
		}
	}
	// cgroup v2: the kubelet and containerd create their cgroups under
	// the root one, which must delegate the controllers they use.
	ctrls, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		return fmt.Errorf("cgroup2: %w", err)
	}
	var enable []string
	for _, c := range strings.Fields(string(ctrls)) {
		enable = append(enable, "+"+c)
	}
	if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte(strings.Join(enable, " ")), 0o644); err != nil {
		return fmt.Errorf("cgroup2 controllers %v: %w", enable, err)
	}
	// The node's daemons (this agent, containerd and the shims it starts,
	// the kubelet, kube-proxy) go into a cgroup of their own with the
	// default CPU weight, as a node's system.slice sits beside the
	// kubelet's kubepods.
	if err := os.MkdirAll("/sys/fs/cgroup/system", 0o755); err != nil {
		return fmt.Errorf("cgroup system: %w", err)
	}
	if err := os.WriteFile("/sys/fs/cgroup/system/cpu.weight", []byte("100"), 0o644); err != nil {
		return fmt.Errorf("cgroup system cpu.weight: %w", err)
	}
	if err := os.WriteFile("/sys/fs/cgroup/system/cgroup.procs", []byte(fmt.Sprint(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("cgroup system: moving the agent: %w", err)
	}
	files := map[string]string{
		"/etc/hosts":                      fmt.Sprintf("127.0.0.1 localhost\n%s %s\n", cfg.Addr.Addr(), cfg.name),
		"/etc/hostname":                   cfg.name + "\n",
		"/etc/resolv.conf":                "# the lab has no DNS: nothing leaves it\nnameserver 127.0.0.1\n",
		"/etc/containerd/config.toml":     containerdConfig,
		"/etc/cni/net.d/10-lab.conflist":  fmt.Sprintf(cniConfig, cfg.PodCIDR),
		"/etc/kubernetes/kubelet.yaml":    kubeletConfig(cfg),
		"/etc/kubernetes/kube-proxy.yaml": kubeProxyConfig(cfg),
	}
	if cfg.registry != "" {
		// containerd's per-registry hosts (config_path): the lab's
		// registry answers plain HTTP.
		files["/etc/containerd/certs.d/"+cfg.registry+"/hosts.toml"] = fmt.Sprintf("server = \"http://%s\"\n\n[host.\"http://%s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", cfg.registry, cfg.registry)
	}
	for path, content := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// containerdConfig: containerd 2.x (config version 3) with the lab's own
// pause image, Debian's runc with cgroupfs, and Debian's CNI plugins.
//
// The CRI plugin's stats collector asks every container's shim for its
// cgroup's CPU usage every second by default (for the kubelet's
// UsageNanoCores, which nothing in the lab reads): on one emulated CPU,
// where every wake-up costs tens of times what it costs on hardware,
// containerd and its shims then took about a third of an idle node. Here
// it runs once a minute, and the snapshots' disk usage once every ten.
const containerdConfig = `version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  stats_collect_period = 600
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "/etc/containerd/certs.d"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "` + PauseImage + `"

[plugins.'io.containerd.cri.v1.runtime']
  stats_collect_period = "1m"

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "/etc/cni/net.d"

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = "/usr/sbin/runc"
      SystemdCgroup = false
`

// PauseImage is the sandbox image, imported with the others into
// containerd's root (-containerd-root); keep in
// sync with the lab (lab.PauseImage).
const PauseImage = "docker.io/vipcast/pause:lab"

// cniConfig is the pod network: a bridge with the node's pod range,
// masquerading traffic that leaves the cluster's pod ranges.
// cniBridge is the bridge of the node's pods.
const cniBridge = "cni0"

const cniConfig = `{
  "cniVersion": "1.0.0",
  "name": "lab",
  "plugins": [
    {"type": "bridge", "bridge": "` + cniBridge + `", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "%s"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`

// kubeletConfig: cgroupfs (no systemd in the VM), no swap check,
// anonymous read access for the API server's logs and exec, and none of
// the kubelet's periodic disk accounting: no eviction thresholds ("0%"
// drops a signal) and no local storage capacity isolation, so the
// eviction manager's 10-s synchronize returns at once and cAdvisor walks
// no container's files. On an emulated CPU those walks were a quarter of
// an idle kubelet's time; the lab's tests need neither. A container that
// exits is started again within a second, however often it did before
// (KubeletCrashLoopBackOffMax, beta and on in 1.37): the lab's tests stop
// a node's speaker dozens of times (POST /speaker), as a node's operator
// or a crash would, and its restarts must not back off for minutes.
//
// With cfg.clusterDNS, pods with the ClusterFirst DNS policy (the default)
// resolve through the cluster's DNS, in cluster.local.
func kubeletConfig(cfg *config) string {
	if cfg.clusterDNS == "" {
		return kubeletBase
	}
	return kubeletBase + fmt.Sprintf("clusterDNS: [%q]\nclusterDomain: cluster.local\n", cfg.clusterDNS)
}

const kubeletBase = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
failSwapOn: false
resolvConf: /etc/resolv.conf
serializeImagePulls: false
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%", imagefs.inodesFree: "0%"}
localStorageCapacityIsolation: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
shutdownGracePeriod: 0s
crashLoopBackOff: {maxContainerRestartPeriod: 1s}
`

// restartKubeProxy restarts kube-proxy; with mode set (and not its mode
// now), it moves it to that mode, cleaning up in between.
func restartKubeProxy(cfg *config, d *daemons, mode string) error {
	var between func() error
	if mode != "" && mode != cfg.proxyMode {
		switch mode {
		case "iptables", "nftables", "ipvs":
		default:
			return fmt.Errorf("mode %q: want iptables, nftables or ipvs", mode)
		}
		between = func() error {
			// From IPVS mode it fails to delete chains the other
			// tables still jump to (exit status 1, "encountered an error
			// while tearing down rules"); the next mode takes them over,
			// as on a real node where an operator goes on.
			if out, err := d.run(context.Background(), []string{binDir + "/kube-proxy", "--cleanup", "--v", "1"}); err != nil {
				fmt.Printf("kubenode: kube-proxy --cleanup: %v (going on); its errors:\n", err)
				for _, line := range strings.Split(string(out), "\n") {
					if strings.HasPrefix(line, "E") {
						fmt.Println(line)
					}
				}
			}
			cfg.proxyMode = mode
			return os.WriteFile("/etc/kubernetes/kube-proxy.yaml", []byte(kubeProxyConfig(cfg)), 0o644)
		}
	}
	return d.restart("kube-proxy", between)
}

// kubeProxyConfig is kube-proxy's configuration in the mode asked, with
// the settings docs/install.md prescribes.
func kubeProxyConfig(cfg *config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n")
	fmt.Fprintf(&b, "clientConnection: {kubeconfig: %s}\n", kubeconfig)
	fmt.Fprintf(&b, "hostnameOverride: %s\nbindAddress: %s\n", cfg.name, cfg.Addr.Addr())
	fmt.Fprintf(&b, "mode: %s\nclusterCIDR: %s\n", cfg.proxyMode, cfg.clusterCIDR)
	// Local traffic is what comes from this node's pods (their bridge),
	// not every pod address of the cluster (ClusterCIDR, the default):
	// the lab routes pod traffic to the other nodes unmasqueraded, so with
	// ClusterCIDR a pod's connection to another node's NodePort would be
	// short-circuited as the node's own. kind's CNI masquerades it, and
	// Kubernetes' e2e suite expects that connection to be external (its
	// externalTrafficPolicy=Local terminating-endpoints spec).
	fmt.Fprintf(&b, "detectLocalMode: BridgeInterface\ndetectLocal: {bridgeInterface: %s}\n", cniBridge)
	fmt.Fprintf(&b, "conntrack: {maxPerCore: 0}\n")
	if len(cfg.nodePortAddresses) > 0 {
		fmt.Fprintf(&b, "nodePortAddresses: [%s]\n", quoteList(cfg.nodePortAddresses))
	}
	if len(cfg.excludeCIDRs) > 0 {
		fmt.Fprintf(&b, "ipvs: {excludeCIDRs: [%s]}\n", quoteList(cfg.excludeCIDRs))
	}
	return b.String()
}

func quoteList(l []string) string {
	q := make([]string, len(l))
	for i, v := range l {
		q[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(q, ", ")
}

// waitFile waits until path exists.
func waitFile(ctx context.Context, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", path, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// daemons are the node's long-running processes.
type daemons struct {
	env []string
	mu  sync.Mutex
	// started: pid → name; argv: name → its command line, to start it
	// again; stopping: pid → closed once reap has seen it exit (a stop
	// asked for, which is not an error).
	started  map[int]string
	argv     map[string][]string
	stopping map[int]chan struct{}
	// execs are the commands POST /exec runs: their own Wait reaps them,
	// not reap.
	execs map[int]bool
	// speaker is the pid of the speaker POST /speaker signalled last.
	speaker int
}

func newDaemons(env []string) *daemons {
	return &daemons{env: env, started: map[int]string{}, argv: map[string][]string{}, stopping: map[int]chan struct{}{}, execs: map[int]bool{}}
}

// start runs a daemon with its output appended to /var/log/<name>.log and
// its error lines (klog's E and F lines, and any panic) on the console.
func (d *daemons) start(name, path string, args ...string) error {
	log, err := os.OpenFile("/var/log/"+name+".log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Env = d.env
	r, w := io.Pipe()
	cmd.Stdout, cmd.Stderr = w, w
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	d.started[cmd.Process.Pid] = name
	d.argv[name] = append([]string{path}, args...)
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			_, _ = fmt.Fprintln(log, line)
			if strings.HasPrefix(line, "E") || strings.HasPrefix(line, "F") || strings.HasPrefix(line, "panic") || strings.Contains(line, "level=error") {
				fmt.Printf("%s: %s\n", name, line)
			}
		}
	}()
	return nil
}

// reap waits for every child, the daemons and the orphans reparented to
// this subreaper, until ctx ends; a daemon that exits is an error.
//
// A child that POST /exec runs is left to its command's Wait: reap first
// looks at which child exited without collecting it (waitid WNOWAIT), and
// collects it only when it is not one of those (an /exec command that
// reap collected made its Wait fail with "no child processes").
func (d *daemons) reap(ctx context.Context) error {
	for ctx.Err() == nil {
		pid, err := waitablePid()
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("wait: %w", err)
		}
		d.mu.Lock()
		if d.execs[pid] {
			d.mu.Unlock()
			time.Sleep(10 * time.Millisecond) // its Wait collects it
			continue
		}
		var ws unix.WaitStatus
		if got, err := unix.Wait4(pid, &ws, unix.WNOHANG, nil); err != nil || got != pid {
			// Collected meanwhile by a Wait of its own.
			d.mu.Unlock()
			continue
		}
		name, ok := d.started[pid]
		stopped, asked := d.stopping[pid]
		delete(d.started, pid)
		delete(d.stopping, pid)
		d.mu.Unlock()
		switch {
		case asked:
			close(stopped)
		case ok:
			return fmt.Errorf("%s exited (status %d, signal %v): see /var/log/%s.log", name, ws.ExitStatus(), ws.Signal(), name)
		}
	}
	return nil
}

// restart stops the daemon name (SIGTERM, SIGKILL after 30 s), runs
// between (nil: nothing) and starts the daemon again with its command
// line, as a DaemonSet's rollout restarts a node's kube-proxy.
func (d *daemons) restart(name string, between func() error) error {
	d.mu.Lock()
	pid := 0
	for p, n := range d.started {
		if n == name {
			pid = p
		}
	}
	argv := d.argv[name]
	stopped := make(chan struct{})
	if pid != 0 {
		d.stopping[pid] = stopped
	}
	d.mu.Unlock()
	if pid == 0 {
		return fmt.Errorf("%s is not running", name)
	}
	_ = unix.Kill(pid, unix.SIGTERM)
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		_ = unix.Kill(pid, unix.SIGKILL)
		<-stopped
	}
	if between != nil {
		if err := between(); err != nil {
			return err
		}
	}
	return d.start(name, argv[0], argv[1:]...)
}

// execHandler runs the command in the request body (one argument per
// line) on the node, for at most 30 s, and returns its combined output.
func (d *daemons) execHandler(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4096))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	argv := strings.Split(strings.TrimSpace(string(body)), "\n")
	if len(argv) == 0 || argv[0] == "" {
		http.Error(w, "no command", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	out, err := d.run(ctx, argv)
	if err != nil {
		out = append(out, []byte("\n"+err.Error())...)
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write(out)
}

// run runs argv with the daemons' environment and returns its combined
// output. Its process is one of d.execs from its start until its Wait has
// collected it, so that reap leaves it alone: every command the agent runs
// goes through here, the daemons through start.
func (d *daemons) run(ctx context.Context, argv []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...) //nolint:gosec // the lab's own test agent
	cmd.Env = d.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	d.mu.Lock()
	err := cmd.Start()
	if err == nil {
		d.execs[cmd.Process.Pid] = true
	}
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	err = cmd.Wait()
	d.mu.Lock()
	delete(d.execs, cmd.Process.Pid)
	d.mu.Unlock()
	return out.Bytes(), err
}

// waitablePid blocks until a child has exited and returns its pid, without
// collecting it (waitid(P_ALL, WEXITED|WNOWAIT)).
func waitablePid() (int, error) {
	// siginfo_t: si_pid follows si_signo, si_errno, si_code and padding
	// on 64-bit Linux.
	var info [16]uint64
	_, _, errno := unix.Syscall6(unix.SYS_WAITID, unix.P_ALL, 0, uintptr(unsafe.Pointer(&info)), unix.WEXITED|unix.WNOWAIT, 0, 0) //nolint:gosec // G103: waitid fills info, a buffer of siginfo_t's size
	if errno != 0 {
		return 0, errno
	}
	return int(int32(info[2])), nil //nolint:gosec // si_pid is an int32
}

// speakerHandler signals the node's vipcast-speaker or waits for its
// restart (see serveControl).
func (d *daemons) speakerHandler(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	// The kubelet restarts an exited speaker within a second of noticing
	// (crashLoopBackOff.maxContainerRestartPeriod), but on an emulated
	// CPU busy with the held connections' traffic it noticed and started
	// the container 35 s and more after the exit.
	ctx, cancel := context.WithTimeout(r.Context(), 90*time.Second)
	defer cancel()
	var err error
	if q.Get("start") != "" {
		err = d.speakerStarted(ctx)
	} else {
		err = d.signalSpeaker(ctx, q.Get("signal"), q.Get("wait") != "")
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = fmt.Fprintln(w, "ok")
}

// signals are those POST /speaker sends.
var signals = map[string]unix.Signal{"TERM": unix.SIGTERM, "KILL": unix.SIGKILL, "STOP": unix.SIGSTOP, "CONT": unix.SIGCONT}

// signalSpeaker sends the speaker the signal named sig and, with wait,
// waits until it has exited.
func (d *daemons) signalSpeaker(ctx context.Context, sig string, wait bool) error {
	signal, ok := signals[sig]
	if !ok {
		return fmt.Errorf("signal %q: want TERM, KILL, STOP or CONT", sig)
	}
	pid, err := speakerPid()
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.speaker = pid
	d.mu.Unlock()
	if err := unix.Kill(pid, signal); err != nil {
		return fmt.Errorf("kill -%s %d: %w", sig, pid, err)
	}
	for wait {
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) || isZombie(pid) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the speaker (pid %d) did not exit after SIG%s", pid, sig)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// speakerStarted waits until a speaker runs that is not the one signalled
// last: the kubelet restarts the container of a speaker that exited.
func (d *daemons) speakerStarted(ctx context.Context) error {
	d.mu.Lock()
	old := d.speaker
	d.mu.Unlock()
	for {
		if pid, err := speakerPid(); err == nil && pid != old {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no new speaker runs (the last one was pid %d)", old)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// speakerPid finds the speaker's process: vipcast-speaker, not its init
// container (prepare-node), and not a zombie.
func speakerPid() (int, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + p.Name() + "/cmdline")
		if err != nil || len(cmdline) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if filepath.Base(argv[0]) == "vipcast-speaker" && !slices.Contains(argv, "prepare-node") && !isZombie(pid) {
			return pid, nil
		}
	}
	return 0, errors.New("no vipcast-speaker runs on this node")
}

// isZombie reports whether pid has exited and waits to be collected.
func isZombie(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	_, after, ok := strings.Cut(string(stat), ") ")
	return ok && strings.HasPrefix(after, "Z")
}
