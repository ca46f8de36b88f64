// Package ccm is vipcast's cloud provider for the Kubernetes
// cloud-controller-manager: LoadBalancer allocates VIPs from IPPools and
// returns them (ipMode Proxy) for the service controller to publish;
// InstancesV2 initializes nodes. The allocation logic lives in ipam; this
// package feeds it Services and IPPools and writes results back.
package ccm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ipam"
	"github.com/vipcast/vipcast/lbclass"
	"github.com/vipcast/vipcast/poolspec"
)

// ProviderName is the cloud provider name vipcast registers
// (--cloud-provider=vipcast, the binary's default).
const ProviderName = "vipcast"

// clientName is the user agent and client name of the provider's own client.
const clientName = "vipcast-ccm"

// errNotReady is returned while the allocator is being rebuilt.
var errNotReady = errors.New("vipcast: allocator is still being rebuilt from Service status; will retry")

// Provider implements cloudprovider.Interface.
type Provider struct {
	alloc   *ipam.Allocator
	metrics *providerMetrics
	// classes says which Services vipcast serves.
	classes lbclass.Selector

	// foreign holds, by owner, the addresses another writer published in
	// the status of a Service vipcast serves: reserved, never overwritten.
	foreignMu sync.Mutex
	foreign   map[string][]netip.Addr
	// displaced holds, by owner, the status addresses restore found held
	// by an older Service that may not share them: vipcast wrote them, and
	// the Service gets others (see restore). Guarded by foreignMu.
	displaced map[string][]netip.Addr

	// ready is closed once pools are loaded and every Service's status has
	// been restored into the allocator: no allocation happens before.
	ready chan struct{}

	// ctx lives as long as the leader term (Initialize's stop channel).
	ctx        context.Context
	client     kubernetes.Interface
	dynFactory dynamicinformer.DynamicSharedInformerFactory
	services   corelisters.ServiceLister
	nsLister   corelisters.NamespaceLister
	pools      *poolController
	peers      *peerStatusController
	annotator  *poolAnnotator

	// retryFailed, set by the service controller, retries at once the
	// Services whose last sync failed; freed calls it when addresses may
	// have become available. Guarded by retryMu.
	retryMu     sync.Mutex
	retryFailed func()
}

var (
	_ cloudprovider.Interface    = (*Provider)(nil)
	_ cloudprovider.InformerUser = (*Provider)(nil)
)

// Register registers the vipcast provider with the cloud-provider package
// under ProviderName; its metrics go to reg (legacyregistry.Register in the
// binary, so they are served on the CCM's /metrics). classes is read when
// the cloud-controller-manager builds the provider, after flag parsing.
func Register(reg func(metrics.Registerable) error, classes *lbclass.Selector) {
	cloudprovider.RegisterCloudProvider(ProviderName, func(io.Reader) (cloudprovider.Interface, error) {
		return New(reg, *classes)
	})
}

// New returns an uninitialized provider serving the Services classes
// serves; the cloud-controller-manager calls Initialize once it holds the
// leader lease.
func New(reg func(metrics.Registerable) error, classes lbclass.Selector) (*Provider, error) {
	p := &Provider{
		alloc:     ipam.New(),
		metrics:   newProviderMetrics(),
		classes:   classes,
		foreign:   map[string][]netip.Addr{},
		displaced: map[string][]netip.Addr{},
		ready:     make(chan struct{}),
	}
	if err := p.metrics.register(reg); err != nil {
		return nil, err
	}
	return p, nil
}

// Initialize builds the provider's clients and its IPPool informer. The
// cloud-controller-manager calls it after winning leader election, then
// hands over its shared informers with SetInformers, which starts the
// rebuild; so each new leader rebuilds from the API server.
func (p *Provider) Initialize(builder cloudprovider.ControllerClientBuilder, stop <-chan struct{}) {
	p.ctx = wait.ContextForChannel(stop)
	if err := p.initClients(builder); err != nil {
		// Without clients nothing can be allocated: EnsureLoadBalancer keeps
		// failing with errNotReady, which the service controller reports.
		klog.FromContext(p.ctx).WithName(clientName).Error(err, "Could not initialize the vipcast provider")
	}
}

