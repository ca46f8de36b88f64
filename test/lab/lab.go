// Package lab builds the end-to-end topology that `make lab` shows and the
// end-to-end tests assert: a real cluster — etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler on the host, node VMs running
// Debian's kernel (test/vm) with containerd, a kubelet started with
// --cloud-provider=external and kube-proxy — with vipcast installed by
// `helm install` (see ClusterOptions), an FRR ToR (zebra + bgpd) in a
// network namespace whose kernel gets the ECMP routes, and a client
// namespace behind the ToR.
//
//	 client ns              ToR ns (FRR, AS 64500)                 VMs (AS 64501)
//	192.168.50.2 ── veth ── 192.168.50.1
//	                        10.0.0.1 on bridge "rack" ─┬─ tap ── node1 10.0.0.11  pods 10.244.1.0/24
//	                        relay → API server         └─ tap ── node2 10.0.0.12  pods 10.244.2.0/24
//
// Up needs root, qemu (installed by test/vm when missing), FRR and the
// cluster binaries (`make tools cluster-tools routers`). Everything it
// starts is stopped by the T's cleanups: the VMs, daemons, namespaces and
// files.
package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/vipcast/vipcast/test/controlplane"
	"github.com/vipcast/vipcast/test/harness"
	"github.com/vipcast/vipcast/test/lab/nodeapi"
	"github.com/vipcast/vipcast/test/netns"
	"github.com/vipcast/vipcast/test/routers"
	"github.com/vipcast/vipcast/test/vm"
)

// The lab's addresses and numbers.
const (
	ToRASN  = 64500
	NodeASN = 64501
	// Namespace and Service the demo creates.
	DemoNamespace = "demo"
	DemoService   = "web"
	// PoolName and PeerName are the demo's IPPool and BGPPeer.
	PoolName = "lab"
	PeerName = "tor"
	apiRelay = "6443"
	// MetricsPort is where each node's speaker serves /metrics, on the
	// node's address.
	MetricsPort = "7473"
)

var (
	torAddr    = netip.MustParseAddr("10.0.0.1")
	rackBits   = 24
	clientAddr = netip.MustParseAddr("192.168.50.2")
	clientGW   = netip.MustParseAddr("192.168.50.1")
	// PoolPrefix is the demo IPPool's range.
	PoolPrefix = netip.MustParsePrefix("10.100.0.0/28")
)

// Options configure a lab.
type Options struct {
	// Dir holds binaries and logs (consoles, routers); default: a
	// temporary directory of the T.
	Dir string
	// Logf shows progress; default the T's Logf.
	Logf func(format string, args ...any)
	// Nodes (default 2).
	Nodes int
	// HoldTime and KeepaliveTime of the BGP sessions (default 6s and 2s:
	// emulated VMs on two shared cores miss tighter keepalives).
	HoldTime, KeepaliveTime time.Duration
	// Password, when set, is the TCP MD5 password of the ToR sessions:
	// FRR's neighbors get it and the demo BGPPeer names the Secret
	// PasswordNamespace/PasswordSecret holding it, which the chart's
	// values name for the speakers.
	Password string
	// Resync, when set, is the speakers' --resync-period and
	// --dataplane-resync-period (default the chart's, 5m and 1m).
	Resync time.Duration
	// BFD, when set, runs FRR's bfdd with these timers on the ToR's
	// sessions; the demo BGPPeer asks for BFD too when PeerBFD is set, and
	// SetPeerBFD turns it on and off.
	BFD     *routers.BFD
	PeerBFD bool
	// Cluster configures the real cluster (kubelets, containerd,
	// kube-proxy, vipcast by helm install): see ClusterOptions.
	Cluster ClusterOptions
}

// DefaultBFD is the lab's BFD: FRR's default timers, 300 ms x 3. Emulated
// VMs on two shared cores keep them; they would not keep 100 ms x 3.
var DefaultBFD = routers.BFD{MinTx: 300 * time.Millisecond, MinRx: 300 * time.Millisecond, Multiplier: 3}

