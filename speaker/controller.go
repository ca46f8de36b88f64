package speaker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/lbclass"
)

// Component is the name the speaker records Events and logs under.
const Component = "vipcast-speaker"

// keyConfig is the queue key for a change of the node, the pools or the
// peers: every Service's routes are recomputed. Any other key is a
// Service's namespace/name.
const keyConfig = "\x00config"

// contactInterval is how often the speaker probes the API server.
const contactInterval = 10 * time.Second

// keyResync is the queue key for a full dataplane resync (a kernel read),
// on start-up and every Options.DataplaneResync.
const keyResync = "\x00resync"

// keyDrift is the queue key for a full dataplane resync after a probe
// (every Options.DataplaneProbe) found a programmed virtual server gone:
// keyResync's work, told apart in the log of what it finds.
const keyDrift = "\x00drift"

// keyNodes is the queue key for a change of other nodes' addresses (with
// two tiers): see syncNodes.
const keyNodes = "\x00nodes"

// keyStatus is the queue key for computing the node's SpeakerStatus,
// queued statusCompute after every change.
const keyStatus = "\x00status"

// Options configure a Controller.
type Options struct {
	// NodeName is the node this speaker runs on.
	NodeName string
	// Client and Dynamic talk to the API server.
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// BGP announces the routes.
	BGP bgp.Speaker
	// Calls makes the speaker's single requests (Events, the API server
	// probe): a client whose requests time out. Nil uses Client, whose
	// watches must not time out.
	Calls kubernetes.Interface
	// PasswordSecrets are the Secrets BGPPeers may name for TCP MD5
	// passwords and BFD keys; the speaker watches each of them alone (a
	// field selector on its name, which RBAC resourceNames allow) and
	// reads no other.
	PasswordSecrets []types.NamespacedName
	// Resync is how often the whole configuration is recomputed from the
	// informers' caches.
	Resync time.Duration
	// Metrics records the speaker's own metrics; nil records nothing.
	Metrics *Metrics
	// Dataplane programs IPVS; nil announces routes only.
	Dataplane Dataplane
	// Classes says which Services vipcast serves: the CCM's class
	// settings, so the speaker announces exactly the Services the CCM
	// publishes VIPs for. The zero value serves the class-less ones.
	Classes lbclass.Selector
	// Handover is how long a node keeps announcing a Local Service's VIP
	// after its endpoints all started terminating (serving on) while
	// another node has ready ones (HandoverRoutes): the time the routers
	// need to learn that node's route. 0 withdraws at once.
	Handover time.Duration
	// OutageSettle is how long after an API-server outage the endpoints
	// ready when it began stay ready whatever the EndpointSlices say,
	// short of terminating (outageHold); 0 reads them as they come.
	OutageSettle time.Duration
	// DataplaneResync is how often the whole kernel table is compared
	// with the desired state, repairing drift.
	DataplaneResync time.Duration
	// DataplaneProbe is how often the dataplane is asked whether a
	// virtual server it programmed is gone (Dataplane.Probe, one kernel
	// request): kube-proxy flushes every IPVS virtual server of the node
	// when it starts in nftables mode, and the speaker then resyncs at
	// once rather than up to DataplaneResync later.
	DataplaneProbe time.Duration
	// TunnelPrefix turns on the two-tier dataplane for IPv4 VIPs: every
	// node's tunnel address is derived from it (TunnelAddress), the
	// speaker publishes its node's NodeTunnel and watches every node's for
	// their addresses, and Dataplane must run the two tiers (an
	// *ipvs.Dataplane opened with the matching ipvs.Tunnel). The zero
	// prefix keeps one tier.
	TunnelPrefix netip.Prefix
	// TunnelPrefix6, with TunnelPrefix, sends IPv6 VIPs to the nodes' IPv6
	// tunnel addresses, derived from it and their IPv6 addresses (ip6ip6;
	// the Dataplane's ipvs.Tunnel then has Self6). The zero prefix sends
	// them to the IPv4 tunnel addresses (6in4), when the Dataplane gives
	// them the two tiers at all (TwoTierIPv6).
	TunnelPrefix6 netip.Prefix
	// SpeakerService, with TunnelPrefix, is the namespace/name of a
	// headless Service that selects the speakers' pods: a node is ready
	// for tier 1 while its speaker's pod is a ready endpoint of it (its
	// kubelet says the readiness probe passes), and the other nodes' tier
	// 1 sends new flows only to nodes that are, or to none of them when no
	// ready node hosts an endpoint (drainUnready). Only EndpointSlices the
	// EndpointSlice controller manages count. Empty: every node with a
	// tunnel address takes flows.
	SpeakerService string
	// PrefixWarning, when above 0, is how many announced prefixes a node
	// may have before it warns (a Warning Event PrefixCountHigh on its
	// Node, once per crossing): routers hold a bounded number of routes
	// and ECMP groups. 0 never warns.
	PrefixWarning int
	// StatusInterval is how often, at most, the node's SpeakerStatus is
	// written for a change of its counts or sample of prefixes (with up to
	// 20% jitter); a change of a session, a refusal or the served classes
	// is written at once. 0 is DefaultStatusInterval.
	StatusInterval time.Duration
}