func (p *Provider) initClients(builder cloudprovider.ControllerClientBuilder) error {
	cfg, err := builder.Config(clientName)
	if err != nil {
		return fmt.Errorf("client config: %w", err)
	}
	if p.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	p.dynFactory = dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	if p.pools, err = newPoolController(p.alloc, p.metrics, dyn, p.client, p.dynFactory); err != nil {
		return err
	}
	p.pools.loaded = p.freed
	p.peers, err = newPeerStatusController(dyn, p.dynFactory)
	return err
}

// SetInformers takes the cloud-controller-manager's shared informer factory
// (the service controller's Service informer is then also the provider's:
// one watch, one cache) and starts the rebuild: once Services, Namespaces
// and IPPools are synced, pools are loaded and every Service's status is
// restored into the allocator before the first allocation.
func (p *Provider) SetInformers(factory informers.SharedInformerFactory) {
	if p.pools == nil {
		return // Initialize failed; already logged
	}
	ctx := p.ctx
	logger := klog.FromContext(ctx).WithName(clientName)
	svcInformer := factory.Core().V1().Services()
	nsInformer := factory.Core().V1().Namespaces()
	p.services, p.nsLister = svcInformer.Lister(), nsInformer.Lister()
	p.annotator = newPoolAnnotator(p.client, p.services)
	p.pools.useServices(p.services)
	if _, err := svcInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		// Which Services hold which pool's addresses is in the pools'
		// status and decides their finalizer: only a change of what a
		// Service publishes, or of the pool it names, can change that.
		AddFunc: func(obj any) {
			if svc, ok := obj.(*v1.Service); ok && len(svc.Status.LoadBalancer.Ingress) > 0 {
				p.pools.markStatusDirty()
			}
		},
		UpdateFunc: func(old, cur any) {
			if holdingChanged(old, cur) {
				p.pools.markStatusDirty()
			}
		},
		DeleteFunc: func(obj any) {
			p.forgetDeleted(obj)
			p.pools.markStatusDirty()
		},
	}); err != nil {
		logger.Error(err, "Could not watch Services")
		return
	}
	if p.peers != nil {
		if err := p.peers.useNodes(factory.Core().V1().Nodes().Informer()); err != nil {
			logger.Error(err, "Could not watch Nodes for BGPPeer status")
			return
		}
	}
	p.dynFactory.Start(ctx.Done())
	go func() {
		// The app starts the shared factory after all controllers are set up.
		if !cache.WaitForNamedCacheSync(clientName, ctx.Done(),
			svcInformer.Informer().HasSynced, nsInformer.Informer().HasSynced, p.pools.hasSynced) {
			return
		}
		p.pools.syncPools(ctx)
		restored, conflicts := p.restore(ctx)
		close(p.ready)
		logger.Info("Allocator rebuilt from Service status", "services", restored, "conflicts", conflicts)
		p.pools.markStatusDirty()
		go p.annotator.run(ctx)
		go p.runPeerStatus(ctx)
		p.pools.run(ctx)
	}()
}

// runPeerStatus publishes the BGPPeers' Ready conditions once their cache
// is synced. It waits up to speakerStatusSyncWait for the SpeakerStatuses
// too, so the first session counts are right, but not longer: without
// their CRD or RBAC (an upgrade that skipped them) the Ready conditions
// still go on, and the counts follow once they can be read.
func (p *Provider) runPeerStatus(ctx context.Context) {
	if p.peers == nil || !cache.WaitForNamedCacheSync(clientName+"-bgppeers", ctx.Done(), p.peers.hasSynced) {
		return
	}
	wait, cancel := context.WithTimeout(ctx, speakerStatusSyncWait)
	if !cache.WaitForCacheSync(wait.Done(), p.peers.speakers.HasSynced) && ctx.Err() == nil {
		klog.FromContext(ctx).Info("SpeakerStatuses not readable yet: the BGPPeers' session counts follow once they are (apply this release's CRDs and RBAC)")
	}
	cancel()
	p.peers.run(ctx)
}

// speakerStatusSyncWait bounds runPeerStatus's wait for the SpeakerStatuses.
const speakerStatusSyncWait = 10 * time.Second