// PasswordNamespace and PasswordSecret name the demo's BGP password
// Secret, the one the speakers read (speaker.bgpPasswordSecrets.secrets,
// their --bgp-password-secrets).
const (
	PasswordNamespace = "vipcast-bgp-passwords" //nolint:gosec // G101: a namespace name, not a credential
	PasswordSecret    = "tor-md5"               //nolint:gosec // G101: a Secret's name, not a credential
)

// Lab is a running topology.
type Lab struct {
	Opts  Options
	CP    *controlplane.ControlPlane
	ToR   *routers.FRR
	TorNS *netns.NS
	// ClientNS is the client behind the ToR.
	ClientNS *netns.NS
	Nodes    []*Node

	t harness.T
	// binDir holds the binaries the lab built, kubectl-vipcast among them.
	binDir string
	// values counts the chart values files HelmValuesFile wrote.
	values int
	// registry is the lab's OCI registry on the host's loopback, which
	// the lab's releases are pushed to (startRegistry).
	registry string
	// spare are the real cluster's nodes booted but not joined yet
	// (ClusterOptions.Boot); JoinSpare has them join.
	spare []*Node
	boot  *kubeBoot
}

// Kubectl runs kubectl (from the tools cache) against the lab's API
// server, with the lab's kubectl-vipcast plugin on its PATH, and returns
// what it printed.
func (l *Lab) Kubectl(ctx context.Context, args ...string) (string, error) {
	c := exec.CommandContext(ctx, filepath.Join(controlplane.BinDir(), "kubectl"), args...)
	c.Env = l.toolEnv()
	out, err := c.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Node is one VM.
type Node struct {
	Name    string
	Addr    netip.Addr
	PodCIDR netip.Prefix
	Pods    []Pod
	Console string // console log file

	lab *Lab
	pid int // qemu
	// started is closed once qemu runs (pid is set), done once the VM
	// has ended.
	started, done chan struct{}
	err           error
}

// Pod is a backend serving HTTP and UDP on nodeapi.BackendPort: a pod of
// the demo Deployment.
type Pod struct {
	Name string
	Node string
	Addr netip.Addr
}

// Up builds the binaries, boots the cluster and installs vipcast (see
// ClusterOptions); ApplyDemo then creates the pool, peer and Service.
func Up(t harness.T, opts Options) *Lab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the lab needs root: network namespaces, tap devices and routes (run as root)")
	}
	opts = opts.withDefaults(t)
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	l := &Lab{Opts: opts, t: t}

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	l.upCluster(ctx, cancel)
	return l
}

// withDefaults fills in the defaults of the options left zero.
func (o Options) withDefaults(t harness.T) Options {
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	if o.Nodes == 0 {
		o.Nodes = 2
	}
	if o.HoldTime == 0 {
		o.HoldTime = 6 * time.Second
	}
	if o.KeepaliveTime == 0 {
		o.KeepaliveTime = o.HoldTime / 3
	}
	return o
}

// prepare builds the binaries (see build) and readies the VMs' kernel and
// qemu.
func (l *Lab) prepare(ctx context.Context) (map[string]string, *vm.Env) {
	t, logf := l.t, l.Opts.Logf
	t.Helper()
	logf("==> building vipcast-ccm, vipcast-speaker and the lab node agent (static, for the VMs)")
	bins, err := l.build(ctx)
	if err != nil {
		t.Fatal(err)
	}
	logf("==> preparing the VM kernel and qemu (cached after the first run)")
	venv, err := vm.Prepare(ctx, vm.Logf(logf))
	if err != nil {
		t.Fatalf("vm: %v", err)
	}
	return bins, venv
}

