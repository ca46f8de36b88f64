package speaker

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"sort"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
)

// sliceIndex indexes EndpointSlices by the namespace/name of their Service.
const sliceIndex = "service"

// sliceNodeIndex indexes EndpointSlices by the nodes of their endpoints.
const sliceNodeIndex = "node"

// watched holds the speaker's informers and reads the API objects from
// their caches, decoded: Services, EndpointSlices, this Node, IPPools and
// BGPPeers, and the password Secrets it is told to read, each by name.
// Nothing is read from the API server outside the informers, so an outage
// changes nothing the decisions see: the caches keep the last state until
// the watches resume.
type watched struct {
	nodeName string
	// factory watches the LoadBalancer Services (a field selector) and
	// the EndpointSlices of Services that are not headless (kube-proxy's
	// label selector, without its service-proxy-name part: vipcast serves
	// the VIPs of Services another proxy handles).
	factory  informers.SharedInformerFactory
	nodes    informers.SharedInformerFactory
	dynamic  dynamicinformer.DynamicSharedInformerFactory
	services cache.SharedIndexInformer
	slices   cache.SharedIndexInformer
	node     cache.SharedIndexInformer
	// tunnels watches the NodeTunnels the nodes' speakers publish (the
	// two-tier dataplane's other nodes); nil with one tier. changedNodes
	// are the nodes whose address came, went or changed since the worker
	// last took them (takeChangedNodes). ownTunnel is called when this
	// node's own NodeTunnel changes or goes.
	tunnels      cache.SharedIndexInformer
	ownTunnel    func()
	nodesMu      sync.Mutex
	changedNodes map[string]bool
	pools        cache.SharedIndexInformer
	peers        cache.SharedIndexInformer
	// speakers watches the EndpointSlices of Options.SpeakerService (a
	// headless Service, which factory leaves out) when tier 1 follows the
	// speakers' readiness; nil otherwise.
	speakers     cache.SharedIndexInformer
	speakersFrom informers.SharedInformerFactory
	// secrets has one Secret informer per password Secret
	// (Options.PasswordSecrets), by namespace/name.
	secrets map[types.NamespacedName]cache.SharedIndexInformer
	// secretFactories start them.
	secretFactories []informers.SharedInformerFactory
	// hold reads the EndpointSlices through an API-server outage's
	// aftermath (Options.OutageSettle); nil: as they come.
	hold *outageHold
}

// newWatched creates the informers and routes their events to q: a
// Service's key for a Service or EndpointSlice change, keyConfig for a
// change of the node, the pools or the peers.
func newWatched(opts Options, q workqueue.TypedRateLimitingInterface[string]) (*watched, error) {
	w := &watched{
		nodeName: opts.NodeName,
		factory: informers.NewSharedInformerFactoryWithOptions(opts.Client, 0,
			informers.WithTransform(slimObject),
		),
		nodes: informers.NewSharedInformerFactoryWithOptions(opts.Client, 0, informers.WithTransform(slimObject),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", opts.NodeName).String()
			})),
		dynamic: dynamicinformer.NewDynamicSharedInformerFactory(opts.Dynamic, 0),
	}
	if opts.OutageSettle > 0 {
		w.hold = &outageHold{settle: opts.OutageSettle, now: time.Now}
	}
	w.services, w.slices = selectedInformers(w.factory)
	w.node = w.nodes.Core().V1().Nodes().Informer()
	w.pools = w.dynamic.ForResource(vipcastv1alpha1.IPPoolsResource).Informer()
	w.peers = w.dynamic.ForResource(vipcastv1alpha1.BGPPeersResource).Informer()
	slim := []cache.SharedIndexInformer{w.pools, w.peers}
	if opts.TunnelPrefix.IsValid() {
		w.tunnels = w.dynamic.ForResource(vipcastv1alpha1.NodeTunnelsResource).Informer()
		if _, err := w.tunnels.AddEventHandler(w.tunnelsHandler(q)); err != nil {
			return nil, fmt.Errorf("event handler: %w", err)
		}
		slim = append(slim, w.tunnels)
	}
	for _, inf := range slim {
		if err := inf.SetTransform(slimObject); err != nil {
			return nil, fmt.Errorf("informer transform: %w", err)
		}
	}

	if err := w.watchSecrets(opts, q); err != nil {
		return nil, err
	}
	if err := w.slices.AddIndexers(w.sliceIndexers()); err != nil {
		return nil, fmt.Errorf("endpointslice index: %w", err)
	}
	if opts.TunnelPrefix.IsValid() && opts.SpeakerService != "" {
		if err := w.watchSpeakers(opts, q); err != nil {
			return nil, err
		}
	}
	handlers := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{w.services, keysHandler(q, serviceKeys)},
		{w.slices, keysHandler(q, sliceServiceKey)},
		// The field selector keeps other Nodes out; so does the filter,
		// whatever the server (a fake API ignores field selectors).
		{w.node, cache.FilteringResourceEventHandler{FilterFunc: w.isThisNode, Handler: configHandler(q, sameNode)}},
		{w.pools, configHandler(q, sameSpec)},
		{w.peers, configHandler(q, sameSpec)},
	}
	for _, h := range handlers {
		if _, err := h.inf.AddEventHandler(h.h); err != nil {
			return nil, fmt.Errorf("event handler: %w", err)
		}
	}
	return w, nil
}

