// Command vipcast-speaker runs on every node (a DaemonSet): it programs the
// node's IPVS virtual servers for the VIPs of LoadBalancer Services,
// announces the VIPs this node can serve to the BGP routers selected for
// it, and withdraws them when it no longer can. On SIGTERM it withdraws
// everything, waits for the fabric to converge, and closes its sessions;
// the IPVS state stays for the next speaker to take over.
//
// "vipcast-speaker prepare-node" does only the one thing that needs
// privilege and exits: it loads ip_vs (through the kernel's module
// autoloading) and sets net.ipv4.vs.conntrack=1. The chart runs it as a
// privileged init container, so that the long-running speaker, which
// parses BGP from the routers, runs with NET_ADMIN alone.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/apirequests"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/ipvs"
	"github.com/vipcast/vipcast/lbclass"
	"github.com/vipcast/vipcast/speaker"
)

// flags are the command line of vipcast-speaker.
type flags struct {
	kubeconfig       string
	nodeName         string
	routerID         string
	metricsAddr      string
	metricsSources   []netip.Prefix
	clusterCIDRs     []netip.Prefix
	convergenceDelay time.Duration
	resync           time.Duration
	statusInterval   time.Duration
	outageSettle     time.Duration
	prefixWarning    int
	qps              float64
	burst            int
	ipvs             bool
	ipvsLink         string
	dataplaneResync  time.Duration
	dataplaneProbe   time.Duration
	passwordSecrets  []types.NamespacedName
	prefixRestart    time.Duration
	class            string
	classless        bool
	classes          lbclass.Selector
	tunnelPrefixFlag string
	speakerService   string // --speaker-service, namespace/name
	tunnelPrefix     netip.Prefix
	tunnelPrefix6    netip.Prefix
	tunnelMTU        int
	connSyncLink     string
	connSyncID       int
	connSyncVia      string
	connSyncPort     int
	connSyncKeyDir   string
	owner            *ownerDaemonSet
}

