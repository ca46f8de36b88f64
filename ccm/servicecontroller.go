package ccm

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	v1core "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	servicehelper "k8s.io/cloud-provider/service/helpers"
	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/svcspec"
)

// Retry delays of a failed sync: the stock service controller's.
const (
	minRetryDelay = 5 * time.Second
	maxRetryDelay = 300 * time.Second
)

// eventComponent is the source of the controller's Events, the stock
// service controller's, so tools that watch for them keep working.
const eventComponent = "service-controller"

// ServiceController is vipcast's service controller; it replaces the stock
// cloud-provider one, which serves only Services without a
// spec.loadBalancerClass. It serves the Services the provider's
// lbclass.Selector serves, with the stock controller's semantics: the
// finalizer service.kubernetes.io/load-balancer-cleanup is added before a
// VIP is allocated and removed once it is released; the status is patched
// only when it changes; Events EnsuringLoadBalancer, EnsuredLoadBalancer,
// SyncLoadBalancerFailed, DeletingLoadBalancer and DeletedLoadBalancer.
// Two things differ: a served Service whose status lists addresses vipcast
// did not publish is left alone with a ForeignLoadBalancerStatus Warning
// (see Provider.foreignStatus), and a Service vipcast does not serve has its
// published addresses reserved, and released when it stops publishing them.
type ServiceController struct {
	p        *Provider
	client   kubernetes.Interface
	lister   corelisters.ServiceLister
	synced   cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder

	// failing holds the keys of the Services whose last sync failed.
	failingMu sync.Mutex
	failing   map[string]bool

	// judged holds, by Service key, the dataplane problems last reported
	// (svcspec.Problems, joined), so that each is reported once.
	judgedMu sync.Mutex
	judged   map[string]string
}

// ReasonInvalidDataplaneConfig is the reason of the Warning Event on a
// Service whose ports, IPVS scheduler annotation or source ranges the
// dataplane cannot use as written (svcspec.Problems). vipcast-ccm judges
// them once for the cluster; the speakers program what is usable and log
// the rest, so a bad annotation costs one Event, not one per node.
const ReasonInvalidDataplaneConfig = "InvalidDataplaneConfig"

// NewServiceController builds the controller on the Service informer the
// provider also uses (SetInformers), so both see the same cache.
func NewServiceController(p *Provider, client kubernetes.Interface, services coreinformers.ServiceInformer) (*ServiceController, error) {
	c := &ServiceController{
		p:      p,
		client: client,
		lister: services.Lister(),
		synced: services.Informer().HasSynced,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](minRetryDelay, maxRetryDelay),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "service"}),
		failing: map[string]bool{},
		judged:  map[string]string{},
	}
	p.onFreed(c.retryFailed)
	_, err := services.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if svc, ok := obj.(*v1.Service); ok && (p.classes.Serves(svc) || needsCleanup(svc)) {
				c.enqueue(svc)
			}
		},
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*v1.Service)
			n, ok2 := cur.(*v1.Service)
			if ok1 && ok2 && c.needsSync(o, n) {
				c.enqueue(n)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watching Services: %w", err)
	}
	return c, nil
}

func (c *ServiceController) enqueue(svc *v1.Service) { c.queue.Add(Owner(svc)) }

// needsSync reports whether an update may change what vipcast does for the
// Service: cleanup, a change of whether it is served, of its spec, labels
// or annotations, or a status vipcast did not write.
func (c *ServiceController) needsSync(old, cur *v1.Service) bool {
	served := c.p.classes.Serves(cur)
	switch {
	case needsCleanup(cur), served != c.p.classes.Serves(old), old.UID != cur.UID:
		return true
	case !sameIPs(statusIPs(old), statusIPs(cur)):
		// Unserved: its reservation follows its status. Served: only a
		// status vipcast does not hold can be another writer's.
		a, _ := c.p.alloc.Assigned(Owner(cur))
		return !served || !sameIPs(a.IPs, statusIPs(cur))
	case !served:
		return old.Spec.Type != cur.Spec.Type
	}
	return !reflect.DeepEqual(old.Spec, cur.Spec) || !reflect.DeepEqual(old.Annotations, cur.Annotations) ||
		!reflect.DeepEqual(old.Labels, cur.Labels)
}