// selectedInformers returns factory's informers of the LoadBalancer
// Services and of the EndpointSlices of Services that are not headless
// (ServiceFieldSelector, SliceLabelSelector).
func selectedInformers(factory informers.SharedInformerFactory) (services, slices cache.SharedIndexInformer) {
	indexers := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	services = factory.InformerFor(&v1.Service{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredServiceInformer(c, v1.NamespaceAll, resync, indexers,
			func(o *metav1.ListOptions) { o.FieldSelector = ServiceFieldSelector })
	})
	slices = factory.InformerFor(&discoveryv1.EndpointSlice{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return discoveryinformers.NewFilteredEndpointSliceInformer(c, v1.NamespaceAll, resync, indexers,
			func(o *metav1.ListOptions) { o.LabelSelector = SliceLabelSelector })
	})
	return services, slices
}

// watchSpeakers watches the EndpointSlices of the speakers' headless
// Service (Options.SpeakerService) alone, a full recompute queued on q when
// the nodes with a ready speaker change.
func (w *watched) watchSpeakers(opts Options, q workqueue.TypedRateLimitingInterface[string]) error {
	ns, name, err := cache.SplitMetaNamespaceKey(opts.SpeakerService)
	if err != nil {
		return fmt.Errorf("speaker Service %q: %w", opts.SpeakerService, err)
	}
	w.speakersFrom = informers.NewSharedInformerFactoryWithOptions(opts.Client, 0, informers.WithTransform(slimObject),
		informers.WithNamespace(ns), informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + "=" + name
		}))
	w.speakers = w.speakersFrom.Discovery().V1().EndpointSlices().Informer()
	if _, err := w.speakers.AddEventHandler(speakersHandler(q, opts.SpeakerService)); err != nil {
		return fmt.Errorf("event handler: %w", err)
	}
	return nil
}

// start starts the informers and waits until their caches are filled.
func (w *watched) start(ctx context.Context) error {
	w.factory.Start(ctx.Done())
	w.nodes.Start(ctx.Done())
	w.dynamic.Start(ctx.Done())
	synced := []cache.InformerSynced{w.services.HasSynced, w.slices.HasSynced, w.node.HasSynced, w.pools.HasSynced, w.peers.HasSynced}
	if w.tunnels != nil {
		synced = append(synced, w.tunnels.HasSynced)
	}
	if w.speakers != nil {
		w.speakersFrom.Start(ctx.Done())
		synced = append(synced, w.speakers.HasSynced)
	}
	for _, f := range w.secretFactories {
		f.Start(ctx.Done())
	}
	for _, inf := range w.secrets {
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("informer caches did not sync: %w", ctx.Err())
	}
	return nil
}