// Controller is the speaker's reconciler: it watches Services,
// EndpointSlices, this Node, IPPools and BGPPeers, computes the routes this
// node announces, the sessions it opens and the virtual servers it
// programs, and drives a bgp.Speaker and a Dataplane with the differences.
//
// Its parts, one file each: watched (informers and decoding), the sync
// steps (sync.go: view → dataplane → routes → sessions), announcer (what
// BGP has been told), programmer (what the dataplane has been told) and
// reporter (Events and problem logs).
type Controller struct {
	opts   Options
	queue  workqueue.TypedRateLimitingInterface[string]
	watch  *watched
	events record.EventBroadcaster
	report *reporter
	ann    *announcer
	prog   *programmer // nil without a dataplane
	status *statusWriter
	// tunnelPub publishes this node's NodeTunnel; nil with one tier.
	tunnelPub *tunnelPublisher

	view *View // owned by the worker goroutine
	// bfdGuarded are the BFD peers the host guard lets in, as last set
	// (syncSessions).
	bfdGuarded []netip.Addr
	// notAnnounced are the keys of the Services vipcast serves for a VIP
	// of which this node announces no route (see unannounced), counted in
	// the SpeakerStatus; owned by the worker goroutine.
	notAnnounced map[string]bool
	// handovers are the Local handovers under way (HandoverRoutes); owned
	// by the worker goroutine.
	handovers handovers
	// unready are the nodes tier 1 last took as not ready, comma-joined
	// (reportTier1); owned by the worker goroutine.
	unready string

	mu    sync.Mutex
	ready readiness
}

// NewController builds a Controller; Run starts it.
func NewController(opts Options) (*Controller, error) {
	if opts.NodeName == "" {
		return nil, errors.New("node name is empty: set --node-name or the NODE_NAME environment variable")
	}
	if opts.Resync <= 0 {
		opts.Resync = 5 * time.Minute
	}
	if opts.DataplaneResync <= 0 {
		opts.DataplaneResync = time.Minute
	}
	if opts.DataplaneProbe <= 0 {
		opts.DataplaneProbe = 2 * time.Second
	}
	if opts.StatusInterval <= 0 {
		opts.StatusInterval = DefaultStatusInterval
	}
	if opts.Calls == nil {
		opts.Calls = opts.Client
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	if err := vipcastv1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	c := &Controller{
		opts: opts,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "speaker"}),
		events:       record.NewBroadcaster(),
		status:       newStatusWriter(opts.Dynamic, opts.StatusInterval, clock.RealClock{}),
		notAnnounced: map[string]bool{},
		handovers:    handovers{delay: opts.Handover},
	}
	c.report = newReporter(c.events.NewRecorder(scheme, v1.EventSource{Component: Component, Host: opts.NodeName}), opts.NodeName)
	c.ann = newAnnouncer(opts.BGP, opts.Metrics, func() { c.queue.AddRateLimited(keyConfig) })
	if opts.Dataplane != nil {
		c.prog = newProgrammer(opts.Dataplane, opts.Metrics)
	}
	var err error
	if c.watch, err = newWatched(opts, c.queue); err != nil {
		return nil, err
	}
	if c.watch.tunnels != nil {
		c.tunnelPub = newTunnelPublisher(opts.Dynamic, opts.NodeName, c.watch.ownTunnelCached)
		c.watch.ownTunnel = c.tunnelPub.poke
	}
	return c, nil
}

// Run starts the informers, waits for their caches, announces the whole
// routing table, opens the sessions, and then reconciles changes until ctx
// ends. Routes are handed to BGP before any session is configured, so a
// restarted speaker sends its routers the full set in its first updates
// instead of an empty table followed by a storm of announcements.
// Run returns once ctx ends; the caller then withdraws (WithdrawAll) and
// stops BGP.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	c.events.StartStructuredLogging(3)
	c.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.opts.Calls.CoreV1().Events("")})
	defer c.events.Shutdown()
	probe := &contact{client: c.opts.Calls, interval: contactInterval, metrics: c.opts.Metrics, now: time.Now,
		lost: c.watch.outageBegins, back: func() { c.outageEnds(ctx) }}
	go probe.run(ctx)
	go c.status.run(ctx)
	if c.tunnelPub != nil {
		go c.tunnelPub.run(ctx)
	}

	if err := c.watch.start(ctx); err != nil {
		return err
	}
	logger.Info("Caches synced", "services", len(c.watch.services.GetStore().ListKeys()), "node", c.opts.NodeName)

	// The first sync computes everything; the Service keys the informers
	// queued meanwhile are processed afterwards and find nothing to change.
	if err := c.syncConfig(ctx, true); err != nil {
		logger.Error(err, "Initial sync failed; retrying")
		c.queue.AddRateLimited(keyResync)
	}
	go c.tick(ctx)
	for c.processNext(ctx) {
	}
	return nil
}

