package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"

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
	fs := newFlagSet(f)
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

// newFlagSet defines vipcast-speaker's own flags (klog's are added by
// parseFlags) on a new FlagSet that parses into f. Their usage texts are
// the reference page docs/reference/speaker-flags.md (make generate).
func newFlagSet(f *flags) *flag.FlagSet {
	fs := flag.NewFlagSet("vipcast-speaker", flag.ContinueOnError)
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "Path to a kubeconfig; empty uses the in-cluster configuration.")
	fs.StringVar(&f.nodeName, "node-name", os.Getenv("NODE_NAME"), "Name of the Node this speaker runs on (default $NODE_NAME).")
	fs.StringVar(&f.routerID, "router-id", "", "BGP router ID (an IPv4 address), read once at start; default: the Node's first IPv4 InternalIP (else ExternalIP), else derived from the node name.")
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", defaultMetricsAddr, "host:port serving /metrics, /healthz and /readyz (plain HTTP, no authentication); \"0\" turns it off. /readyz answers ready once the first routing table is in BGP and every session this node should have has been Established once, or a minute after the first table when a router never answers, so that a DaemonSet rollout moves to the next node only when this one announces again. The host must be a specific address, such as the node's ($(NODE_IP) from status.hostIP): every address (\":7473\", \"0.0.0.0\", \"[::]\") would include the VIPs.")
	fs.Func("cluster-cidr", "Comma-separated prefixes of the pods' addresses, both families (kube-proxy's --cluster-cidr, such as 10.244.0.0/16,fd00:10:244::/56): a pod's connection to a one-tier VIP under externalTrafficPolicy Local goes to any of the Service's endpoints, as kube-proxy sends in-cluster clients, even from a node without one. Empty: the pods' connections go through IPVS like the fabric's, and on a node without a local endpoint they are refused. The node's own connections go to any endpoint either way.", func(v string) (err error) {
		f.clusterCIDRs, err = parseSources(v)
		return err
	})
	fs.Func("metrics-allowed-sources", "Comma-separated prefixes (such as the pod CIDR Prometheus scrapes from) that may reach --metrics-bind-address besides the node's own addresses; with IPVS, the host guard drops the rest in the kernel and counts them in vipcast_ipvs_guard_dropped_packets_total{reason=\"metrics\"}. 0.0.0.0/0 (::/0) lets every source of the family in. Empty: the node itself only (the kubelet's probes).", func(v string) (err error) {
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
	fs.DurationVar(&f.prefixRestart, "bgp-prefix-limit-restart", bgp.DefaultPrefixLimitRestart, "How long a BGP session stays down after the router sent more prefixes than its limit (10,000 in one family); doubled for each consecutive time, up to 30m.")
	fs.DurationVar(&f.dataplaneResync, "dataplane-resync-period", time.Minute, "How often the whole IPVS table is compared with the desired state, repairing drift.")
	fs.DurationVar(&f.dataplaneProbe, "dataplane-probe-period", 2*time.Second, "How often the speaker asks the kernel for one of its virtual servers (one request): when it is gone, another program flushed IPVS (kube-proxy does when it starts in nftables mode) and the whole table is restored at once. At least 100ms.")
	fs.StringVar(&f.tunnelPrefixFlag, "tunnel-prefix", "", "Turns on the two-tier dataplane (established flows survive ECMP changes, the pods see the client): an IPv4 prefix, optionally followed by a comma and an IPv6 prefix, such as 100.127.0.0/16,fd00:7f::/64. Each node's tunnel address is the IPv4 prefix with the host bits of the node's IPv4 InternalIP, and its IPv6 tunnel address the IPv6 prefix with those of its IPv6 InternalIP. IPv6 VIPs go through the two tiers to the IPv6 tunnel addresses; without an IPv6 prefix, only when --conn-sync-interface is none (6in4 to the IPv4 ones). Every speaker of the cluster must have the same value. Each speaker publishes its node's addresses in the node's NodeTunnel and reads the other nodes'. Empty keeps one tier.")
	fs.StringVar(&f.connSyncLink, "conn-sync-interface", connSyncAuto, "With --tunnel-prefix: the link on which the kernel's IPVS sync daemons share each node's tier-1 connections with the other nodes (multicast 224.0.0.81, UDP 8848, not routed), so that a flow ECMP moves after the nodes' endpoints changed still reaches its pod. \""+connSyncAuto+"\" is the link holding the node's InternalIP (a node without that link serves without sync, with a Warning Event on its Node); \""+connSyncOff+"\" turns it off and stops the sync daemons of --conn-sync-id an earlier run started. Without an IPv6 tunnel prefix, sync keeps IPv6 VIPs on one tier (the kernel does not sync their 6in4 connections).")
	fs.StringVar(&f.connSyncVia, "conn-sync-transport", connSyncMulticast, "How the IPVS sync daemons' messages reach the other nodes: \""+connSyncMulticast+"\" on the link --conn-sync-interface names (the nodes of one L2 segment), or \""+connSyncRelay+"\": the daemons run on a veth pair of the node's own (vcsync0/vcsync1) and the speaker passes their messages by unicast UDP (--conn-sync-relay-port) to the InternalIP of every other node that announces VIPs (a node that announces none exchanges nothing), accepting only sync messages of its sync ID from those addresses, for nodes on different subnets (a rack each, a /31 to the ToR each). With the relay, --conn-sync-interface is auto or none.")
	fs.StringVar(&f.connSyncKeyDir, "conn-sync-key-dir", "", "With --conn-sync-transport=relay: a directory of keys, one file per key named by its ID (1 to 255, at least 32 bytes each; a mounted Secret), that the relays sign their datagrams with (the highest ID) and check the other nodes' with (any of them). Read again every 10 s: add a key of a higher ID to rotate, remove the old one once every node has the new. Empty: datagrams go unsigned and the relay trusts the source address alone.")
	fs.IntVar(&f.connSyncPort, "conn-sync-relay-port", ipvs.DefaultSyncRelayPort, "With --conn-sync-transport=relay: the UDP port the relays use on every node's InternalIP. Every speaker of the cluster must have the same value, and the nodes' firewalls must let it through.")
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
	return fs
}

// apiFlags registers the flags of what the speaker asks of the API server
// and writes to it.
func apiFlags(fs *flag.FlagSet, f *flags) {
	fs.DurationVar(&f.resync, "resync-period", 5*time.Minute, "How often the whole configuration is recomputed from the informers' caches.")
	fs.IntVar(&f.prefixWarning, "announced-prefixes-warning", 5000, "Warn (a PrefixCountHigh Warning Event on the Node, once per crossing) when the node announces more prefixes than this: routers hold a bounded number of routes and ECMP groups. 0 never warns.")
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
