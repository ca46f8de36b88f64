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
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/apirequests"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/ipvs"
	"github.com/vipcast/vipcast/speaker"
)

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