// Run starts workers syncing Services until ctx ends.
func (c *ServiceController) Run(ctx context.Context, workers int) {
	defer runtime.HandleCrash()
	defer c.queue.ShutDown()
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartStructuredLogging(0)
	broadcaster.StartRecordingToSink(&v1core.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	c.recorder = broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: eventComponent})

	logger := klog.FromContext(ctx)
	logger.Info("Starting vipcast service controller", "serves", c.p.classes.String())
	defer logger.Info("Shutting down vipcast service controller")
	if !cache.WaitForNamedCacheSync("vipcast-service", ctx.Done(), c.synced) {
		return
	}
	for range workers {
		go wait.UntilWithContext(ctx, c.worker, time.Second)
	}
	<-ctx.Done()
}

func (c *ServiceController) worker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

func (c *ServiceController) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	err := c.sync(ctx, key)
	c.failingMu.Lock()
	if err != nil {
		c.failing[key] = true
	} else {
		delete(c.failing, key)
	}
	c.failingMu.Unlock()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Syncing Service failed; retrying with backoff", "service", key)
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// retryFailed queues every Service whose last sync failed, at once; their
// back-off delays still run and lead to another sync, which finds nothing
// to do if this one succeeded.
func (c *ServiceController) retryFailed() {
	c.failingMu.Lock()
	defer c.failingMu.Unlock()
	for key := range c.failing {
		c.queue.Add(key)
	}
}

// sync brings one Service in line: it serves it, cleans up after it, or
// keeps the reservation of another implementation's addresses.
func (c *ServiceController) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil //nolint:nilerr // keys come from Owner and always split
	}
	svc, err := c.lister.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.judge(key, nil)
		return nil // released by the provider's delete handler
	}
	if err != nil {
		return fmt.Errorf("reading Service %s from the cache: %w", key, err)
	}
	if err := c.p.waitReady(ctx); err != nil {
		return err
	}
	switch {
	case c.p.classes.Serves(svc) && svc.DeletionTimestamp == nil:
		c.judge(key, svc)
		err = c.ensure(ctx, svc)
	case servicehelper.HasLBFinalizer(svc) && c.p.classes.ServesClassOf(svc):
		c.judge(key, nil)
		err = c.cleanup(ctx, svc)
	default:
		c.p.reserveForeign(ctx, svc)
		return nil
	}
	if err != nil {
		c.recorder.Eventf(svc, v1.EventTypeWarning, "SyncLoadBalancerFailed", "Error syncing load balancer: %v", err)
	}
	return err
}

// judge reports, with a Warning Event on svc, a change of what is wrong
// with its ports, scheduler annotation or source ranges (svcspec.Problems);
// a nil svc (deleted, or no longer served) forgets the Service key.
func (c *ServiceController) judge(key string, svc *v1.Service) {
	msg := ""
	if svc != nil {
		msg = strings.Join(svcspec.Problems(svc), "; ")
	}
	c.judgedMu.Lock()
	last := c.judged[key]
	if msg == "" {
		delete(c.judged, key)
	} else {
		c.judged[key] = msg
	}
	c.judgedMu.Unlock()
	if msg != "" && msg != last {
		c.recorder.Event(svc, v1.EventTypeWarning, ReasonInvalidDataplaneConfig, msg)
	}
}