func parseFlags(args []string) (*flags, error) {
	f := &flags{}
	fs := flag.NewFlagSet("vipcast-speaker", flag.ContinueOnError)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "Path to a kubeconfig; empty uses the in-cluster configuration.")
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "Name of the Node this speaker runs on (default $NODE_NAME).")
	fs.StringVar(&f.routerID, "router-id", "", "BGP router ID (an IPv4 address); default: the Node's first IPv4 InternalIP, else derived from the node name.")
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", defaultMetricsAddr, "host:port serving /metrics, /healthz and /readyz (plain HTTP); \"0\" turns it off. The host must be a specific address, such as the node's ($(NODE_IP) from status.hostIP): every address (\":7473\", \"0.0.0.0\", \"[::]\") would include the VIPs.")
	fs.Func("cluster-cidr", "Comma-separated prefixes of the pods' addresses, both families (kube-proxy's --cluster-cidr, such as 10.244.0.0/16,fd00:10:244::/56): a pod's connection to a one-tier VIP under externalTrafficPolicy Local goes to any of the Service's endpoints, as kube-proxy sends in-cluster clients, even from a node without one. Empty: the pods' connections go through IPVS like the fabric's, and on a node without a local endpoint they are refused. The node's own connections go to any endpoint either way.", func(v string) (err error) {
		f.clusterCIDRs, err = parseSources(v)
		return err
	})
	fs.Func("metrics-allowed-sources", "Comma-separated prefixes (such as the pod CIDR Prometheus scrapes from) that may reach --metrics-bind-address besides the node's own addresses; with IPVS, the host guard drops (and counts) the rest. 0.0.0.0/0 (::/0) lets every source of the family in. Empty: the node itself only (the kubelet's probes).", func(v string) (err error) {
		f.metricsSources, err = parseSources(v)
		return err
	})
	fs.DurationVar(&f.convergenceDelay, "convergence-delay", 3*time.Second, "How long routers take to converge: on SIGTERM, how long to keep serving after withdrawing the routes, before the sessions close; under externalTrafficPolicy Local, how long a node whose endpoints all terminate keeps announcing after another node has ready ones.")
	fs.Func("bgp-password-secrets", "Comma-separated namespace/name of the Secrets BGPPeers may name for TCP MD5 passwords (spec.passwordSecretRef) and BFD keys (spec.bfd.authentication.secretRef), such as vipcast-bgp-passwords/tor-a-md5; the speaker watches each of them by name and reads no other Secret. Empty: none (a BGPPeer naming a Secret is refused).", func(v string) (err error) {
		f.passwordSecrets, err = parseSecretNames(v)
		return err
	})
	fs.Func("bgp-password-namespaces", "Removed: use --bgp-password-secrets, which names each Secret.", func(string) error {
		return errors.New("this flag was removed: name each Secret instead with --bgp-password-secrets=<namespace>/<name>,..., such as --bgp-password-secrets=vipcast-bgp-passwords/tor-a-md5 (chart value speaker.bgpPasswordSecrets.secrets); the speaker no longer reads every Secret of a namespace")
	})
	fs.BoolVar(&f.ipvs, "ipvs", true, "Program IPVS virtual servers for the VIPs (needs NET_ADMIN and the ip_vs modules); false only announces routes.")
	fs.StringVar(&f.ipvsLink, "ipvs-link", ipvs.DefaultLinkName, "Dummy link that carries the VIPs (created if missing).")
	fs.DurationVar(&f.prefixRestart, "bgp-prefix-limit-restart", bgp.DefaultPrefixLimitRestart, "How long a BGP session stays down after the router sent more prefixes than its limit; doubled for each consecutive time, up to 30m.")
	fs.DurationVar(&f.dataplaneResync, "dataplane-resync-period", time.Minute, "How often the whole IPVS table is compared with the desired state, repairing drift.")
	fs.DurationVar(&f.dataplaneProbe, "dataplane-probe-period", 2*time.Second, "How often the speaker asks the kernel for one of its virtual servers (one request): when it is gone, another program flushed IPVS (kube-proxy does when it starts in nftables mode) and the whole table is restored at once.")
	fs.StringVar(&f.tunnelPrefixFlag, "tunnel-prefix", "", "Turns on the two-tier dataplane (established flows survive ECMP changes, the pods see the client): an IPv4 prefix, optionally followed by a comma and an IPv6 prefix, such as 100.127.0.0/16,fd00:7f::/64. Each node's tunnel address is the IPv4 prefix with the host bits of the node's IPv4 InternalIP, and its IPv6 tunnel address the IPv6 prefix with those of its IPv6 InternalIP. IPv6 VIPs go through the two tiers to the IPv6 tunnel addresses; without an IPv6 prefix, only when --conn-sync-interface is none (6in4 to the IPv4 ones). Every speaker of the cluster must have the same value. Empty keeps one tier.")
	fs.StringVar(&f.connSyncLink, "conn-sync-interface", connSyncAuto, "With --tunnel-prefix: the link on which the kernel's IPVS sync daemons share each node's tier-1 connections with the other nodes (multicast 224.0.0.81, UDP 8848, not routed), so that a flow ECMP moves after the nodes' endpoints changed still reaches its pod. \""+connSyncAuto+"\" is the link holding the node's InternalIP; \""+connSyncOff+"\" turns it off. Without an IPv6 tunnel prefix, sync keeps IPv6 VIPs on one tier (the kernel does not sync their 6in4 connections).")
	fs.StringVar(&f.connSyncVia, "conn-sync-transport", connSyncMulticast, "How the IPVS sync daemons' messages reach the other nodes: \""+connSyncMulticast+"\" on the link --conn-sync-interface names (the nodes of one L2 segment), or \""+connSyncRelay+"\": the daemons run on a veth pair of the node's own (vcsync0/vcsync1) and the speaker passes their messages by unicast UDP (--conn-sync-relay-port) to every other node's InternalIP, for nodes on different subnets (a rack each, a /31 to the ToR each). With the relay, --conn-sync-interface is auto or none.")
	fs.StringVar(&f.connSyncKeyDir, "conn-sync-key-dir", "", "With --conn-sync-transport=relay: a directory of keys, one file per key named by its ID (1 to 255, at least 32 bytes each; a mounted Secret), that the relays sign their datagrams with (the highest ID) and check the other nodes' with (any of them). Read again every 10 s: add a key of a higher ID to rotate, remove the old one once every node has the new. Empty: datagrams go unsigned and the relay trusts the source address alone.")
	fs.IntVar(&f.connSyncPort, "conn-sync-relay-port", ipvs.DefaultSyncRelayPort, "With --conn-sync-transport=relay: the UDP port the relays use on every node's InternalIP. Every speaker of the cluster must have the same value.")
	fs.IntVar(&f.connSyncID, "conn-sync-id", defaultConnSyncID, "The IPVS sync ID (0 to 255) of --conn-sync-interface: a node takes only messages with its own ID. Every speaker of the cluster must have the same value; another cluster (or keepalived pair) on the same link needs another one.")
	fs.IntVar(&f.tunnelMTU, "tunnel-mtu", 0, "The fabric's MTU, for the two-tier dataplane's MSS clamp (MTU less 60; for IPv6 VIPs less 100, or 80 through 6in4); 0 uses the MTU of the link of the node's default route.")
	fs.Func("owner-daemonset", "namespace/name of the DaemonSet running this speaker (the chart sets it). At shutdown the speaker reads it: when it is gone or being deleted, or the API server refuses the speaker's credentials (helm uninstall), the speaker removes its virtual servers, VIPs, link and nftables tables from the node; otherwise (an upgrade, a restart, an API server outage) it leaves them for the next speaker. Empty: always leave them.", func(v string) (err error) {
		f.owner, err = parseOwnerDaemonSet(v)
		return err
	})
	fs.StringVar(&f.speakerService, "speaker-service", "", "With --tunnel-prefix: namespace/name of a headless Service that selects the speakers' pods (the chart makes one). Tier 1 sends new flows only to nodes whose speaker is a ready endpoint of it, so a node without a working speaker (excluded by the DaemonSet's nodeSelector, crash-looping, lacking the tunnel modules) gets none; when no such node hosts an endpoint, to the others rather than none. Empty: to every node with a tunnel address.")
	fs.StringVar(&f.class, lbclass.FlagClass, "", "The spec.loadBalancerClass of the Services vipcast serves, such as vipcast.io/bgp; empty serves no class. Must be the CCM's value.")
	fs.BoolVar(&f.classless, lbclass.FlagClassless, true, "Also serve Services without a spec.loadBalancerClass. Default: true without --"+lbclass.FlagClass+", false with it. Must be the CCM's value.")
	apiFlags(fs, f)
	klog.InitFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	var err error
	if f.classes, err = classesFrom(fs, f); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: vipcast-speaker takes flags only (or the subcommand %s, as the first argument)", fs.Args(), ipvs.PrepareNodeCommand)
	}
	if err := f.check(); err != nil {
		return nil, err
	}
	return f, nil
}