// keysHandler enqueues the keys that keys returns for every added, updated
// or deleted object.
func keysHandler(q workqueue.TypedRateLimitingInterface[string], keys func(any) ([]string, error)) cache.ResourceEventHandler {
	add := func(obj any) {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		ks, _ := keys(obj)
		for _, k := range ks {
			q.Add(k)
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    add,
		UpdateFunc: func(_, cur any) { add(cur) },
		DeleteFunc: add,
	}
}

// serviceKeys returns a Service's queue key.
func serviceKeys(obj any) ([]string, error) {
	key, err := cache.MetaNamespaceKeyFunc(obj)
	if err != nil {
		return nil, err
	}
	return []string{key}, nil
}

// configHandler enqueues a full recompute (keyConfig) for an added or
// deleted object, and for an update unless unchanged says the decisions
// cannot see it.
func configHandler(q workqueue.TypedRateLimitingInterface[string], unchanged func(old, cur any) bool) cache.ResourceEventHandler {
	add := func(any) { q.Add(keyConfig) }
	return cache.ResourceEventHandlerFuncs{
		AddFunc: add,
		UpdateFunc: func(old, cur any) {
			if !unchanged(old, cur) {
				add(cur)
			}
		},
		DeleteFunc: add,
	}
}

// sameNode reports whether a Node update leaves what the decisions see
// (labels, cordon, addresses, the local-ASN annotation) unchanged, as a
// status heartbeat does.
func sameNode(old, cur any) bool {
	o, ok1 := old.(*v1.Node)
	n, ok2 := cur.(*v1.Node)
	if !ok1 || !ok2 {
		return false
	}
	a, errsA := NodeFrom(o)
	b, errsB := NodeFrom(n)
	return reflect.DeepEqual(a, b) && len(errsA) == len(errsB) &&
		o.Annotations[AnnotationLocalASN] == n.Annotations[AnnotationLocalASN]
}

// sameSpec reports whether an IPPool or BGPPeer update changes neither
// metadata.generation nor the labels (peer selectors match labels): a
// status write.
func sameSpec(old, cur any) bool {
	o, ok1 := old.(*unstructured.Unstructured)
	n, ok2 := cur.(*unstructured.Unstructured)
	return ok1 && ok2 && o.GetGeneration() == n.GetGeneration() && maps.Equal(o.GetLabels(), n.GetLabels())
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

// managedByController is the EndpointSlice controller's value of the
// discoveryv1.LabelManagedBy label.
const managedByController = "endpointslice-controller.k8s.io"

// readyNodes returns the nodes of a's ready endpoints (conditions.ready
// true or unset) and terminating ones, when a is an EndpointSlice the
// EndpointSlice controller manages; nil otherwise.
//
// A terminating speaker (a rollout, a SIGTERM) withdraws its routes and
// keeps its kernel state, so its node still decapsulates and serves: it
// keeps its tier-1 weight until its endpoint is gone. Draining it at once
// would split the nodes' tables while the routers still send it flows: a
// connection it took just before it withdrew, moved by ECMP before
// connection sync carried it, would meet another node's choice.
func readyNodes(a any) map[string]bool {
	if t, ok := a.(cache.DeletedFinalStateUnknown); ok {
		a = t.Obj
	}
	s, ok := a.(*discoveryv1.EndpointSlice)
	if !ok || s.Labels[discoveryv1.LabelManagedBy] != managedByController {
		return nil
	}
	out := map[string]bool{}
	for _, e := range s.Endpoints {
		if e.NodeName == nil || *e.NodeName == "" {
			continue
		}
		if e.Conditions.Ready == nil || *e.Conditions.Ready || (e.Conditions.Terminating != nil && *e.Conditions.Terminating) {
			out[*e.NodeName] = true
		}
	}
	return out
}

// speakersHandler enqueues a full recompute when an EndpointSlice of the
// speakers' Service (key, namespace/name) comes, goes, or changes which
// nodes have a ready speaker.
func speakersHandler(q workqueue.TypedRateLimitingInterface[string], key string) cache.ResourceEventHandler {
	ours := func(obj any) bool {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		ks, _ := sliceServiceKey(obj)
		return len(ks) == 1 && ks[0] == key
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if ours(obj) {
				q.Add(keyConfig)
			}
		},
		UpdateFunc: func(old, cur any) {
			if ours(cur) && !maps.Equal(readyNodes(old), readyNodes(cur)) {
				q.Add(keyConfig)
			}
		},
		DeleteFunc: func(obj any) {
			if ours(obj) {
				q.Add(keyConfig)
			}
		},
	}
}

// speakersReady returns the nodes with a ready speaker: a ready endpoint
// of the speakers' Service (Options.SpeakerService) in an EndpointSlice
// the EndpointSlice controller manages. Nil when readiness is not watched.
func (w *watched) speakersReady() map[string]bool {
	if w.speakers == nil {
		return nil
	}
	out := map[string]bool{}
	for _, s := range w.held(storeSlices(w.speakers)) {
		maps.Copy(out, readyNodes(s))
	}
	return out
}

// storeSlices returns the EndpointSlices in inf's cache.
func storeSlices(inf cache.SharedIndexInformer) []*discoveryv1.EndpointSlice {
	objs := inf.GetStore().List()
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			out = append(out, s)
		}
	}
	return out
}

