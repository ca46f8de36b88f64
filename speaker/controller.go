package speaker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
)

// Component is the name the speaker records Events and logs under.
const Component = "vipcast-speaker"

// keyConfig is the queue key for a change of the node, the pools or the
// peers: every Service's routes are recomputed. Any other key is a
// Service's namespace/name.
const keyConfig = "\x00config"

// keyResync is the queue key for a full dataplane resync (a kernel read),
// on start-up and every Options.DataplaneResync.
const keyResync = "\x00resync"

// sliceIndex indexes EndpointSlices by the namespace/name of their Service.
const sliceIndex = "service"

// Options configure a Controller.
type Options struct {
	// NodeName is the node this speaker runs on.
	NodeName string
	// Client and Dynamic talk to the API server.
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// BGP announces the routes.
	BGP bgp.Speaker
	// Resync is how often the whole configuration is recomputed, which
	// also re-reads peer passwords from their Secrets.
	Resync time.Duration
	// Metrics records the speaker's own metrics; nil records nothing.
	Metrics *Metrics
	// Dataplane programs IPVS; nil announces routes only.
	Dataplane Dataplane
	// DataplaneResync is how often the whole kernel table is compared
	// with the desired state, repairing drift.
	DataplaneResync time.Duration
}

// Controller is the speaker's routing reconciler: it watches Services,
// EndpointSlices, this Node, IPPools and BGPPeers, computes the routes this
// node announces and the sessions it opens, and drives a bgp.Speaker with
// the differences.
type Controller struct {
	opts     Options
	factory  informers.SharedInformerFactory
	nodes    informers.SharedInformerFactory
	dynamic  dynamicinformer.DynamicSharedInformerFactory
	services cache.SharedIndexInformer
	slices   cache.SharedIndexInformer
	node     cache.SharedIndexInformer
	pools    cache.SharedIndexInformer
	peers    cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	events   record.EventBroadcaster

	// Owned by the worker goroutine.
	view  *View
	table *RouteTable
	prog  *programmer // nil without a dataplane
	// peerProblems remembers which BGPPeers were last reported unusable,
	// so an Event is recorded once per change, not once per resync.
	peerProblems map[string]string
	nodeProblem  string
	poolProblems string

	mu        sync.Mutex
	announced map[netip.Prefix]bool // what bgp has been told, for the final withdraw
	uncertain map[netip.Prefix]bool // prefixes of a failed Apply: BGP may or may not hold them
	synced    bool
	sessionUp map[string]bool // last known Established state per peer
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
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	if err := vipcastv1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	events := record.NewBroadcaster()
	c := &Controller{
		opts:    opts,
		factory: informers.NewSharedInformerFactory(opts.Client, 0),
		nodes: informers.NewSharedInformerFactoryWithOptions(opts.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", opts.NodeName).String()
		})),
		dynamic: dynamicinformer.NewDynamicSharedInformerFactory(opts.Dynamic, 0),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "speaker"}),
		events:       events,
		recorder:     events.NewRecorder(scheme, v1.EventSource{Component: Component, Host: opts.NodeName}),
		table:        NewRouteTable(),
		peerProblems: map[string]string{},
		announced:    map[netip.Prefix]bool{},
		uncertain:    map[netip.Prefix]bool{},
		sessionUp:    map[string]bool{},
	}
	if opts.Dataplane != nil {
		c.prog = newProgrammer(opts.Dataplane)
	}
	c.services = c.factory.Core().V1().Services().Informer()
	c.slices = c.factory.Discovery().V1().EndpointSlices().Informer()
	c.node = c.nodes.Core().V1().Nodes().Informer()
	c.pools = c.dynamic.ForResource(vipcastv1alpha1.IPPoolsResource).Informer()
	c.peers = c.dynamic.ForResource(vipcastv1alpha1.BGPPeersResource).Informer()

	if err := c.slices.AddIndexers(cache.Indexers{sliceIndex: sliceServiceKey}); err != nil {
		return nil, fmt.Errorf("endpointslice index: %w", err)
	}
	handlers := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{c.services, cache.ResourceEventHandlerFuncs{
			AddFunc:    c.enqueueService,
			UpdateFunc: func(_, cur any) { c.enqueueService(cur) },
			DeleteFunc: c.enqueueService,
		}},
		{c.slices, cache.ResourceEventHandlerFuncs{
			AddFunc:    c.enqueueSlice,
			UpdateFunc: func(_, cur any) { c.enqueueSlice(cur) },
			DeleteFunc: c.enqueueSlice,
		}},
		{c.node, nodeHandler(c.queue)},
		{c.pools, configHandler(c.queue)},
		{c.peers, configHandler(c.queue)},
	}
	for _, h := range handlers {
		if _, err := h.inf.AddEventHandler(h.h); err != nil {
			return nil, fmt.Errorf("event handler: %w", err)
		}
	}
	return c, nil
}