// apiFlags registers the flags of what the speaker asks of the API server
// and writes to it.
func apiFlags(fs *flag.FlagSet, f *flags) {
	fs.DurationVar(&f.resync, "resync-period", 5*time.Minute, "How often the whole configuration is recomputed from the informers' caches.")
	fs.IntVar(&f.prefixWarning, "announced-prefixes-warning", 5000, "Warn (a PrefixCountHigh Warning Event on the Node) when the node announces more prefixes than this: routers hold a bounded number of routes and ECMP groups. 0 never warns.")
	fs.DurationVar(&f.statusInterval, "status-interval", speaker.DefaultStatusInterval, "How often, at most, the node's SpeakerStatus is written for a change of its counts (with up to 20% jitter); a change of a BGP session or a kernel refusal is written at once. Each write is one small patch: 5,000 nodes at 30s write about 170 a second.")
	fs.DurationVar(&f.outageSettle, "outage-settle", speaker.DefaultOutageSettle, "After an API-server outage, how long endpoints that were ready when it began stay ready for the speaker, short of terminating or going away, while kube-controller-manager, which found every node's lease stale, marks their pods not ready until the kubelets report again. 0 reads the EndpointSlices as they come.")
	fs.Float64Var(&f.qps, "kube-api-qps", 50, "Queries per second to the API server.")
	fs.IntVar(&f.burst, "kube-api-burst", 100, "Burst of queries to the API server.")
}

// check refuses flag values the speaker cannot run with, naming the flag
// and the fix.
func (f *flags) check() error {
	switch {
	case f.nodeName == "":
		return errors.New("--node-name is empty: pass --node-name or set NODE_NAME (in a DaemonSet, from the downward API spec.nodeName)")
	case f.convergenceDelay < 0:
		return fmt.Errorf("--convergence-delay=%v is negative: use 0s or more, such as 3s", f.convergenceDelay)
	case f.prefixWarning < 0:
		return fmt.Errorf("--announced-prefixes-warning=%d is negative: use 0 (never warn) or a count of prefixes, such as 5000", f.prefixWarning)
	case f.outageSettle < 0:
		return fmt.Errorf("--outage-settle=%v is negative: use 0s (off) or more, such as 2m", f.outageSettle)
	case f.statusInterval < time.Second:
		return fmt.Errorf("--status-interval=%v is too short: use 1s or more, such as 30s", f.statusInterval)
	case f.resync < time.Second:
		return fmt.Errorf("--resync-period=%v is too short: use 1s or more, such as 5m", f.resync)
	case f.dataplaneResync < time.Second:
		return fmt.Errorf("--dataplane-resync-period=%v is too short: use 1s or more, such as 1m", f.dataplaneResync)
	case f.dataplaneProbe < 100*time.Millisecond:
		return fmt.Errorf("--dataplane-probe-period=%v is too short: use 100ms or more, such as 2s", f.dataplaneProbe)
	case f.prefixRestart < time.Second:
		return fmt.Errorf("--bgp-prefix-limit-restart=%v is too short: use 1s or more, such as 1m", f.prefixRestart)
	case f.ipvs && (f.ipvsLink == "" || len(f.ipvsLink) > 15 || strings.ContainsAny(f.ipvsLink, "/ \t")):
		return fmt.Errorf("--ipvs-link=%q is not a valid link name: use 1-15 characters without '/' or spaces, such as %s", f.ipvsLink, ipvs.DefaultLinkName)
	case f.qps <= 0 || f.burst <= 0:
		return fmt.Errorf("--kube-api-qps=%v and --kube-api-burst=%d must be positive", f.qps, f.burst)
	}
	if err := checkMetricsAddr(f.metricsAddr); err != nil {
		return err
	}
	if err := f.checkTunnel(); err != nil {
		return err
	}
	if f.routerID != "" {
		if a, err := netip.ParseAddr(f.routerID); err != nil || !a.Is4() {
			return fmt.Errorf("--router-id=%q is not an IPv4 address: use a dotted quad such as 10.0.0.1 (BGP router IDs are 32-bit)", f.routerID)
		}
	}
	return nil
}

// parseSecretNames parses --bgp-password-secrets: comma-separated
// namespace/name, blanks ignored, each named once.
func parseSecretNames(v string) ([]types.NamespacedName, error) {
	var out []types.NamespacedName
	seen := map[types.NamespacedName]bool{}
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		ns, name, ok := strings.Cut(e, "/")
		if !ok || strings.Contains(name, "/") {
			return nil, fmt.Errorf("%q is not namespace/name: name each Secret with its namespace, such as vipcast-bgp-passwords/tor-a-md5", e)
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("%q: %q is not a namespace name (%s): use lowercase letters, digits and '-', such as vipcast-bgp-passwords/tor-a-md5", e, ns, strings.Join(errs, "; "))
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, fmt.Errorf("%q: %q is not a Secret name (%s): use lowercase letters, digits, '-' and '.', such as vipcast-bgp-passwords/tor-a-md5", e, name, strings.Join(errs, "; "))
		}
		k := types.NamespacedName{Namespace: ns, Name: name}
		if seen[k] {
			return nil, fmt.Errorf("%s is named twice: name each Secret once", k)
		}
		seen[k] = true
		out = append(out, k)
	}
	return out, nil
}

