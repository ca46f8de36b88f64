package ccm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ipam"
	"github.com/vipcast/vipcast/poolspec"
)

// Queue keys of the pool controller.
const (
	keyPools  = "pools"  // reload the pool configuration into the allocator
	keyStatus = "status" // write IPPool status (capacity, in use, Ready)
)

// statusDelay coalesces status writes while many Services are allocated.
const statusDelay = time.Second

// poolController loads IPPools into the allocator and publishes each pool's
// capacity, usage and Ready condition in its status and in metrics.
type poolController struct {
	alloc    *ipam.Allocator
	metrics  *providerMetrics
	dyn      dynamic.Interface
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder

	mu       sync.Mutex
	rejected map[string]rejection // pool name → why it is not installed
	known    map[string]bool      // pools with metrics exported
}

func newPoolController(alloc *ipam.Allocator, m *providerMetrics, dyn dynamic.Interface, client kubernetes.Interface, factory dynamicinformer.DynamicSharedInformerFactory) (*poolController, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	if err := vipcastv1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("scheme: %w", err)
	}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})

	pc := &poolController{
		alloc:    alloc,
		metrics:  m,
		dyn:      dyn,
		informer: factory.ForResource(vipcastv1alpha1.IPPoolsResource).Informer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "ippools"}),
		recorder: broadcaster.NewRecorder(scheme, v1.EventSource{Component: clientName}),
		rejected: map[string]rejection{},
		known:    map[string]bool{},
	}
	enqueue := func(any) { pc.queue.Add(keyPools) }
	if _, err := pc.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(old, cur any) {
			// Our own status writes come back here: only a spec change
			// (a new generation) needs the pools reloaded.
			o, ok1 := old.(*unstructured.Unstructured)
			c, ok2 := cur.(*unstructured.Unstructured)
			if ok1 && ok2 && o.GetGeneration() == c.GetGeneration() {
				return
			}
			enqueue(cur)
		},
		DeleteFunc: enqueue,
	}); err != nil {
		return nil, fmt.Errorf("ippool handler: %w", err)
	}
	return pc, nil
}

func (pc *poolController) hasSynced() bool { return pc.informer.HasSynced() }

// markStatusDirty schedules a status write; calls within statusDelay coalesce.
func (pc *poolController) markStatusDirty() {
	if pc != nil {
		pc.queue.AddAfter(keyStatus, statusDelay)
	}
}

// run processes the queue until ctx ends.
func (pc *poolController) run(ctx context.Context) {
	go func() { <-ctx.Done(); pc.queue.ShutDown() }()
	for {
		key, quit := pc.queue.Get()
		if quit {
			return
		}
		var err error
		switch key {
		case keyPools:
			pc.syncPools(ctx)
		case keyStatus:
			err = pc.writeStatuses(ctx)
		}
		switch {
		case apierrors.IsConflict(err):
			// Our cache was behind our own last write; try again shortly.
			klog.FromContext(ctx).V(4).Info("IPPool status conflict; retrying", "err", err)
			pc.queue.AddRateLimited(key)
		case err != nil:
			klog.FromContext(ctx).Error(err, "IPPool sync failed; retrying", "key", key)
			pc.queue.AddRateLimited(key)
		default:
			pc.queue.Forget(key)
		}
		pc.queue.Done(key)
	}
}

// listPools returns every IPPool in the informer's cache, oldest first: on
// an overlap, the older pool wins and the newer one is rejected.
func (pc *poolController) listPools(ctx context.Context) []*vipcastv1alpha1.IPPool {
	var pools []*vipcastv1alpha1.IPPool
	for _, obj := range pc.informer.GetStore().List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		pool := &vipcastv1alpha1.IPPool{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, pool); err != nil {
			klog.FromContext(ctx).Error(err, "Decoding IPPool", "pool", u.GetName())
			continue
		}
		pools = append(pools, pool)
	}
	sort.Slice(pools, func(i, j int) bool { return vipcastv1alpha1.OlderFirst(pools[i], pools[j]) })
	return pools
}