// held returns slices as the outage hold reads them.
func (w *watched) held(slices []*discoveryv1.EndpointSlice) []*discoveryv1.EndpointSlice {
	out, _ := w.heldCount(slices)
	return out
}

// heldCount returns slices as the outage hold reads them, and how many
// endpoints it reads as ready against the slices' word.
func (w *watched) heldCount(slices []*discoveryv1.EndpointSlice) ([]*discoveryv1.EndpointSlice, int) {
	if w.hold == nil {
		return slices, 0
	}
	return w.hold.apply(slices)
}

// outageBegins starts the outage hold, if any, from the caches'
// EndpointSlices (the Services' and the speakers').
func (w *watched) outageBegins() {
	if w.hold == nil {
		return
	}
	all := storeSlices(w.slices)
	if w.speakers != nil {
		all = append(all, storeSlices(w.speakers)...)
	}
	w.hold.begin(all)
}

// service returns the Service with the given key from the cache; nil when
// it is gone.
func (w *watched) service(key string) (*v1.Service, error) {
	obj, exists, err := w.services.GetStore().GetByKey(key)
	if err != nil {
		return nil, fmt.Errorf("service %s from cache: %w", key, err)
	}
	if !exists {
		return nil, nil
	}
	svc, ok := obj.(*v1.Service)
	if !ok {
		return nil, fmt.Errorf("service %s: unexpected %T in cache", key, obj)
	}
	return svc, nil
}

// listServices returns every Service in the cache.
func (w *watched) listServices() []*v1.Service {
	objs := w.services.GetStore().List()
	out := make([]*v1.Service, 0, len(objs))
	for _, obj := range objs {
		if svc, ok := obj.(*v1.Service); ok {
			out = append(out, svc)
		}
	}
	return out
}

// slicesOf returns one Service's EndpointSlices from the cache, as the
// outage hold reads them.
func (w *watched) slicesOf(svc *v1.Service) []*discoveryv1.EndpointSlice {
	out, _ := w.heldSlicesOf(svc)
	return out
}

// heldSlicesOf is slicesOf, with how many endpoints the outage hold reads
// as ready against the slices' word.
func (w *watched) heldSlicesOf(svc *v1.Service) ([]*discoveryv1.EndpointSlice, int) {
	objs, _ := w.slices.GetIndexer().ByIndex(sliceIndex, ServiceKey(svc))
	slices := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			slices = append(slices, s)
		}
	}
	return w.heldCount(slices)
}