// parseSources parses a comma-separated list of prefixes
// (--metrics-allowed-sources, --cluster-cidr).
func parseSources(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a prefix: write it as address/length, such as 10.244.0.0/16 or 192.0.2.7/32", f)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("%q has host bits set: write %v", f, p.Masked())
		}
		out = append(out, p)
	}
	return out, nil
}

// hostGuard is the dataplane's host guard for the metrics listener.
func (f *flags) hostGuard() ipvs.HostGuard {
	g := ipvs.HostGuard{MetricsSources: f.metricsSources}
	host, port, err := net.SplitHostPort(f.metricsAddr)
	if err != nil {
		return g // "0": no listener
	}
	a, err1 := netip.ParseAddr(host)
	p, err2 := strconv.ParseUint(port, 10, 16)
	if err1 == nil && err2 == nil {
		g.Metrics = netip.AddrPortFrom(a, uint16(p))
	}
	return g
}

// defaultMetricsAddr serves the metrics on loopback only: the chart passes
// the node's address.
const defaultMetricsAddr = "127.0.0.1:7473"

// checkMetricsAddr refuses a metrics address without host or with an
// unspecified one: it would serve the unauthenticated endpoints on every
// address of the node, the VIPs included. "0" (off) is fine.
func checkMetricsAddr(addr string) error {
	if addr == "0" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--metrics-bind-address=%q is not host:port: use the node's address, such as 10.0.0.5:7473 (in a DaemonSet [$(NODE_IP)]:7473 with NODE_IP from status.hostIP), or 0 to turn it off", addr)
	}
	if a, err := netip.ParseAddr(host); host == "" || (err == nil && a.Unmap().IsUnspecified()) {
		return fmt.Errorf("--metrics-bind-address=%q listens on every address of the node, its VIPs included: "+
			"use the node's address, such as 10.0.0.5:%s (in a DaemonSet [$(NODE_IP)]:%s with NODE_IP from status.hostIP), %s, or 0 to turn it off",
			addr, port, port, defaultMetricsAddr)
	}
	return nil
}

// classesFrom builds the class settings from the parsed flags:
// --serve-classless-services counts only when given (its default depends on
// --load-balancer-class).
func classesFrom(fs *flag.FlagSet, f *flags) (lbclass.Selector, error) {
	var classless *bool
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == lbclass.FlagClassless {
			classless = &f.classless
		}
	})
	sel, err := lbclass.New(f.class, classless)
	if err != nil {
		return sel, fmt.Errorf("class flags: %w", err)
	}
	return sel, nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == ipvs.PrepareNodeCommand {
		os.Exit(prepareNode(os.Args[2:]))
	}
	f, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "vipcast-speaker:", err)
		os.Exit(2)
	}
	if err := run(f); err != nil {
		klog.ErrorS(err, "vipcast-speaker failed")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// prepareNode runs the prepare-node subcommand and returns the exit code:
// 0 once the node is prepared, 1 when it cannot be, 2 for a bad command line.
func prepareNode(args []string) int {
	fs := flag.NewFlagSet("vipcast-speaker "+ipvs.PrepareNodeCommand, flag.ContinueOnError)
	tunnel := fs.Bool("tunnel", false, "Also prepare the two-tier dataplane (--tunnel-prefix): load ipip, create the vcloop0/vcloop1 loop, set sloppy_tcp/sloppy_sctp and the loop's and tunl0's reverse-path filtering.")
	relay := fs.Bool("conn-sync-relay", false, "Also prepare the connection sync relay (--conn-sync-transport=relay): create the vcsync0/vcsync1 veth pair with its addresses, accept_local and reverse-path filtering.")
	fs.Usage = func() {
		_, _ = fmt.Fprintf(fs.Output(), "Usage: vipcast-speaker %s [--tunnel] [--conn-sync-relay]\n\nLoads the ip_vs module (kernel autoloading) and sets net.ipv4.vs.conntrack=1,\nthen exits. Needs write access to /proc/sys: run it in a privileged init container.\n", ipvs.PrepareNodeCommand)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "vipcast-speaker %s: unexpected arguments %q: it takes none\n", ipvs.PrepareNodeCommand, fs.Args())
		return 2
	}
	if err := ipvs.PrepareNode(); err != nil {
		fmt.Fprintf(os.Stderr, "vipcast-speaker %s: %v\n", ipvs.PrepareNodeCommand, err)
		return 1
	}
	fmt.Printf("vipcast-speaker %s: ip_vs is loaded and net.ipv4.vs.conntrack=1\n", ipvs.PrepareNodeCommand)
	if *tunnel {
		no6, err := ipvs.PrepareTunnel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "vipcast-speaker %s --tunnel: %v\n", ipvs.PrepareNodeCommand, err)
			return 1
		}
		if no6 != nil {
			fmt.Printf("vipcast-speaker %s --tunnel: IPv6 VIPs will keep one tier: %v\n", ipvs.PrepareNodeCommand, no6)
		}
		fmt.Printf("vipcast-speaker %s: the two-tier dataplane's links and sysctls are ready\n", ipvs.PrepareNodeCommand)
	}
	if *relay {
		if err := ipvs.PrepareSyncRelay(); err != nil {
			fmt.Fprintf(os.Stderr, "vipcast-speaker %s --conn-sync-relay: %v\n", ipvs.PrepareNodeCommand, err)
			return 1
		}
		fmt.Printf("vipcast-speaker %s: the connection sync relay's veth pair and sysctls are ready\n", ipvs.PrepareNodeCommand)
	}
	return 0
}