// startNetwork creates the ToR namespace with the rack bridge, routing
// with ECMP, the client namespace behind it and the ToR's relay to the API
// server.
func (l *Lab) startNetwork() {
	t := l.t
	t.Helper()
	l.Opts.Logf("==> network: ToR namespace with bridge rack %s/%d, client %s behind it", torAddr, rackBits, clientAddr)
	l.TorNS = netns.New(t, "tor")
	netns.Bridge(t, l.TorNS, "rack", fmt.Sprintf("%s/%d", torAddr, rackBits))
	sysctl(t, l.TorNS, "net.ipv4.ip_forward", "1")
	// ECMP by the 5-tuple, as data-centre ToRs do: one client's
	// connections spread over both nodes.
	sysctl(t, l.TorNS, "net.ipv4.fib_multipath_hash_policy", "1")
	l.ClientNS = netns.New(t, "client")
	netns.Veth(t, l.ClientNS, "eth0", clientAddr.String()+"/24", l.TorNS, "client", clientGW.String()+"/24")
	l.ClientNS.IP(t, "route", "add", "default", "via", clientGW.String())
	apiHost := strings.TrimPrefix(l.CP.Config.Host, "https://")
	netns.Forward(t, l.TorNS, net.JoinHostPort(torAddr.String(), apiRelay), apiHost)
}

// planNodes returns the Options.Nodes nodes, numbered from 1, with their
// addresses and pod ranges.
func (l *Lab) planNodes() []*Node {
	var nodes []*Node
	for i := 1; i <= l.Opts.Nodes; i++ {
		nodes = append(nodes, &Node{
			Name:    fmt.Sprintf("node%d", i),
			Addr:    netip.AddrFrom4([4]byte{10, 0, 0, byte(10 + i)}),
			PodCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24),
			lab:     l,
			done:    make(chan struct{}),
			started: make(chan struct{}),
		})
	}
	return nodes
}

// startToR starts FRR in the ToR namespace with every node as a neighbor.
func (l *Lab) startToR() {
	l.t.Helper()
	var neighbors []routers.FRRNeighbor
	for _, n := range append(slices.Clone(l.Nodes), l.spare...) {
		neighbors = append(neighbors, routers.FRRNeighbor{Address: n.Addr, ASN: NodeASN, KeepaliveTime: l.Opts.KeepaliveTime, HoldTime: l.Opts.HoldTime, Password: l.Opts.Password, BFD: l.Opts.BFD})
	}
	daemons := "zebra + bgpd"
	if l.Opts.BFD != nil {
		daemons += " + bfdd"
	}
	l.Opts.Logf("==> starting FRR (%s, AS %d) in the ToR namespace", daemons, ToRASN)
	l.ToR = routers.StartFRR(l.t, routers.FRRConfig{ASN: ToRASN, ListenAddress: torAddr, Netns: l.TorNS.Name, Zebra: true, Neighbors: neighbors})
}

// build compiles the binaries (once per process: vm.StaticBinary).
func (l *Lab) build(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	for name, pkg := range map[string]string{
		"vipcast-ccm":     "github.com/vipcast/vipcast/cmd/vipcast-ccm",
		"vipcast-speaker": "github.com/vipcast/vipcast/cmd/vipcast-speaker",
		"kubectl-vipcast": "github.com/vipcast/vipcast/cmd/kubectl-vipcast",
		// The real cluster's node agent and images.
		"kubenode":    "github.com/vipcast/vipcast/test/lab/kubenode",
		"lab-backend": "github.com/vipcast/vipcast/test/lab/images/backend",
		"pause":       "github.com/vipcast/vipcast/test/lab/images/pause",
	} {
		bin, err := vm.StaticBinary(ctx, pkg, name)
		if err != nil {
			return nil, err
		}
		out[name] = bin
	}
	return out, nil
}

// repoRoot is the directory of vipcast's go.mod.
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the vipcast module")
	}
	return filepath.Dir(mod), nil
}

func sysctl(t harness.T, ns *netns.NS, key, value string) {
	t.Helper()
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	argv := ns.Command("sh", "-c", "echo "+value+" > "+path)
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("sysctl %s in %s: %v: %s", key, ns.Name, err, out)
	}
}