// outageEnds starts the outage hold's settle time as the API server
// answers again, and queues the full recompute that ends it.
func (c *Controller) outageEnds(ctx context.Context) {
	if c.watch.hold == nil || !c.watch.hold.end() {
		return
	}
	settle := c.opts.OutageSettle
	klog.FromContext(ctx).Info("Endpoints ready when the API server became unreachable stay ready, short of terminating or going away, while the nodes report again",
		"for", settle, "node", c.opts.NodeName)
	time.AfterFunc(settle, func() { c.queue.Add(keyConfig) })
}

// tick queues the periodic config sync and dataplane resync, probes the
// dataplane for drift, and shuts the queue down when ctx ends.
func (c *Controller) tick(ctx context.Context) {
	config := time.NewTicker(c.opts.Resync)
	defer config.Stop()
	resync := time.NewTicker(c.opts.DataplaneResync)
	defer resync.Stop()
	probe := time.NewTicker(c.opts.DataplaneProbe)
	defer probe.Stop()
	probeFailed := false // log a failing probe once, not every period
	for {
		select {
		case <-ctx.Done():
			c.queue.ShutDown()
			return
		case <-config.C:
			c.queue.Add(keyConfig)
		case <-resync.C:
			if c.prog != nil {
				c.queue.Add(keyResync)
			}
		case <-probe.C:
			if c.prog == nil {
				continue
			}
			// The Dataplane is safe for concurrent use: the probe does
			// not wait for the worker.
			drifted, err := c.opts.Dataplane.Probe()
			if err != nil && !probeFailed {
				klog.FromContext(ctx).Error(err, "Dataplane probe failed; the periodic resync still repairs drift", "node", c.opts.NodeName)
			}
			probeFailed = err != nil
			if drifted {
				// The resync's kernel read finds what is gone and
				// reports it (reportLost).
				c.queue.Add(keyDrift)
			}
		}
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	var err error
	switch key {
	case keyConfig:
		err = c.syncConfig(ctx, false)
	case keyResync, keyDrift:
		err = c.syncConfig(ctx, true)
	case keyStatus:
		err = c.publishStatus(ctx)
	case keyNodes:
		err = c.syncNodes(ctx)
	default:
		err = c.syncService(ctx, key)
	}
	c.reportLost(ctx, key)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Sync failed; retrying", "key", printableKey(key))
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// reportLost reports the virtual servers the dataplane found gone from
// the kernel during the sync of key (removed by another program: a
// kube-proxy flush), whichever sync found them: a log line, the metric
// and a Warning Event on the Node. Found by one Service's sync, which
// restores that Service's only, they also queue a full resync.
func (c *Controller) reportLost(ctx context.Context, key string) {
	if c.prog == nil {
		return
	}
	lost, needResync := c.prog.takeLost()
	if len(lost) == 0 {
		return
	}
	if needResync {
		c.queue.Add(keyResync)
	}
	c.opts.Metrics.driftDetected()
	node, err := c.watch.currentNode()
	if err != nil {
		node = nil
	}
	c.report.dataplaneDrift(ctx, node, lost, printableKey(key))
}

func printableKey(key string) string {
	switch key {
	case keyConfig:
		return "config"
	case keyResync:
		return "resync"
	case keyDrift:
		return "probe"
	case keyStatus:
		return "status"
	case keyNodes:
		return "nodes"
	}
	return key
}

// WithdrawAll withdraws every announced prefix, keeping the sessions up so
// routers learn of the withdrawal at once. It is the first step of a
// graceful shutdown.
func (c *Controller) WithdrawAll(ctx context.Context) error {
	return c.ann.withdrawAll(ctx)
}

// ReportStopped writes, after the sessions are closed, that this node
// announces nothing and its sessions are Idle ("vipcast-speaker stopped"),
// so its SpeakerStatus and the BGPPeers' counts do not go on showing a
// speaker that left. It is the last step of a graceful shutdown.
func (c *Controller) ReportStopped(ctx context.Context) error {
	return c.status.stopped(ctx)
}

// SessionChanged is the bgp engine's callback for a session state change:
// it logs every change and records an Event on the BGPPeer when the session
// comes up or goes down (not for each retry in between).
func (c *Controller) SessionChanged(ctx context.Context, s bgp.SessionState) {
	c.sessionUp(s.Peer, s.Established())
	c.queue.AddAfter(keyStatus, statusCompute)
	c.report.sessionChanged(ctx, s, func(name string) *vipcastv1alpha1.BGPPeer { return c.watch.peer(ctx, name) })
}