// sliceIndexers are the EndpointSlice indexes: by Service, and with two
// tiers by node (servicesOnNodes).
func (w *watched) sliceIndexers() cache.Indexers {
	out := cache.Indexers{sliceIndex: sliceServiceKey}
	if w.tunnels != nil {
		out[sliceNodeIndex] = sliceNodes
	}
	return out
}

// isThisNode reports whether obj is this node's Node.
func (w *watched) isThisNode(obj any) bool {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	n, ok := obj.(*v1.Node)
	return ok && n.Name == w.nodeName
}

// currentNode returns this node from the cache; a Node with only its name
// when it does not exist, so that nothing is announced until it appears.
func (w *watched) currentNode() (*v1.Node, error) {
	obj, exists, err := w.node.GetStore().GetByKey(w.nodeName)
	if err != nil {
		return nil, fmt.Errorf("node %s from cache: %w", w.nodeName, err)
	}
	if !exists {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: w.nodeName}}, nil
	}
	node, ok := obj.(*v1.Node)
	if !ok {
		return nil, fmt.Errorf("node %s: unexpected %T in cache", w.nodeName, obj)
	}
	return node, nil
}

// listPools returns the IPPools in the cache that decode.
func (w *watched) listPools(ctx context.Context) []*vipcastv1alpha1.IPPool {
	return decodeAll[vipcastv1alpha1.IPPool](ctx, w.pools)
}

// listPeers returns the BGPPeers in the cache that decode, sorted by name.
func (w *watched) listPeers(ctx context.Context) []*vipcastv1alpha1.BGPPeer {
	out := decodeAll[vipcastv1alpha1.BGPPeer](ctx, w.peers)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// decodeAll returns the objects of a dynamic informer's cache that decode
// into T.
func decodeAll[T any, P interface {
	*T
	runtime.Object
}](ctx context.Context, inf cache.SharedIndexInformer) []P {
	objs := inf.GetStore().List()
	out := make([]P, 0, len(objs))
	for _, obj := range objs {
		p := P(new(T))
		if decode(ctx, obj, p) {
			out = append(out, p)
		}
	}
	return out
}

// peer returns the BGPPeer called name from the cache, or nil.
func (w *watched) peer(ctx context.Context, name string) *vipcastv1alpha1.BGPPeer {
	obj, exists, err := w.peers.GetStore().GetByKey(name)
	if err != nil || !exists {
		return nil
	}
	p := &vipcastv1alpha1.BGPPeer{}
	if !decode(ctx, obj, p) {
		return nil
	}
	return p
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

// ServiceFieldSelector and SliceLabelSelector narrow the speaker's
// watches to what it can serve: LoadBalancer Services (the API server
// filters by spec.type), and EndpointSlices of Services that are not
// headless (a LoadBalancer Service has a cluster IP), as kube-proxy
// selects them. kube-proxy also leaves out Services labelled
// service.kubernetes.io/service-proxy-name, which another proxy handles;
// the speaker does not: it serves their VIPs.
const (
	ServiceFieldSelector = "spec.type=" + string(v1.ServiceTypeLoadBalancer)
	SliceLabelSelector   = "!" + v1.IsHeadlessService
)

// slimObject drops from an object, before the informers cache it, what
// the speaker never reads: managedFields (often the largest part of an
// object), kubectl's last-applied annotation, and a Node's image and
// volume lists.
func slimObject(obj any) (any, error) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		slim, err := slimObject(t.Obj)
		return cache.DeletedFinalStateUnknown{Key: t.Key, Obj: slim}, err
	}
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
		if a := m.GetAnnotations(); a[v1.LastAppliedConfigAnnotation] != "" {
			a = maps.Clone(a)
			delete(a, v1.LastAppliedConfigAnnotation)
			m.SetAnnotations(a)
		}
	}
	if n, ok := obj.(*v1.Node); ok {
		n.Status.Images, n.Status.VolumesInUse, n.Status.VolumesAttached = nil, nil, nil
	}
	return obj, nil
}