// vmBase is what every node VM has: its console log, its NIC on tap, the
// modules and lifetime.
func (l *Lab) vmBase(n *Node, i int, tap string) vm.Options {
	n.Console = filepath.Join(l.Opts.Dir, n.Name+"-console.log")
	console, err := os.Create(n.Console)
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() {
		if err := console.Close(); err != nil {
			l.t.Logf("closing %s: %v", n.Console, err)
		}
	})
	var mu sync.Mutex
	return vm.Options{
		Modules: append(slices.Clone(vm.DefaultModules), "virtio_pci", "virtio_net", "bridge", "ipip"),
		Timeout: 1000 * time.Hour, // until the lab is torn down
		Netns:   l.TorNS.Name,
		QEMUArgs: []string{
			"-netdev", "tap,id=rack,ifname=" + tap + ",script=no,downscript=no",
			"-device", fmt.Sprintf("virtio-net-pci,netdev=rack,mac=52:54:00:00:00:%02x", 0x11+i),
		},
		Started: func(pid int) { n.pid = pid; close(n.started) },
		Logf: func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			_, _ = fmt.Fprintf(console, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
		},
	}
}

// dumpConsoles shows the end of each VM's console.
func (l *Lab) dumpConsoles() {
	for _, n := range l.Nodes {
		if n.Console == "" {
			continue
		}
		data, _ := os.ReadFile(n.Console)
		var lines []string
		for _, l := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
			// The kubelet's wait for its Node at boot: hundreds of
			// lines that say nothing about a failure.
			if !strings.Contains(l, "because node is not registered yet") && !strings.Contains(l, "Error getting the current node from lister") {
				lines = append(lines, l)
			}
		}
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		l.t.Logf("--- %s console (last %d lines of %s):\n%s", n.Name, len(lines), n.Console, strings.Join(lines, "\n"))
	}
}

// dumpNodes shows every pod with its node and restarts and, for each node
// that answers, the end of its speaker's logs, its IPVS table and
// vipcast's nftables table: what a failed test needs to say what the
// cluster and the dataplane did.
func (l *Lab) dumpNodes() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := l.Kubectl(ctx, "get", "pods", "-A", "-o", "wide")
	l.t.Logf("--- kubectl get pods -A -o wide (%v):\n%s", err, out)
	for _, n := range l.Nodes {
		for _, c := range []string{"tail -n 80 " + SpeakerLogFiles, "ipvsadm -Ln", "nft list table ip vipcast"} {
			out, err := n.Exec(ctx, "sh", "-c", c+" 2>&1")
			if err != nil {
				l.t.Logf("--- %s: %s: %v", n.Name, c, err)
				break
			}
			l.t.Logf("--- %s: %s:\n%s", n.Name, c, out)
		}
	}
}

// httpClient makes one new connection per request from inside ns, each
// request bounded by timeout.
func httpClient(ns *netns.NS, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout:   timeout,
		Transport: &http.Transport{DialContext: ns.DialContext, DisableKeepAlives: true},
	}
}

// controlTimeout bounds a read of a node's state and figures (its agent,
// its speaker's /metrics): an emulated node can take longer than 5 s to
// answer while its kubelet, kube-proxy and pods reconnect to an API server
// that was killed (TestCluster/outage).
const controlTimeout = 30 * time.Second

// State reads the node's IPVS table and VIPs.
func (n *Node) State(ctx context.Context) (nodeapi.State, error) {
	var st nodeapi.State
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.controlURL("/state"), nil)
	if err != nil {
		return st, err
	}
	resp, err := httpClient(n.lab.TorNS, controlTimeout).Do(req)
	if err != nil {
		return st, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return st, fmt.Errorf("%s: %s", resp.Status, b)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// Speaker signals the node's vipcast-speaker ("TERM", "STOP", "CONT",
// "KILL"; wait: until it exited) or, with "start", starts it again.
func (n *Node) Speaker(ctx context.Context, action string, waitExit bool) error {
	q := "signal=" + action
	if action == "start" {
		q = "start=1"
	}
	if waitExit {
		q += "&wait=1"
	}
	if _, err := n.post(ctx, "/speaker?"+q, nil, 100*time.Second); err != nil {
		return fmt.Errorf("speaker %s: %w", action, err)
	}
	return nil
}

// post sends a POST to the node agent's control server and returns the
// answer's body; an answer other than 200 is an error naming the node.
func (n *Node) post(ctx context.Context, path string, body io.Reader, timeout time.Duration) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, n.controlURL(path), body)
	if err != nil {
		return "", err
	}
	resp, err := httpClient(n.lab.TorNS, timeout).Do(req)
	if err != nil {
		return "", fmt.Errorf("%s on %s: %w", path, n.Name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("%s on %s: %s: %s", path, n.Name, resp.Status, strings.TrimSpace(string(b)))
	}
	return string(b), err
}