// nodeHandler enqueues a full recompute when the node changes in a way the
// decisions see (labels, cordon, addresses, the local-ASN annotation), not
// on every status heartbeat.
func nodeHandler(q workqueue.TypedRateLimitingInterface[string]) cache.ResourceEventHandler {
	add := func(any) { q.Add(keyConfig) }
	return cache.ResourceEventHandlerFuncs{
		AddFunc: add,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*v1.Node)
			n, ok2 := cur.(*v1.Node)
			if ok1 && ok2 {
				a, errsA := NodeFrom(o)
				b, errsB := NodeFrom(n)
				if reflect.DeepEqual(a, b) && len(errsA) == len(errsB) &&
					o.Annotations[AnnotationLocalASN] == n.Annotations[AnnotationLocalASN] {
					return
				}
			}
			add(cur)
		},
		DeleteFunc: add,
	}
}

// configHandler enqueues a full recompute for an IPPool or BGPPeer change.
// Updates that change neither metadata.generation nor the labels (peer
// selectors match labels) are status writes and are ignored.
func configHandler(q workqueue.TypedRateLimitingInterface[string]) cache.ResourceEventHandler {
	add := func(any) { q.Add(keyConfig) }
	return cache.ResourceEventHandlerFuncs{
		AddFunc: add,
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*unstructured.Unstructured)
			n, ok2 := cur.(*unstructured.Unstructured)
			if ok1 && ok2 && o.GetGeneration() == n.GetGeneration() && maps.Equal(o.GetLabels(), n.GetLabels()) {
				return
			}
			add(cur)
		},
		DeleteFunc: add,
	}
}

// sliceServiceKey indexes an EndpointSlice by its Service's namespace/name.
func sliceServiceKey(obj any) ([]string, error) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	name := s.Labels[discoveryv1.LabelServiceName]
	if name == "" {
		return nil, nil
	}
	return []string{s.Namespace + "/" + name}, nil
}

func (c *Controller) enqueueService(obj any) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err == nil {
		c.queue.Add(key)
	}
}

func (c *Controller) enqueueSlice(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	keys, _ := sliceServiceKey(obj)
	for _, k := range keys {
		c.queue.Add(k)
	}
}

// HasSynced reports whether the first full set of routes has been handed to
// BGP and the sessions configured: the readiness of the speaker.
func (c *Controller) HasSynced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
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
	c.events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.opts.Client.CoreV1().Events("")})
	defer c.events.Shutdown()

	c.factory.Start(ctx.Done())
	c.nodes.Start(ctx.Done())
	c.dynamic.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.services.HasSynced, c.slices.HasSynced, c.node.HasSynced, c.pools.HasSynced, c.peers.HasSynced) {
		return fmt.Errorf("informer caches did not sync: %w", ctx.Err())
	}
	logger.Info("Caches synced", "services", len(c.services.GetStore().ListKeys()), "node", c.opts.NodeName)

	// The first sync computes everything; the Service keys the informers
	// queued meanwhile are processed afterwards and find nothing to change.
	if err := c.syncConfig(ctx, true); err != nil {
		logger.Error(err, "Initial sync failed; retrying")
		c.queue.AddRateLimited(keyResync)
	}

	go func() {
		config := time.NewTicker(c.opts.Resync)
		defer config.Stop()
		resync := time.NewTicker(c.opts.DataplaneResync)
		defer resync.Stop()
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
			}
		}
	}()
	for c.processNext(ctx) {
	}
	return nil
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
	case keyResync:
		err = c.syncConfig(ctx, true)
	default:
		err = c.syncService(ctx, key)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Sync failed; retrying", "key", printableKey(key))
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

func printableKey(key string) string {
	switch key {
	case keyConfig:
		return "config"
	case keyResync:
		return "resync"
	}
	return key
}