func run(f *flags) error {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	logger := klog.Background().WithValues("node", f.nodeName)
	ctx = klog.NewContext(ctx, logger)

	reg, metrics, err := newRegistry()
	if err != nil {
		return err
	}
	requests, err := apirequests.NewCounter(reg, "speaker")
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	client, calls, dyn, err := clients(f, requests)
	if err != nil {
		return err
	}
	nodeIP, nodeIP6, err := readNodeIPs(ctx, f, calls)
	if err != nil {
		return err
	}
	routerID := pickRouterID(f, nodeIP)
	// The controller is built after BGP, but the session callback needs
	// it: it is reached through ctrlRef once it exists.
	var ctrlRef atomic.Pointer[speaker.Controller]
	engine, err := startBGP(ctx, routerID, f.prefixRestart, reg, &ctrlRef)
	if err != nil {
		return err
	}
	opts := speakerOptions(f, client, calls, dyn, engine, metrics)
	if f.ipvs {
		dp, err := openDataplane(ctx, logger, f, nodeIP, nodeIP6, reg)
		if err != nil {
			return err
		}
		// After shutdown (routes withdrawn, BGP stopped).
		defer releaseDataplane(logger, calls, f.owner, dp)
		opts.Dataplane = dp
	}
	ctrl, err := speaker.NewController(opts)
	if err != nil {
		return err
	}
	ctrlRef.Store(ctrl)
	if f.metricsAddr != "0" {
		if err := serve(ctx, f.metricsAddr, reg, ctrl); err != nil {
			return err
		}
	}
	logger.Info("Starting vipcast-speaker", "routerID", routerID)
	runErr := ctrl.Run(ctx)
	return shutdown(logger, ctrl, engine, f.convergenceDelay, runErr)
}

// speakerOptions are the controller's options from the flags and the
// clients, BGP engine and metrics run made.
func speakerOptions(f *flags, client, calls kubernetes.Interface, dyn dynamic.Interface, engine bgp.Speaker, metrics *speaker.Metrics) speaker.Options {
	return speaker.Options{
		NodeName:        f.nodeName,
		Client:          client,
		Calls:           calls,
		Dynamic:         dyn,
		PasswordSecrets: f.passwordSecrets,
		Classes:         f.classes,
		BGP:             engine,
		Resync:          f.resync,
		StatusInterval:  f.statusInterval,
		PrefixWarning:   f.prefixWarning,
		Handover:        f.convergenceDelay,
		OutageSettle:    f.outageSettle,
		Metrics:         metrics,
		DataplaneResync: f.dataplaneResync,
		DataplaneProbe:  f.dataplaneProbe,
		TunnelPrefix:    f.tunnelPrefix,
		TunnelPrefix6:   f.tunnelPrefix6,
		SpeakerService:  f.speakerService,
	}
}

// newRegistry returns the speaker's metrics registry, holding the Go
// runtime's and the process's collectors and the speaker's own metrics.
func newRegistry() (*prometheus.Registry, *speaker.Metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := speaker.NewMetrics(reg)
	if err != nil {
		return nil, nil, fmt.Errorf("metrics: %w", err)
	}
	return reg, metrics, nil
}

// Values of --conn-sync-interface, and the default --conn-sync-id (the
// number vipcast uses for its routes' protocol too).
const (
	connSyncAuto      = "auto"
	connSyncOff       = "none"
	defaultConnSyncID = 96
	// Values of --conn-sync-transport.
	connSyncMulticast = "multicast"
	connSyncRelay     = "relay"
)