// ensure allocates the Service's VIPs and publishes them, unless its status
// is another writer's.
func (c *ServiceController) ensure(ctx context.Context, svc *v1.Service) error {
	svc, foreign, err := c.p.foreignStatus(ctx, c.client, svc)
	if err != nil {
		return err
	}
	if foreign != "" {
		c.recorder.Event(svc, v1.EventTypeWarning, ReasonForeignStatus, foreign)
		return nil
	}
	klog.FromContext(ctx).V(2).Info("Ensuring load balancer", "service", klog.KObj(svc))
	c.recorder.Event(svc, v1.EventTypeNormal, "EnsuringLoadBalancer", "Ensuring load balancer")
	if err := c.setFinalizer(ctx, svc, true); err != nil {
		return fmt.Errorf("failed to add load balancer cleanup finalizer: %w", err)
	}
	status, err := c.p.EnsureLoadBalancer(ctx, "", svc, nil)
	if err != nil {
		if status != nil {
			// The Service gave up VIPs it holds no more: they leave its
			// status now, not once its request can be served.
			if perr := c.patchStatus(ctx, svc, status); perr != nil {
				return fmt.Errorf("failed to ensure load balancer: %w (and withdrawing VIPs it no longer holds: %w)", err, perr)
			}
		}
		return fmt.Errorf("failed to ensure load balancer: %w", err)
	}
	c.recorder.Event(svc, v1.EventTypeNormal, "EnsuredLoadBalancer", "Ensured load balancer")
	return c.patchStatus(ctx, svc, status)
}

// cleanup releases a Service vipcast served that is being deleted or is no
// longer of type LoadBalancer, then removes the finalizer and the status.
func (c *ServiceController) cleanup(ctx context.Context, svc *v1.Service) error {
	if _, exists, err := c.p.GetLoadBalancer(ctx, "", svc); err != nil {
		return fmt.Errorf("failed to check if load balancer exists before cleanup: %w", err)
	} else if exists {
		klog.FromContext(ctx).V(2).Info("Deleting load balancer", "service", klog.KObj(svc))
		c.recorder.Event(svc, v1.EventTypeNormal, "DeletingLoadBalancer", "Deleting load balancer")
		if err := c.p.EnsureLoadBalancerDeleted(ctx, "", svc); err != nil {
			return fmt.Errorf("failed to delete load balancer: %w", err)
		}
	}
	c.p.forgetForeign(Owner(svc))
	if err := c.setFinalizer(ctx, svc, false); err != nil {
		return fmt.Errorf("failed to remove load balancer cleanup finalizer: %w", err)
	}
	c.recorder.Event(svc, v1.EventTypeNormal, "DeletedLoadBalancer", "Deleted load balancer")
	return c.patchStatus(ctx, svc, &v1.LoadBalancerStatus{})
}

// setFinalizer adds or removes service.kubernetes.io/load-balancer-cleanup.
func (c *ServiceController) setFinalizer(ctx context.Context, svc *v1.Service, want bool) error {
	if servicehelper.HasLBFinalizer(svc) == want {
		return nil
	}
	updated := svc.DeepCopy()
	if want {
		updated.Finalizers = append(updated.Finalizers, servicehelper.LoadBalancerCleanupFinalizer)
	} else {
		updated.Finalizers = slices.DeleteFunc(updated.Finalizers, func(f string) bool {
			return f == servicehelper.LoadBalancerCleanupFinalizer
		})
	}
	klog.FromContext(ctx).V(2).Info("Patching finalizer", "service", klog.KObj(svc), "add", want)
	_, err := servicehelper.PatchService(c.client.CoreV1(), svc, updated)
	return err
}

// patchStatus writes status unless the Service already has it; a Service
// gone meanwhile is not an error.
func (c *ServiceController) patchStatus(ctx context.Context, svc *v1.Service, status *v1.LoadBalancerStatus) error {
	if servicehelper.LoadBalancerStatusEqual(&svc.Status.LoadBalancer, status) {
		return nil
	}
	updated := svc.DeepCopy()
	updated.Status.LoadBalancer = *status
	klog.FromContext(ctx).V(2).Info("Patching status", "service", klog.KObj(svc))
	if _, err := servicehelper.PatchService(c.client.CoreV1(), svc, updated); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("failed to update load balancer status: %w", err)
	}
	return nil
}

// needsCleanup reports a Service carrying the cleanup finalizer that is
// being deleted or no longer of type LoadBalancer (the stock rule).
func needsCleanup(svc *v1.Service) bool {
	if !servicehelper.HasLBFinalizer(svc) {
		return false
	}
	return svc.DeletionTimestamp != nil || svc.Spec.Type != v1.ServiceTypeLoadBalancer
}