// syncConfig recomputes this node's view of pools and peers, reprograms
// the dataplane (with full, by comparing the whole kernel table, else
// Service by Service from what it last programmed), recomputes every
// Service's routes and reconfigures the sessions. The dataplane comes
// first: a VIP is announced only once this node can forward its traffic.
func (c *Controller) syncConfig(ctx context.Context, full bool) error {
	start := time.Now()
	logger := klog.FromContext(ctx)
	node, err := c.currentNode()
	if err != nil {
		return err
	}
	n, nodeErrs := NodeFrom(node)
	if msg := errors.Join(nodeErrs...); msg != nil && msg.Error() != c.nodeProblem {
		logger.Error(msg, "Node configuration problem", "node", c.opts.NodeName)
		c.recorder.Eventf(node, v1.EventTypeWarning, "InvalidConfig", "%v", msg)
		c.nodeProblem = msg.Error()
	} else if msg == nil {
		c.nodeProblem = ""
	}
	pools := c.listPools(ctx)
	peers := c.listPeers(ctx)
	view, poolErrs := Compile(pools, peers, n)
	// The CCM reports pool problems on the IPPool's status; each speaker
	// logs them once per change, not on every resync.
	var msgs []string
	for _, e := range poolErrs {
		msgs = append(msgs, e.Error())
	}
	if joined := strings.Join(msgs, "; "); joined != c.poolProblems {
		for _, e := range poolErrs {
			logger.Error(e, "IPPool not usable for announcements on this node", "pool", e.Pool, "reason", e.Reason)
		}
		c.poolProblems = joined
	}
	c.view = view

	// Until a first full sync has succeeded every sync is a full one.
	full = full || !c.HasSynced()
	var dpErr error
	if full {
		dpErr = c.resyncDataplane(ctx)
		if dpErr != nil && !c.HasSynced() {
			// Announcing VIPs this node cannot forward would black-hole
			// their traffic: no routes and no sessions until the
			// dataplane works.
			return dpErr
		}
	}
	var announce []bgp.Route
	var withdraw []netip.Prefix
	for _, obj := range c.services.GetStore().List() {
		svc, ok := obj.(*v1.Service)
		if !ok {
			continue
		}
		key := ServiceKey(svc)
		slices := c.slicesOf(svc)
		if !full && c.prog != nil {
			dpErr = errors.Join(dpErr, c.program(ctx, key, c.desiredFor(ctx, svc, slices)))
		}
		routes, _ := ServiceRoutes(svc, slices, c.view)
		a, w := c.table.Set(key, routes)
		announce, withdraw = append(announce, a...), append(withdraw, w...)
	}
	// Services gone from the cache while their delete event was queued.
	for _, key := range c.table.Keys() {
		if _, exists, _ := c.services.GetStore().GetByKey(key); !exists {
			a, w := c.table.Delete(key)
			announce, withdraw = append(announce, a...), append(withdraw, w...)
		}
	}
	if c.prog != nil && !full {
		for key := range c.prog.programmed {
			if _, exists, _ := c.services.GetStore().GetByKey(key); !exists {
				dpErr = errors.Join(dpErr, c.program(ctx, key, nil))
			}
		}
	}
	if c.hasUncertain() {
		// A failed Apply left BGP out of step with the table: hand it the
		// whole table (re-announcing an unchanged route sends nothing) and
		// withdraw whatever it may hold beyond.
		announce, withdraw = c.table.Routes(), c.beyondTable()
	}
	if err := c.apply(ctx, announce, withdraw); err != nil {
		return err
	}
	c.mu.Lock()
	clear(c.uncertain)
	c.mu.Unlock()

	bgpPeers, problems := PeersForNode(peers, n, c.password(ctx))
	c.reportPeerProblems(ctx, peers, problems)
	if err := c.opts.BGP.SetPeers(ctx, bgpPeers); err != nil {
		return fmt.Errorf("configuring BGP peers: %w", err)
	}
	c.mu.Lock()
	c.synced = true // the first table is in BGP and the sessions are configured
	c.mu.Unlock()
	c.opts.Metrics.observeSync("config", start)
	logger.V(2).Info("Configuration synced", "peers", len(bgpPeers), "routes", c.table.Len(),
		"announced", len(announce), "withdrawn", len(withdraw), "duration", time.Since(start))
	return dpErr
}