// syncPools installs the current IPPools in the allocator. Pools that are
// malformed or overlap an older pool are rejected (Ready=False, an Event);
// the others are installed. Addresses held by Services are never dropped.
func (pc *poolController) syncPools(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName(clientName)
	pools := pc.listPools(ctx)
	rejected := map[string]rejection{}
	var specs []ipam.Pool
	for _, p := range pools {
		spec, err := PoolFromCRD(p)
		if err != nil {
			rejected[p.Name] = rejectionFor(err)
			continue
		}
		specs = append(specs, spec)
	}
	for name, err := range pc.alloc.SetPools(specs) {
		rejected[name] = rejectionFor(err)
	}

	pc.mu.Lock()
	previous := pc.rejected
	pc.rejected = rejected
	pc.mu.Unlock()

	for _, p := range pools {
		if r, bad := rejected[p.Name]; bad && previous[p.Name] != r {
			logger.Info("IPPool rejected", "pool", p.Name, "reason", r.reason, "message", r.message)
			pc.recorder.Event(p, v1.EventTypeWarning, r.reason, r.message)
		}
	}
	logger.V(2).Info("IPPools loaded", "pools", len(pools), "rejected", len(rejected))
	pc.queue.Add(keyStatus)
}

// explain adds to an allocation error the reason why a pool the request
// names, or that contains an address it asks for, was rejected: such a
// pool is not in the allocator, so the allocator's error alone ("not in any
// pool") would hide the cause.
func (pc *poolController) explain(req ipam.Request, err error) error {
	pc.mu.Lock()
	rejected := pc.rejected
	pc.mu.Unlock()
	if len(rejected) == 0 {
		return err
	}
	for _, pool := range pc.listPools(context.Background()) {
		r, bad := rejected[pool.Name]
		if !bad {
			continue
		}
		named := req.Pool == pool.Name
		if !named {
			ranges, perr := ipam.ParseAddresses(pool.Spec.Addresses)
			for _, ip := range req.IPs {
				for _, rg := range ranges {
					named = named || (perr == nil && rg.Contains(ip))
				}
			}
		}
		if named {
			return fmt.Errorf("%w (IPPool %s is not ready: %s: %s)", err, pool.Name, r.reason, r.message)
		}
	}
	return err
}

// writeStatuses publishes each pool's capacity, usage and Ready condition,
// writing only pools whose status changed, and refreshes the metrics.
func (pc *poolController) writeStatuses(ctx context.Context) error {
	pc.mu.Lock()
	rejected := pc.rejected
	pc.mu.Unlock()

	seen := map[string]bool{}
	var firstErr error
	for _, pool := range pc.listPools(ctx) {
		seen[pool.Name] = true
		stats, installed := pc.alloc.Stats(pool.Name)
		if installed {
			pc.metrics.setPoolStats(pool.Name, stats)
		}
		want := desiredStatus(pool, stats, installed, rejected[pool.Name])
		if equality.Semantic.DeepEqual(pool.Status, want) {
			continue
		}
		pool.Status = want
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(pool)
		if err != nil {
			return fmt.Errorf("encoding IPPool %s: %w", pool.Name, err)
		}
		_, err = pc.dyn.Resource(vipcastv1alpha1.IPPoolsResource).UpdateStatus(ctx, &unstructured.Unstructured{Object: obj}, metav1.UpdateOptions{})
		if err != nil && !apierrors.IsNotFound(err) && firstErr == nil {
			firstErr = fmt.Errorf("updating status of IPPool %s: %w", pool.Name, err)
		}
	}
	pc.mu.Lock()
	for name := range pc.known {
		if !seen[name] {
			pc.metrics.deletePool(name)
		}
	}
	pc.known = seen
	pc.mu.Unlock()
	return firstErr
}