// Freeze stops the whole VM (qemu gets SIGSTOP): a node that hangs without
// closing anything. Thaw resumes it.
func (n *Node) Freeze() error { return syscall.Kill(n.pid, syscall.SIGSTOP) }

// Thaw resumes a frozen VM.
func (n *Node) Thaw() error { return syscall.Kill(n.pid, syscall.SIGCONT) }

func (n *Node) controlURL(path string) string {
	return "http://" + net.JoinHostPort(n.Addr.String(), nodeapi.Port) + path
}

// Pods returns every pod of every node.
func (l *Lab) Pods() []Pod {
	var out []Pod
	for _, n := range l.Nodes {
		out = append(out, n.Pods...)
	}
	return out
}

// Get sends one HTTP request from the client namespace to addr (VIP:port)
// on a new connection and returns the answer's body.
func (l *Lab) Get(ctx context.Context, addr netip.AddrPort) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+"/", nil)
	if err != nil {
		return "", err
	}
	resp, err := httpClient(l.ClientNS, 5*time.Second).Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b)), err
}

// Routes returns the ToR kernel's next hops for prefix (none: no route).
func (l *Lab) Routes(prefix netip.Prefix) ([]netip.Addr, error) {
	routes, err := l.ToR.KernelRoutes(routers.IPv4)
	if err != nil {
		return nil, err
	}
	return slices.SortedFunc(slices.Values(routes[prefix]), netip.Addr.Compare), nil
}

// ApplyDemo creates the demo IPPool and BGPPeer (`kubectl apply -f`, as
// docs/getting-started.md says), the demo namespace, and the Deployment of
// backends behind the LoadBalancer Service demo/web; it returns once the
// backends are ready.
func (l *Lab) ApplyDemo(ctx context.Context) error {
	pool := fmt.Sprintf(`apiVersion: vipcast.io/v1alpha1
kind: IPPool
metadata:
  name: %s
spec:
  addresses: [%q]
  avoidBuggyIPs: true
`, PoolName, PoolPrefix)
	if l.Opts.Password != "" {
		if err := l.passwordSecret(ctx); err != nil {
			return err
		}
	}
	if err := l.applyPeer(ctx, l.Opts.PeerBFD, pool); err != nil {
		return err
	}
	if _, err := l.CP.Client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: DemoNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: DemoService, Namespace: DemoNamespace},
		Spec: v1.ServiceSpec{
			Type:     v1.ServiceTypeLoadBalancer,
			Selector: map[string]string{"app": DemoService},
			Ports:    []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(nodeapi.BackendPort)}},
		},
	}
	if _, err := l.CP.Client.CoreV1().Services(DemoNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return err
	}
	return l.applyBackends(ctx)
}

// applyPeer applies the demo BGPPeer, asking for BFD with Options.BFD's
// timers when bfd is set, together with the documents of more (an
// IPPool), with `kubectl apply -f`.
func (l *Lab) applyPeer(ctx context.Context, bfd bool, more ...string) error {
	peer := fmt.Sprintf(`apiVersion: vipcast.io/v1alpha1
kind: BGPPeer
metadata:
  name: %s
spec:
  peerAddress: %s
  peerASN: %d
  localASN: %d
  holdTime: %s
  keepaliveTime: %s
`, PeerName, torAddr, ToRASN, NodeASN, l.Opts.HoldTime, l.Opts.KeepaliveTime)
	if l.Opts.Password != "" {
		peer += fmt.Sprintf("  passwordSecretRef: {namespace: %s, name: %s}\n", PasswordNamespace, PasswordSecret)
	}
	if b := l.Opts.BFD; bfd && b != nil {
		peer += fmt.Sprintf("  bfd: {minTx: %s, minRx: %s, multiplier: %d}\n", b.MinTx, b.MinRx, b.Multiplier)
	}
	file := filepath.Join(l.Opts.Dir, "pool-and-peer.yaml")
	if err := os.WriteFile(file, []byte(strings.Join(append(more, peer), "---\n")), 0o644); err != nil {
		return err
	}
	_, err := l.Kubectl(ctx, "apply", "-f", file)
	return err
}