// restore records every VIP found in a Service's status in the allocator,
// oldest Service first, so a VIP already published is never handed to
// another Service. It returns how many Services were restored and how many
// conflicted with an older holder.
//
// Two Services publish one VIP under requests that may not share it only
// when one of them changed its request (sharing key, ports) while no CCM
// ran to move it. Which one changed is not recorded, so the rule is
// deterministic instead: the older Service (creation time, then
// namespace/name) keeps the VIP, and the newer one is displaced: it gets a
// Warning Event and another VIP, or, while none can be had, publishes none.
func (p *Provider) restore(ctx context.Context) (restored, conflicts int) {
	logger := klog.FromContext(ctx).WithName(clientName)
	svcs, err := p.services.List(labels.Everything())
	if err != nil {
		logger.Error(err, "Listing Services for restore")
		return 0, 0
	}
	sort.Slice(svcs, func(i, j int) bool { return vipcastv1alpha1.OlderFirst(svcs[i], svcs[j]) })
	for _, svc := range svcs {
		ips := statusIPs(svc)
		if len(ips) == 0 {
			continue
		}
		if err := p.alloc.Restore(restoreRequest(svc), ips); err != nil {
			conflicts++
			logger.Error(err, "VIP in Service status conflicts with an older Service; this Service will get a new VIP", "service", klog.KObj(svc), "ips", ips)
			if p.classes.Serves(svc) && p.heldByServed(ips) {
				p.displace(svc, ips, err)
			}
			continue
		}
		if p.classes.Serves(svc) && !p.vipcastWrote(svc, ips) {
			p.markForeign(Owner(svc), ips)
		}
		restored++
	}
	p.reportLegacyShares(ctx, svcs)
	return restored, conflicts
}

// ReasonDisplacedVIP is the reason of the Warning Event on a Service whose
// status lists a VIP that an older Service holds under a request this one
// may not share it with: the older keeps it, this one gets another.
const ReasonDisplacedVIP = "DisplacedSharedVIP"

// displace records that restore found svc's status addresses ips held by
// an older Service that may not share them (why), so its next sync
// replaces them instead of taking them for another writer's.
func (p *Provider) displace(svc *v1.Service, ips []netip.Addr, why error) {
	p.foreignMu.Lock()
	p.displaced[Owner(svc)] = slices.Clone(ips)
	p.foreignMu.Unlock()
	if p.pools != nil && p.pools.recorder != nil {
		p.pools.recorder.Eventf(svc, v1.EventTypeWarning, ReasonDisplacedVIP,
			"its status lists %v, which an older Service publishes too under a request this one may not share it with "+
				"(one of them changed its sharing key or ports while no vipcast-ccm ran); the older Service keeps it and this one gets another VIP: %v",
			ips, why)
	}
}

// heldByServed reports whether every holder of the addresses ips is a
// Service vipcast serves: their statuses are vipcast's writes, not another
// implementation's.
func (p *Provider) heldByServed(ips []netip.Addr) bool {
	for _, ip := range ips {
		for _, owner := range p.alloc.Holders(ip) {
			ns, name, _ := strings.Cut(owner, "/")
			svc, err := p.services.Services(ns).Get(name)
			if err != nil || !p.classes.Serves(svc) {
				return false
			}
		}
	}
	return true
}

// wasDisplaced reports whether restore displaced owner from exactly the
// addresses ips (see displace).
func (p *Provider) wasDisplaced(owner string, ips []netip.Addr) bool {
	p.foreignMu.Lock()
	defer p.foreignMu.Unlock()
	d, ok := p.displaced[owner]
	return ok && sameIPs(d, ips)
}

// ReasonLegacySharedVIP is the reason of the Warning Event on a Service that
// keeps a VIP it shares with Services that today's sharing rules would not
// let it share with (an older release allowed it).
const ReasonLegacySharedVIP = "LegacySharedVIP"

// reportLegacyShares logs and records a Warning Event on every Service that
// restore let keep a VIP shared the way older releases allowed: it keeps the
// VIP (a restore never renumbers), and nobody may join it that way.
func (p *Provider) reportLegacyShares(ctx context.Context, svcs []*v1.Service) {
	logger := klog.FromContext(ctx).WithName(clientName)
	for _, svc := range svcs {
		why := p.alloc.LegacyShare(Owner(svc))
		if why == "" {
			continue
		}
		msg := "keeps its VIP, which it shared before this vipcast release refused such sharing; no other Service can join the VIP this way. " + why
		logger.Info("Service keeps a VIP shared under older sharing rules", "service", klog.KObj(svc), "reason", why)
		p.pools.recorder.Event(svc, v1.EventTypeWarning, ReasonLegacySharedVIP, msg)
	}
}