// syncService recomputes one Service's routes.
func (c *Controller) syncService(ctx context.Context, key string) error {
	if c.view == nil || !c.HasSynced() {
		return nil // the first full sync has not succeeded; it covers this key
	}
	start := time.Now()
	var a []bgp.Route
	var w []netip.Prefix
	obj, exists, err := c.services.GetStore().GetByKey(key)
	switch {
	case err != nil:
		return fmt.Errorf("service %s from cache: %w", key, err)
	case !exists:
		dpErr := c.program(ctx, key, nil)
		a, w = c.table.Delete(key)
		if err := c.apply(ctx, a, w); err != nil {
			return errors.Join(dpErr, err)
		}
		return dpErr
	}
	svc, ok := obj.(*v1.Service)
	if !ok {
		return nil
	}
	slices := c.slicesOf(svc)
	// The dataplane first; routes go either way (a withdrawal must not
	// wait for the kernel), and a dataplane error retries the key.
	dpErr := c.program(ctx, key, c.desiredFor(ctx, svc, slices))
	routes, why := ServiceRoutes(svc, slices, c.view)
	if len(routes) == 0 && len(svc.Status.LoadBalancer.Ingress) > 0 && svc.Spec.LoadBalancerClass == nil {
		klog.FromContext(ctx).V(2).Info("Not announcing", "service", key, "reason", why)
	}
	a, w = c.table.Set(key, routes)
	if err := c.apply(ctx, a, w); err != nil {
		return errors.Join(dpErr, err)
	}
	c.opts.Metrics.observeSync("service", start)
	return dpErr
}

// slicesOf returns one Service's EndpointSlices from the cache.
func (c *Controller) slicesOf(svc *v1.Service) []*discoveryv1.EndpointSlice {
	objs, _ := c.slices.GetIndexer().ByIndex(sliceIndex, ServiceKey(svc))
	slices := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			slices = append(slices, s)
		}
	}
	return slices
}

// apply hands a change to BGP and remembers what is announced.
func (c *Controller) apply(ctx context.Context, announce []bgp.Route, withdraw []netip.Prefix) error {
	if len(announce) == 0 && len(withdraw) == 0 {
		return nil
	}
	if err := c.opts.BGP.Apply(ctx, announce, withdraw); err != nil {
		// The route table already holds the change and BGP may hold part
		// of it: the next config sync re-applies the whole table.
		c.mu.Lock()
		for _, p := range withdraw {
			c.uncertain[p] = true
		}
		for _, r := range announce {
			c.uncertain[r.Prefix] = true
		}
		c.mu.Unlock()
		c.queue.AddRateLimited(keyConfig)
		return fmt.Errorf("announcing %d and withdrawing %d prefixes: %w", len(announce), len(withdraw), err)
	}
	c.mu.Lock()
	for _, p := range withdraw {
		delete(c.announced, p)
	}
	for _, r := range announce {
		c.announced[r.Prefix] = true
	}
	n := len(c.announced)
	c.mu.Unlock()
	c.opts.Metrics.setAnnounced(n)
	klog.FromContext(ctx).V(3).Info("Routes changed", "announced", len(announce), "withdrawn", len(withdraw), "total", n)
	return nil
}

func (c *Controller) hasUncertain() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.uncertain) > 0
}

// beyondTable returns the prefixes BGP has or may have that the route
// table does not want.
func (c *Controller) beyondTable() []netip.Prefix {
	want := map[netip.Prefix]bool{}
	for _, r := range c.table.Routes() {
		want[r.Prefix] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []netip.Prefix
	for _, set := range []map[netip.Prefix]bool{c.announced, c.uncertain} {
		for p := range set {
			if !want[p] {
				want[p] = true // once
				out = append(out, p)
			}
		}
	}
	return out
}

// WithdrawAll withdraws every announced prefix, keeping the sessions up so
// routers learn of the withdrawal at once. It is the first step of a
// graceful shutdown.
func (c *Controller) WithdrawAll(ctx context.Context) error {
	c.mu.Lock()
	prefixes := make([]netip.Prefix, 0, len(c.announced))
	for p := range c.announced {
		prefixes = append(prefixes, p)
	}
	c.mu.Unlock()
	if len(prefixes) == 0 {
		return nil
	}
	if err := c.opts.BGP.Apply(ctx, nil, prefixes); err != nil {
		return fmt.Errorf("withdrawing %d prefixes: %w", len(prefixes), err)
	}
	c.mu.Lock()
	c.announced = map[netip.Prefix]bool{}
	c.mu.Unlock()
	c.opts.Metrics.setAnnounced(0)
	return nil
}

func (c *Controller) currentNode() (*v1.Node, error) {
	obj, exists, err := c.node.GetStore().GetByKey(c.opts.NodeName)
	if err != nil {
		return nil, fmt.Errorf("node %s from cache: %w", c.opts.NodeName, err)
	}
	if !exists {
		// Without the Node nothing may be announced: the empty view
		// withdraws everything until it appears.
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: c.opts.NodeName}}, nil
	}
	node, ok := obj.(*v1.Node)
	if !ok {
		return nil, fmt.Errorf("node %s: unexpected %T in cache", c.opts.NodeName, obj)
	}
	return node, nil
}