// SetPeerBFD turns BFD on (with Options.BFD's timers) or off in the demo
// BGPPeer, as its operator would with kubectl apply.
func (l *Lab) SetPeerBFD(ctx context.Context, on bool) error {
	if l.Opts.BFD == nil {
		return fmt.Errorf("the lab's ToR runs no BFD (Options.BFD)")
	}
	return l.applyPeer(ctx, on)
}

// passwordSecret creates the Secret holding the ToR sessions' MD5
// password, in its own namespace.
func (l *Lab) passwordSecret(ctx context.Context) error {
	core := l.CP.Client.CoreV1()
	if _, err := core.Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: PasswordNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	_, err := core.Secrets(PasswordNamespace).Create(ctx, &v1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: PasswordSecret, Namespace: PasswordNamespace},
		Data:       map[string][]byte{"password": []byte(l.Opts.Password)},
	}, metav1.CreateOptions{})
	return err
}

// HeldService is the LoadBalancer Service without a selector whose
// EndpointSlice the tests write (SetEndpoints) over the demo Deployment's
// pods, with ports 80/TCP and 53/UDP to the pods' HTTP and UDP echo:
// endpoints terminating while their pods serve on, then ready again, which
// no controller of a Deployment gives on cue. Its EndpointSlice carries
// the managed-by label of a controller of the lab's own, as one a user's
// controller writes would.
const HeldService = "held"

// ApplyHeld creates HeldService (Cluster policy) with endpoints ready and
// returns its VIP once published.
func (l *Lab) ApplyHeld(ctx context.Context, ready []Pod) (netip.Addr, error) {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: HeldService, Namespace: DemoNamespace},
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeLoadBalancer,
			Ports: []v1.ServicePort{
				{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(nodeapi.BackendPort)},
				{Name: "udp", Port: 53, Protocol: v1.ProtocolUDP, TargetPort: intstr.FromInt32(nodeapi.BackendPort)},
			},
		},
	}
	if _, err := l.CP.Client.CoreV1().Services(DemoNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return netip.Addr{}, err
	}
	if err := l.SetEndpoints(ctx, ready, nil); err != nil {
		return netip.Addr{}, err
	}
	return l.WaitServiceVIP(ctx, HeldService, time.Minute)
}

// DeleteHeld deletes HeldService and its EndpointSlice and returns once
// the Service is gone — vipcast-ccm's finalizer holds it until its VIP is
// released, and a HeldService created meanwhile would be refused ("object
// is being deleted") — and the ToR routes none of its VIPs.
func (l *Lab) DeleteHeld(ctx context.Context) error {
	services := l.CP.Client.CoreV1().Services(DemoNamespace)
	var vips []netip.Addr
	if svc, err := services.Get(ctx, HeldService, metav1.GetOptions{}); err == nil {
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(in.IP); err == nil {
				vips = append(vips, a)
			}
		}
	}
	err := services.Delete(ctx, HeldService, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	err = l.CP.Client.DiscoveryV1().EndpointSlices(DemoNamespace).Delete(ctx, HeldService+"-lab", metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := services.Get(ctx, HeldService, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		return fmt.Errorf("service %s/%s still there 2m after its deletion: %w", DemoNamespace, HeldService, err)
	}
	// The next held Service gets the same VIP: until the ToR has dropped
	// this one's route, a wait for the next one's route would see this
	// one's, over nodes that no longer serve it.
	for _, vip := range vips {
		err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
			routes, err := l.Routes(netip.PrefixFrom(vip, vip.BitLen()))
			return err == nil && len(routes) == 0, nil
		})
		if err != nil {
			return fmt.Errorf("the ToR still routes %s 2m after service %s/%s was deleted: %w", vip, DemoNamespace, HeldService, err)
		}
	}
	return nil
}