// checkTunnel parses --tunnel-prefix and checks it, --tunnel-mtu and the
// --conn-sync flags.
func (f *flags) checkTunnel() error {
	if f.tunnelMTU != 0 && (f.tunnelMTU < 576 || f.tunnelMTU > 65535) {
		return fmt.Errorf("--tunnel-mtu=%d is out of 576..65535: use the fabric's MTU, such as 1500, or 0 for the default route's link", f.tunnelMTU)
	}
	if f.connSyncID < 0 || f.connSyncID > 255 {
		return fmt.Errorf("--conn-sync-id=%d is out of 0..255: use the same number on every speaker, such as %d", f.connSyncID, defaultConnSyncID)
	}
	if l := f.connSyncLink; l == "" || len(l) > 15 || strings.ContainsAny(l, "/ \t\n") {
		return fmt.Errorf("--conn-sync-interface=%q is not a link name: use %q, %q or the name of the link to the other nodes, such as eth0", l, connSyncAuto, connSyncOff)
	}
	switch f.connSyncVia {
	case connSyncMulticast:
	case connSyncRelay:
		if f.connSyncLink != connSyncAuto && f.connSyncLink != connSyncOff {
			return fmt.Errorf("--conn-sync-interface=%s with --conn-sync-transport=relay: the relay's daemons run on their own veth pair; leave --conn-sync-interface at %q (or %q to turn sync off)", f.connSyncLink, connSyncAuto, connSyncOff)
		}
	default:
		return fmt.Errorf("--conn-sync-transport=%q: use %q (one L2 segment) or %q (nodes on different subnets)", f.connSyncVia, connSyncMulticast, connSyncRelay)
	}
	if f.connSyncKeyDir != "" && (f.connSyncVia != connSyncRelay || f.connSyncLink == connSyncOff) {
		return fmt.Errorf("--conn-sync-key-dir=%s without the relay: the keys sign the relay's datagrams; use it with --conn-sync-transport=relay, or leave it empty", f.connSyncKeyDir)
	}
	if f.connSyncPort < 1 || f.connSyncPort > 65535 {
		return fmt.Errorf("--conn-sync-relay-port=%d is out of 1..65535: use the same port on every speaker, such as %d", f.connSyncPort, ipvs.DefaultSyncRelayPort)
	}
	if f.speakerService != "" {
		ns, name, ok := strings.Cut(f.speakerService, "/")
		switch {
		case !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1035Label(name)) > 0:
			return fmt.Errorf("--speaker-service=%q is not namespace/name: use the headless Service that selects the speakers' pods, such as vipcast-system/vipcast-speaker", f.speakerService)
		case f.tunnelPrefixFlag == "":
			return fmt.Errorf("--speaker-service=%s without --tunnel-prefix: it chooses the nodes of the two-tier dataplane's tier 1; set --tunnel-prefix, or leave it empty", f.speakerService)
		}
	}
	if f.tunnelPrefixFlag == "" {
		return nil
	}
	v4, v6, two := strings.Cut(f.tunnelPrefixFlag, ",")
	p, err := netip.ParsePrefix(strings.TrimSpace(v4))
	switch {
	case err != nil || !p.Addr().Is4():
		return fmt.Errorf("--tunnel-prefix=%q: %q is not an IPv4 prefix: use one such as 100.127.0.0/16, or 100.127.0.0/16,fd00:7f::/64 for IPv6 tunnel addresses too", f.tunnelPrefixFlag, v4)
	case p.Bits() < 8 || p.Bits() > 30:
		return fmt.Errorf("--tunnel-prefix=%s: use a length of 8 to 30, at least as long as the nodes' subnet, such as /16", p)
	case !f.ipvs:
		return errors.New("--tunnel-prefix needs the IPVS dataplane: drop --ipvs=false, or --tunnel-prefix")
	}
	f.tunnelPrefix = p.Masked()
	if !two {
		return nil
	}
	p6, err := netip.ParsePrefix(strings.TrimSpace(v6))
	switch {
	case err != nil || !p6.Addr().Is6() || p6.Addr().Is4In6():
		return fmt.Errorf("--tunnel-prefix=%q: %q is not an IPv6 prefix: after the comma give the IPv6 tunnel prefix, such as fd00:7f::/64, or nothing", f.tunnelPrefixFlag, v6)
	case p6.Bits() < 32 || p6.Bits() > 124:
		return fmt.Errorf("--tunnel-prefix: IPv6 prefix %s: use a length of 32 to 124, at least as long as the nodes' IPv6 subnet, such as /64", p6)
	}
	f.tunnelPrefix6 = p6.Masked()
	return nil
}

// dataplaneOptions returns the options of the IPVS dataplane: with
// --tunnel-prefix, the two-tier dataplane with this node's tunnel
// address, derived from its IPv4 address nodeIP, and with an IPv6 tunnel
// prefix its IPv6 tunnel address, derived from its IPv6 address nodeIP6
// (a node without one keeps IPv6 VIPs on one tier).
func dataplaneOptions(f *flags, nodeIP, nodeIP6 netip.Addr) (ipvs.Options, error) {
	// Without connection sync the daemons of an earlier run with it stop.
	opts := ipvs.Options{LinkName: f.ipvsLink, ConnSync: &ipvs.ConnSync{Off: true, ID: uint8(f.connSyncID)}, HostGuard: f.hostGuard(), PodCIDRs: f.clusterCIDRs} //nolint:gosec // checked: 0..255
	if !f.tunnelPrefix.IsValid() {
		return opts, nil
	}
	self, err := speaker.TunnelAddress(f.tunnelPrefix, nodeIP)
	if err != nil {
		return opts, fmt.Errorf("--tunnel-prefix: this node's tunnel address (from its IPv4 InternalIP): %w", err)
	}
	opts.Tunnel = &ipvs.Tunnel{Self: self, MTU: f.tunnelMTU}
	if f.tunnelPrefix6.IsValid() {
		if opts.Tunnel.Self6, err = speaker.TunnelAddress(f.tunnelPrefix6, nodeIP6); err != nil {
			opts.Tunnel.OneTier6 = fmt.Sprintf("--tunnel-prefix: this node has no IPv6 tunnel address (from its IPv6 InternalIP): %v", err)
		}
	}
	switch {
	case f.connSyncLink == connSyncOff:
	case f.connSyncVia == connSyncRelay:
		opts.ConnSync = &ipvs.ConnSync{ID: opts.ConnSync.ID, Relay: &ipvs.SyncRelay{Address: nodeIP, Port: uint16(f.connSyncPort)}} //nolint:gosec // checked: 1..65535
	case f.connSyncLink == connSyncAuto:
		opts.ConnSync = &ipvs.ConnSync{Address: nodeIP, ID: opts.ConnSync.ID}
	default:
		opts.ConnSync = &ipvs.ConnSync{Interface: f.connSyncLink, ID: opts.ConnSync.ID}
	}
	return opts, nil
}