func (c *Controller) listPools(ctx context.Context) []*vipcastv1alpha1.IPPool {
	var out []*vipcastv1alpha1.IPPool
	for _, obj := range c.pools.GetStore().List() {
		p := &vipcastv1alpha1.IPPool{}
		if decode(ctx, obj, p) {
			out = append(out, p)
		}
	}
	return out
}

func (c *Controller) listPeers(ctx context.Context) []*vipcastv1alpha1.BGPPeer {
	var out []*vipcastv1alpha1.BGPPeer
	for _, obj := range c.peers.GetStore().List() {
		p := &vipcastv1alpha1.BGPPeer{}
		if decode(ctx, obj, p) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// decode converts an informer's unstructured object into a typed one.
func decode(ctx context.Context, obj any, into runtime.Object) bool {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return false
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, into); err != nil {
		klog.FromContext(ctx).Error(err, "Decoding object", "kind", u.GetKind(), "name", u.GetName())
		return false
	}
	return true
}

// password returns the lookup PeersForNode uses for TCP MD5 passwords:
// a read of the Secret, re-done on every config sync (and so at least every
// resync period), cached within one sync.
func (c *Controller) password(ctx context.Context) func(*vipcastv1alpha1.SecretKeyReference) (string, error) {
	seen := map[string]*v1.Secret{}
	return func(ref *vipcastv1alpha1.SecretKeyReference) (string, error) {
		k := ref.Namespace + "/" + ref.Name
		s, ok := seen[k]
		if !ok {
			var err error
			s, err = c.opts.Client.CoreV1().Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return "", fmt.Errorf("secret %s not found: create it with the key %q", k, ref.KeyOrDefault())
			}
			if err != nil {
				return "", fmt.Errorf("reading secret %s: %w", k, err)
			}
			seen[k] = s
		}
		v, ok := s.Data[ref.KeyOrDefault()]
		if !ok {
			return "", fmt.Errorf("secret %s has no key %q: add it, or set passwordSecretRef.key to the key that holds the password", k, ref.KeyOrDefault())
		}
		return string(v), nil
	}
}

// reportPeerProblems records a Warning Event on each BGPPeer this node
// cannot use, once per distinct problem.
func (c *Controller) reportPeerProblems(ctx context.Context, peers []*vipcastv1alpha1.BGPPeer, problems []PeerError) {
	byName := map[string]*vipcastv1alpha1.BGPPeer{}
	for _, p := range peers {
		byName[p.Name] = p
	}
	current := map[string]string{}
	for _, pe := range problems {
		msg := pe.Error()
		current[pe.Peer] = msg
		if c.peerProblems[pe.Peer] == msg {
			continue
		}
		klog.FromContext(ctx).Error(pe, "BGPPeer not usable on this node", "peer", pe.Peer)
		if p := byName[pe.Peer]; p != nil {
			c.recorder.Eventf(p, v1.EventTypeWarning, pe.Reason, "node %s: %s", c.opts.NodeName, msg)
		}
	}
	c.peerProblems = current
}

// SessionChanged is the bgp engine's callback for a session state change:
// it logs every change and records an Event on the BGPPeer when the session
// comes up or goes down (not for each retry in between).
func (c *Controller) SessionChanged(ctx context.Context, s bgp.SessionState) {
	klog.FromContext(ctx).Info("BGP session state changed", "peer", s.Peer, "address", s.Address, "state", s.State, "reason", s.Reason)
	c.mu.Lock()
	wasUp := c.sessionUp[s.Peer]
	c.sessionUp[s.Peer] = s.Established()
	c.mu.Unlock()
	if wasUp == s.Established() {
		return
	}
	obj, exists, err := c.peers.GetStore().GetByKey(s.Peer)
	if err != nil || !exists {
		return
	}
	p := &vipcastv1alpha1.BGPPeer{}
	if !decode(ctx, obj, p) {
		return
	}
	if s.Established() {
		c.recorder.Eventf(p, v1.EventTypeNormal, "SessionEstablished", "node %s: session with %s established", c.opts.NodeName, s.Address)
		return
	}
	reason := s.Reason
	if reason == "" {
		reason = "no reason given"
	}
	c.recorder.Eventf(p, v1.EventTypeWarning, "SessionDown", "node %s: session with %s went down (%s): %s", c.opts.NodeName, s.Address, s.State, reason)
}