// SetEndpoints writes HeldService's EndpointSlice, as the endpoint
// controller would for a Deployment: ready pods, plus terminating ones
// (serving: their pods live on).
func (l *Lab) SetEndpoints(ctx context.Context, ready, terminating []Pod) error {
	return l.SetEndpointsNotReady(ctx, ready, terminating, nil)
}

// SetEndpointsNotReady is SetEndpoints with notReady pods too: neither
// ready nor serving nor terminating, as for a pod whose readiness probe
// fails.
func (l *Lab) SetEndpointsNotReady(ctx context.Context, ready, terminating, notReady []Pod) error {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:      HeldService + "-lab",
			Namespace: DemoNamespace,
			Labels:    map[string]string{discoveryv1.LabelServiceName: HeldService, discoveryv1.LabelManagedBy: "vipcast-lab"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Port: ptr.To(int32(nodeapi.BackendPort)), Protocol: ptr.To(v1.ProtocolTCP)},
			{Name: ptr.To("udp"), Port: ptr.To(int32(nodeapi.BackendPort)), Protocol: ptr.To(v1.ProtocolUDP)},
		},
	}
	add := func(p Pod, isReady bool) {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{p.Addr.String()},
			NodeName:  ptr.To(p.Node),
			TargetRef: &v1.ObjectReference{Kind: "Pod", Namespace: DemoNamespace, Name: p.Name},
			Conditions: discoveryv1.EndpointConditions{
				Ready: ptr.To(isReady), Serving: ptr.To(true), Terminating: ptr.To(!isReady),
			},
		})
	}
	for _, p := range ready {
		add(p, true)
	}
	for _, p := range terminating {
		add(p, false)
	}
	for _, p := range notReady {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{p.Addr.String()},
			NodeName:   ptr.To(p.Node),
			TargetRef:  &v1.ObjectReference{Kind: "Pod", Namespace: DemoNamespace, Name: p.Name},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)},
		})
	}
	c := l.CP.Client.DiscoveryV1().EndpointSlices(DemoNamespace)
	old, err := c.Get(ctx, slice.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.Create(ctx, slice, metav1.CreateOptions{})
	case err == nil:
		slice.ResourceVersion = old.ResourceVersion
		_, err = c.Update(ctx, slice, metav1.UpdateOptions{})
	}
	return err
}

// WaitVIP waits until the demo Service has a VIP in its status.
func (l *Lab) WaitVIP(ctx context.Context, timeout time.Duration) (netip.Addr, error) {
	return l.WaitServiceVIP(ctx, DemoService, timeout)
}

// WaitServiceVIP waits until the Service name of the demo namespace has a
// VIP in its status.
func (l *Lab) WaitServiceVIP(ctx context.Context, name string, timeout time.Duration) (netip.Addr, error) {
	var vip netip.Addr
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		s, err := l.CP.Client.CoreV1().Services(DemoNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // an error would end the poll: retry until the timeout
		}
		for _, in := range s.Status.LoadBalancer.Ingress {
			if a, err := netip.ParseAddr(in.IP); err == nil {
				vip = a
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return vip, fmt.Errorf("no VIP in the status of %s/%s after %v (the CCM's log: Node.Logs): %w", DemoNamespace, name, timeout, err)
	}
	return vip, nil
}

// WaitRoute polls the ToR's kernel until the route to vip has exactly the
// next hops want (none: no route) and returns how long that took.
func (l *Lab) WaitRoute(ctx context.Context, vip netip.Addr, timeout time.Duration, want ...netip.Addr) (time.Duration, error) {
	slices.SortFunc(want, netip.Addr.Compare)
	prefix := netip.PrefixFrom(vip, 32)
	start := time.Now()
	var got []netip.Addr
	for time.Since(start) < timeout {
		var err error
		if got, err = l.Routes(prefix); err != nil {
			return 0, err
		}
		if slices.Equal(got, want) {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("ToR route to %s: next hops %v after %v, want %v", prefix, got, timeout, want)
}

// Addrs returns the nodes' addresses.
func (l *Lab) Addrs(nodes ...*Node) []netip.Addr {
	var out []netip.Addr
	for _, n := range nodes {
		out = append(out, n.Addr)
	}
	return out
}