// openDataplane opens the IPVS dataplane and gives its connection sync
// relay its keys. The kernel state outlives the process on purpose: a
// restarted speaker takes it over without dropping a connection.
func openDataplane(ctx context.Context, logger klog.Logger, f *flags, nodeIP, nodeIP6 netip.Addr, reg prometheus.Registerer) (*ipvs.Dataplane, error) {
	opts, err := dataplaneOptions(f, nodeIP, nodeIP6)
	if err != nil {
		return nil, err
	}
	dp, err := ipvs.New(opts)
	if err != nil {
		return nil, fmt.Errorf("opening IPVS (load the ip_vs modules and grant NET_ADMIN, or pass --ipvs=false to announce routes only): %w", err)
	}
	if err := errors.Join(speaker.RegisterRelayMetrics(reg, dp.RelayStats), speaker.RegisterGuardMetrics(reg, dp.GuardDrops)); err != nil {
		_ = dp.Close()
		return nil, fmt.Errorf("metrics: %w", err)
	}
	if c := dp.ConnSync(); c != nil {
		logger.Info("Sharing this node's tier-1 connections with the other nodes (IPVS sync daemons)", "interface", c.Interface, "syncID", c.ID, "relay", c.Relay != nil)
	}
	if err := startSyncKeys(ctx, logger, f, dp); err != nil {
		_ = dp.Close()
		return nil, err
	}
	if p := dp.StaleFlowsProblem(); p != nil {
		logger.Error(p, "IPVS keeps a deleted real server's flows")
	}
	if p := dp.InClusterProblem(); p != nil {
		logger.Error(p, "Serving without the in-cluster map")
	}
	if p := dp.ConnSyncProblem(); p != nil {
		logger.Error(p, "The IPVS sync daemons did not start; serving without connection sync (a Warning Event on the Node says so too)")
	}
	if opts.Tunnel != nil {
		switch on, why := dp.TwoTierIPv6(); {
		case on && opts.Tunnel.Self6.IsValid():
			logger.Info("IPv6 VIPs go through the two tiers too, ip6ip6 to the IPv6 tunnel addresses", "self", opts.Tunnel.Self6)
		case on:
			logger.Info("IPv6 VIPs go through the two tiers too, 6in4 to the IPv4 tunnel addresses")
		default:
			logger.Info("IPv6 VIPs keep one tier", "reason", why.Error())
		}
	}
	return dp, nil
}

// syncKeysInterval is how often the speaker reads --conn-sync-key-dir.
const syncKeysInterval = 10 * time.Second

// startSyncKeys gives the relay its keys from --conn-sync-key-dir and
// watches them for changes; without the flag it says the relay trusts
// source addresses alone. A key directory that does not read stops the
// start: a relay without the cluster's keys would drop every message.
func startSyncKeys(ctx context.Context, logger klog.Logger, f *flags, dp *ipvs.Dataplane) error {
	c := dp.ConnSync()
	if c == nil || c.Relay == nil {
		return nil
	}
	if f.connSyncKeyDir == "" {
		logger.Info("The connection sync relay's datagrams are not authenticated: it takes them from the other nodes' addresses alone. Set --conn-sync-key-dir (the chart does) to sign them.")
		return nil
	}
	keys, err := ipvs.LoadSyncKeys(f.connSyncKeyDir)
	if err != nil {
		return fmt.Errorf("--conn-sync-key-dir: %w (the chart's Secret <release>-conn-sync-keys holds them)", err)
	}
	dp.SetSyncKeys(keys)
	logger.Info("The connection sync relay signs and checks its datagrams", "keys", keys.Len(), "sendKeyID", keys.SendID())
	go speaker.WatchSyncKeys(klog.NewContext(ctx, logger), f.connSyncKeyDir, keys, dp, syncKeysInterval)
	return nil
}

// closeDataplane releases the IPVS and netlink handles, logging a failure;
// the kernel state stays.
func closeDataplane(logger klog.Logger, dp *ipvs.Dataplane) {
	if err := dp.Close(); err != nil {
		logger.Error(err, "Closing the IPVS handles")
	}
}

// callTimeout bounds every single request to the API server (Events, the
// Node read, the health probe), so a hung API server blocks nothing.
const callTimeout = 10 * time.Second