// forgetDeleted releases what a deleted Service held. A Service vipcast
// served was released before its finalizer went; this covers the others
// (another class's reservations, Services without the finalizer).
func (p *Provider) forgetDeleted(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	svc, ok := obj.(*v1.Service)
	if !ok || !p.isReady() {
		return
	}
	p.forgetForeign(Owner(svc))
	p.release(svc)
}

// onFreed makes freed call retry.
func (p *Provider) onFreed(retry func()) {
	p.retryMu.Lock()
	defer p.retryMu.Unlock()
	p.retryFailed = retry
}

// freed says that addresses may have become available to Services that
// could not get any: IPPools were loaded, or a Service released or moved
// its VIPs. A Service whose sync failed for want of an address, a pool or
// a free requested IP is then retried at once, not after its back-off
// (up to 300 s), as MetalLB reprocesses every Service on such changes.
func (p *Provider) freed() {
	p.retryMu.Lock()
	retry := p.retryFailed
	p.retryMu.Unlock()
	if retry != nil {
		retry()
	}
}

func (p *Provider) isReady() bool {
	select {
	case <-p.ready:
		return true
	default:
		return false
	}
}

// readyWait bounds how long a call waits for the rebuild before it fails
// (and the service controller retries), so a provider that cannot start
// shows up as Events instead of stuck workers.
const readyWait = 30 * time.Second

// waitReady blocks until the allocator is rebuilt, ctx ends or readyWait
// passes.
func (p *Provider) waitReady(ctx context.Context) error {
	timer := time.NewTimer(readyWait)
	defer timer.Stop()
	select {
	case <-p.ready:
		return nil
	case <-timer.C:
		return errNotReady
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", errNotReady, ctx.Err())
	}
}

// LoadBalancer returns the VIP allocator.
func (p *Provider) LoadBalancer() (cloudprovider.LoadBalancer, bool) { return p, true }

// Instances is not implemented: InstancesV2 is.
func (p *Provider) Instances() (cloudprovider.Instances, bool) { return nil, false }

// InstancesV2 initializes nodes (provider ID, addresses, zone and region).
func (p *Provider) InstancesV2() (cloudprovider.InstancesV2, bool) { return instances{}, true }

// Zones is not implemented: InstancesV2 reports zones.
func (p *Provider) Zones() (cloudprovider.Zones, bool) { return nil, false }

// Clusters is not implemented.
func (p *Provider) Clusters() (cloudprovider.Clusters, bool) { return nil, false }

// Routes is not implemented: pod routing is the CNI's job.
func (p *Provider) Routes() (cloudprovider.Routes, bool) { return nil, false }

// ProviderName returns "vipcast".
func (p *Provider) ProviderName() string { return ProviderName }

// HasClusterID reports true: VIPs are not tagged per cluster.
func (p *Provider) HasClusterID() bool { return true }

// statusIPs returns the IP addresses in a Service's load-balancer status.
func statusIPs(svc *v1.Service) []netip.Addr {
	var ips []netip.Addr
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ip, err := netip.ParseAddr(ing.IP); err == nil && ip.Zone() == "" {
			ips = append(ips, ip.Unmap())
		}
	}
	return ips
}

// sameIPs reports whether a and b hold the same addresses, in any order.
func sameIPs(a, b []netip.Addr) bool {
	return len(newIPs(a, b)) == 0 && len(newIPs(b, a)) == 0
}

// restoreRequest describes a Service for Restore without validating its
// annotations: a malformed annotation must not cost a Service its VIP.
func restoreRequest(svc *v1.Service) ipam.Request {
	req, err := RequestFor(svc, nil)
	if err == nil {
		return req
	}
	req = baseRequest(svc)
	req.Families, req.RequireAllFamilies = families(svc)
	return req
}

// holdingChanged reports whether a Service update can change which pool
// holds which published address: its status addresses, the pool its
// annotations name (poolspec.HeldBy), its type or its class.
func holdingChanged(old, cur any) bool {
	o, ok1 := old.(*v1.Service)
	n, ok2 := cur.(*v1.Service)
	if !ok1 || !ok2 {
		return true
	}
	return !reflect.DeepEqual(o.Status.LoadBalancer.Ingress, n.Status.LoadBalancer.Ingress) ||
		poolspec.HeldBy(o.Annotations) != poolspec.HeldBy(n.Annotations) ||
		o.Spec.Type != n.Spec.Type || !reflect.DeepEqual(o.Spec.LoadBalancerClass, n.Spec.LoadBalancerClass)
}