// desiredStatus computes an IPPool's status. Condition transition times are
// kept when the condition does not change.
func desiredStatus(pool *vipcastv1alpha1.IPPool, stats ipam.PoolStats, installed bool, rej rejection) vipcastv1alpha1.IPPoolStatus {
	st := *pool.Status.DeepCopy()
	st.ObservedGeneration = pool.Generation
	cond := metav1.Condition{
		Type:               vipcastv1alpha1.ConditionReady,
		Status:             metav1.ConditionTrue,
		Reason:             vipcastv1alpha1.ReasonValid,
		Message:            "the pool's addresses are available for allocation",
		ObservedGeneration: pool.Generation,
	}
	switch {
	case rej.reason != "":
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, rej.reason, rej.message
	case !installed:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionUnknown, "Pending", "pool not loaded yet"
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	st.IPv4 = familyStatus(stats.IPv4)
	st.IPv6 = familyStatus(stats.IPv6)
	return st
}

// unsetPriority puts pools without spec.allocation.priority after every
// pool that has one (the CRD allows 0 to 2^31-1).
const unsetPriority = math.MaxInt32

// PoolFromCRD translates an IPPool into the allocator's pool type. Errors
// name the field at fault.
func PoolFromCRD(p *vipcastv1alpha1.IPPool) (ipam.Pool, error) {
	pool := ipam.Pool{
		Name:          p.Name,
		Addresses:     p.Spec.Addresses,
		AutoAssign:    p.Spec.AutoAssignOrDefault(),
		AvoidBuggyIPs: p.Spec.AvoidBuggyIPs,
		Priority:      unsetPriority,
	}
	ranges, err := ipam.ParseAddresses(p.Spec.Addresses)
	if err != nil {
		return pool, fmt.Errorf("spec.addresses: %w", err)
	}
	// A pool the speakers would not announce would hand out VIPs that
	// nobody routes: refuse it until spec.bgp is fixed.
	if prob := poolspec.Check(p.Spec.BGP, ranges); prob != nil {
		return pool, &bgpError{prob}
	}
	if alloc := p.Spec.Allocation; alloc != nil {
		if alloc.Priority != nil {
			pool.Priority = int(*alloc.Priority)
		}
		pool.Namespaces = alloc.Namespaces
		if pool.NamespaceSelectors, err = selectors("spec.allocation.namespaceSelectors", alloc.NamespaceSelectors); err != nil {
			return pool, err
		}
		if pool.ServiceSelectors, err = selectors("spec.allocation.serviceSelectors", alloc.ServiceSelectors); err != nil {
			return pool, err
		}
	}
	return pool, nil
}

func selectors(field string, in []metav1.LabelSelector) ([]labels.Selector, error) {
	var out []labels.Selector
	for i := range in {
		sel, err := metav1.LabelSelectorAsSelector(&in[i])
		if err != nil {
			return nil, &selectorError{fmt.Errorf("%s[%d]: %w", field, i, err)}
		}
		out = append(out, sel)
	}
	return out, nil
}

// rejection says why an IPPool is not installed, as its Ready condition does.
type rejection struct{ reason, message string }

// rejectionFor maps a translation or allocator error to a condition reason.
func rejectionFor(err error) rejection {
	r := rejection{reason: vipcastv1alpha1.ReasonInvalidAddresses, message: err.Error()}
	var sel *selectorError
	var unannounceable *bgpError
	switch {
	case errors.As(err, &unannounceable):
		r.reason = unannounceable.Reason
	case errors.As(err, &sel):
		r.reason = vipcastv1alpha1.ReasonInvalidSelector
	case ipam.ReasonOf(err) == ipam.ReasonOverlap:
		r.reason = vipcastv1alpha1.ReasonOverlap
	}
	return r
}

// selectorError is a label selector that does not parse.
// bgpError is a spec.bgp the speakers cannot announce.
type bgpError struct{ *poolspec.Problem }

func (e *bgpError) Error() string {
	return e.Message + " (the speakers would not announce this pool, so no VIP is allocated from it)"
}

type selectorError struct{ err error }

func (e *selectorError) Error() string { return e.err.Error() }
func (e *selectorError) Unwrap() error { return e.err }

// familyStatus renders one family's figures; nil if the pool has none.
func familyStatus(fs ipam.FamilyStats) *vipcastv1alpha1.IPPoolFamilyStatus {
	if fs.Capacity == nil || fs.Capacity.Sign() == 0 {
		if fs.InUse == 0 {
			return nil
		}
		return &vipcastv1alpha1.IPPoolFamilyStatus{Capacity: "0", InUse: int64(fs.InUse)}
	}
	return &vipcastv1alpha1.IPPoolFamilyStatus{Capacity: fs.Capacity.String(), InUse: int64(fs.InUse)}
}