// clients returns the API clients the flags configure: client and dyn for
// the informers (whose watches are long requests, bounded by the server's
// watch timeout), calls for single requests, each bounded by callTimeout.
// Every request they send is counted in requests.
func clients(f *flags, requests *apirequests.Counter) (client, calls kubernetes.Interface, dyn dynamic.Interface, err error) {
	cfg, err := restConfig(f.kubeconfig)
	if err != nil {
		return nil, nil, nil, err
	}
	cfg.QPS, cfg.Burst = float32(f.qps), f.burst
	cfg.UserAgent = speaker.Component
	cfg.Wrap(requests.Wrap)
	// vipcast's own resources are JSON (custom resources have no
	// protobuf); the core types come in protobuf, as kube-proxy reads
	// them: fewer bytes and less CPU per event on both sides.
	if dyn, err = dynamic.NewForConfig(cfg); err != nil {
		return nil, nil, nil, fmt.Errorf("dynamic client: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if client, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	bounded := rest.CopyConfig(cfg)
	bounded.Timeout = callTimeout
	if calls, err = kubernetes.NewForConfig(bounded); err != nil {
		return nil, nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return client, calls, dyn, nil
}

// startBGP starts the BGP engine (it listens on no port) with its metrics
// in reg; session changes go to the controller in ctrl once it is set.
func startBGP(ctx context.Context, routerID netip.Addr, prefixRestart time.Duration, reg prometheus.Registerer, ctrl *atomic.Pointer[speaker.Controller]) (*bgp.GoBGP, error) {
	engine, err := bgp.New(bgp.Config{
		RouterID:           routerID,
		ListenPort:         -1,
		PrefixLimitRestart: prefixRestart,
		Logger:             klog.FromContext(ctx).WithName("bgp"),
		OnSessionChange: func(s bgp.SessionState) {
			if c := ctrl.Load(); c != nil {
				c.SessionChanged(ctx, s)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("starting BGP: %w", err)
	}
	if err := reg.Register(bgp.NewCollector(engine)); err != nil {
		return nil, fmt.Errorf("bgp metrics: %w", err)
	}
	if err := reg.Register(engine.BFDDiscards().Collector()); err != nil {
		return nil, fmt.Errorf("bfd metrics: %w", err)
	}
	return engine, nil
}

// stopReportTimeout bounds the last write of a shutdown, the
// SpeakerStatus saying the speaker stopped: an absent API server must not
// hold the pod's termination up.
const stopReportTimeout = 3 * time.Second

// shutdown withdraws every route with the sessions still up, waits for the
// routers to converge, closes the sessions with a Cease notification so
// the routers also drop anything left at once, and reports the stop.
func shutdown(logger klog.Logger, ctrl *speaker.Controller, engine bgp.Speaker, delay time.Duration, runErr error) error {
	ctx, cancel := context.WithTimeout(klog.NewContext(context.Background(), logger), delay+30*time.Second)
	defer cancel()
	start := time.Now()
	if err := ctrl.WithdrawAll(ctx); err != nil {
		logger.Error(err, "Withdrawing routes")
	}
	logger.Info("Routes withdrawn; waiting for the fabric to converge", "delay", delay, "took", time.Since(start))
	time.Sleep(delay)
	if err := engine.Stop(ctx); err != nil {
		logger.Error(err, "Stopping BGP")
	}
	logger.Info("BGP stopped")
	reportCtx, cancelReport := context.WithTimeout(ctx, stopReportTimeout)
	defer cancelReport()
	if err := ctrl.ReportStopped(reportCtx); err != nil {
		logger.Error(err, "Reporting the stop in this node's SpeakerStatus")
	}
	return runErr
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster configuration (pass --kubeconfig when running outside a cluster): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig=%s: %w", kubeconfig, err)
	}
	return cfg, nil
}

// pickRouterID returns --router-id, else nodeIP (the Node's first IPv4
// address), else an address derived from the node name (router IDs only
// need to be unique among a router's peers). Without --router-id, run
// waits for readNodeIPs — nothing is announced meanwhile — so that a
// speaker started during an API server outage does not come up with
// another router ID than the one it would have had.
func pickRouterID(f *flags, nodeIP netip.Addr) netip.Addr {
	if f.routerID != "" {
		return netip.MustParseAddr(f.routerID) // validated by parseFlags
	}
	if nodeIP.IsValid() {
		return nodeIP
	}
	h := fnv.New32a()
	h.Write([]byte(f.nodeName))
	// Sum gives the four bytes of Sum32, most significant first.
	return netip.AddrFrom4([4]byte(h.Sum(nil)))
}

// readNodeIPs reads this Node once, retrying while the API server does
// not answer, and returns its IPv4 and IPv6 addresses (the first
// InternalIP of each family; the zero Addr when it has none or does not
// exist). It reads nothing when neither the router ID nor the tunnel
// addresses need them.
func readNodeIPs(ctx context.Context, f *flags, calls kubernetes.Interface) (v4, v6 netip.Addr, err error) {
	if f.routerID != "" && !f.tunnelPrefix.IsValid() {
		return v4, v6, nil
	}
	logger := klog.FromContext(ctx)
	var node *v1.Node
	logged := false
	err = wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		node, err = calls.CoreV1().Nodes().Get(ctx, f.nodeName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			logger.Error(err, "Node not found; the router ID comes from the node name, and the two-tier dataplane cannot start")
			return true, nil
		case err != nil:
			if !logged { // once per outage, not every retry
				logger.Error(err, "Waiting for the API server to read this Node (for the router ID and the tunnel address): nothing is announced until then")
				logged = true
			}
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return v4, v6, fmt.Errorf("reading Node %s for its address: %w", f.nodeName, err)
	}
	if node == nil {
		return v4, v6, nil
	}
	n, _ := speaker.NodeFrom(node)
	return n.IPv4, n.IPv6, nil
}

// serve starts the metrics and health endpoints.
func serve(ctx context.Context, addr string, reg *prometheus.Registry, ctrl *speaker.Controller) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ready, why := ctrl.Ready(time.Now())
		if !ready {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		// Plain text, never sniffed: why names BGPPeers.
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = io.WriteString(w, "ok: "+why+"\n") //nolint:gosec // G705: served as text/plain, never sniffed
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--metrics-bind-address=%s: %w", addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return nil
}
