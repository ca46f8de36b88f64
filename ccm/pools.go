package ccm

import (
	"context"
	"errors"
	"fmt"
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
	corelisters "k8s.io/client-go/listers/core/v1"
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

	mu        sync.Mutex
	admission *poolspec.Admission         // the last pool admission; nil before the first sync
	refused   map[string]poolspec.Refusal // pool name → why it is not installed
	known     map[string]bool             // pools with metrics exported
	blocked   map[string]string           // pool name → the last DeletionBlocked message
	services  corelisters.ServiceLister   // set by useServices before run
	loaded    func()                      // called after each load of the pools; set before run

	// dirty counts markStatusDirty calls; the status write that started
	// at count n clears statusPending if none came since. Guarded by
	// dirtyMu, which orders them with the gauge.
	dirtyMu sync.Mutex
	dirty   uint64
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
		refused:  map[string]poolspec.Refusal{},
		known:    map[string]bool{},
		blocked:  map[string]string{},
	}
	enqueue := func(any) { pc.queue.Add(keyPools) }
	if _, err := pc.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(old, cur any) {
			// Our own status writes come back here: only a spec change
			// (a new generation) or a deletion needs the pools reloaded.
			o, ok1 := old.(*unstructured.Unstructured)
			c, ok2 := cur.(*unstructured.Unstructured)
			if ok1 && ok2 && o.GetGeneration() == c.GetGeneration() && (o.GetDeletionTimestamp() == nil) == (c.GetDeletionTimestamp() == nil) {
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

// useServices gives the controller the Services whose VIPs its pools
// hold; call it before run.
func (pc *poolController) useServices(l corelisters.ServiceLister) { pc.services = l }

// markStatusDirty schedules a status write; calls within statusDelay coalesce.
func (pc *poolController) markStatusDirty() {
	if pc != nil {
		pc.dirtyMu.Lock()
		pc.dirty++
		pc.metrics.statusPending.Set(1)
		pc.dirtyMu.Unlock()
		pc.queue.AddAfter(keyStatus, statusDelay)
	}
}

// statusWriteStarts returns the count of markStatusDirty calls a status
// write about to start covers.
func (pc *poolController) statusWriteStarts() uint64 {
	pc.dirtyMu.Lock()
	defer pc.dirtyMu.Unlock()
	return pc.dirty
}

// statusWritten clears statusPending after a status write that started at
// count n, unless another change came since.
func (pc *poolController) statusWritten(n uint64) {
	pc.dirtyMu.Lock()
	defer pc.dirtyMu.Unlock()
	if pc.dirty == n {
		pc.metrics.statusPending.Set(0)
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
			n := pc.statusWriteStarts()
			if err = pc.writeStatuses(ctx); err == nil {
				pc.statusWritten(n)
			}
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

// listPools returns every IPPool in the informer's cache, oldest first
// (the precedence order of pool admission).
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

// LoadPools admits pools (poolspec.Admit: the rule the speakers apply
// too) and installs the admitted ones in alloc, as the CCM does on every
// IPPool change. It returns the admission, and every pool not installed
// by name with why (a condition reason and a message naming the field and
// the fix). Addresses held by Services are never dropped (see
// ipam.Allocator.SetPools).
//
// The allocator accepts every admitted pool. Should it refuse one, that is
// a bug in vipcast: the pool is reported as refused with the allocator's
// message, and err says which.
func LoadPools(alloc *ipam.Allocator, pools []*vipcastv1alpha1.IPPool) (adm *poolspec.Admission, refused map[string]poolspec.Refusal, err error) {
	adm = poolspec.Admit(pools)
	refused = make(map[string]poolspec.Refusal, len(adm.Refused))
	for _, r := range adm.Refused {
		refused[r.Pool] = r
	}
	var bugs []error
	errs := alloc.SetPools(adm.Specs())
	for _, p := range adm.Pools {
		if perr, bad := errs[p.Name]; bad {
			refused[p.Name] = poolspec.AllocatorRefusal(p.Name, perr)
			bugs = append(bugs, fmt.Errorf("IPPool %s: %w", p.Name, perr))
		}
	}
	if len(bugs) > 0 {
		err = fmt.Errorf("the allocator refused IPPools that pool admission accepted (a bug in vipcast; please report it): %w", errors.Join(bugs...))
	}
	return adm, refused, err
}

// syncPools installs the current IPPools in the allocator. Pools that pool
// admission refuses are reported (Ready=False, a Warning Event); the
// others are installed. Addresses held by Services are never dropped.
func (pc *poolController) syncPools(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName(clientName)
	pools := pc.listPools(ctx)
	adm, refused, err := LoadPools(pc.alloc, pools)
	if err != nil {
		logger.Error(err, "Loading IPPools")
	}

	pc.mu.Lock()
	previous := pc.refused
	pc.admission, pc.refused = adm, refused
	pc.mu.Unlock()

	for _, p := range pools {
		if r, bad := refused[p.Name]; bad && previous[p.Name] != r {
			logger.Info("IPPool rejected", "pool", p.Name, "reason", r.Reason, "message", r.Message)
			pc.recorder.Event(p, v1.EventTypeWarning, r.Reason, r.Message)
		}
	}
	logger.V(2).Info("IPPools loaded", "pools", len(pools), "rejected", len(refused))
	pc.queue.Add(keyStatus)
	if pc.loaded != nil {
		pc.loaded()
	}
}

// explain adds to an allocation error the reason why the pool the request
// names, or one that contains an address it asks for, was refused: such a
// pool is not in the allocator, so the allocator's error alone ("not in any
// pool") would hide the cause.
func (pc *poolController) explain(req ipam.Request, err error) error {
	pc.mu.Lock()
	adm, refused := pc.admission, pc.refused
	pc.mu.Unlock()
	if adm == nil || len(refused) == 0 {
		return err
	}
	r, bad := refused[req.Pool]
	for i := 0; !bad && i < len(req.IPs); i++ {
		r, bad = adm.RefusedContaining(req.IPs[i])
	}
	if bad {
		return fmt.Errorf("%w (IPPool %s is not ready: %s: %s)", err, r.Pool, r.Reason, r.Message)
	}
	return err
}

// writeStatuses publishes each pool's capacity, usage, held addresses and
// conditions, writing only pools whose status changed, keeps the
// pool-protection finalizer, and refreshes the metrics.
func (pc *poolController) writeStatuses(ctx context.Context) error {
	pc.mu.Lock()
	adm, refused := pc.admission, pc.refused
	pc.mu.Unlock()
	holdings := map[string][]poolspec.Holding{}
	if adm != nil && pc.services != nil {
		svcs, err := pc.services.List(labels.Everything())
		if err != nil {
			return fmt.Errorf("listing Services: %w", err)
		}
		holdings = adm.Holdings(publishedServices(svcs))
	}

	seen := map[string]bool{}
	var firstErr error
	for _, pool := range pc.listPools(ctx) {
		seen[pool.Name] = true
		err := pc.writePool(ctx, pool, refused[pool.Name], holdings[pool.Name])
		if err != nil && firstErr == nil {
			firstErr = err
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

// writePool writes one pool's status if it changed, then its finalizer.
func (pc *poolController) writePool(ctx context.Context, pool *vipcastv1alpha1.IPPool, refusal poolspec.Refusal, holdings []poolspec.Holding) error {
	stats, installed := pc.alloc.Stats(pool.Name)
	if installed {
		pc.metrics.setPoolStats(pool.Name, stats)
	}
	want := desiredStatus(pool, stats, installed, refusal)
	holdStatus(&want, pool, holdings)
	pc.reportBlocked(pool, holdings)
	rv := pool.ResourceVersion
	if !equality.Semantic.DeepEqual(pool.Status, want) {
		pool.Status = want
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(pool)
		if err != nil {
			return fmt.Errorf("encoding IPPool %s: %w", pool.Name, err)
		}
		got, err := pc.dyn.Resource(vipcastv1alpha1.IPPoolsResource).UpdateStatus(ctx, &unstructured.Unstructured{Object: obj}, metav1.UpdateOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return fmt.Errorf("updating status of IPPool %s: %w", pool.Name, err)
		}
		rv = got.GetResourceVersion()
	}
	return pc.syncFinalizer(ctx, pool, rv, len(holdings) > 0)
}

// desiredStatus computes an IPPool's status; refusal is why the pool is not
// installed (zero when it is not refused). Condition transition times are
// kept when the condition does not change.
func desiredStatus(pool *vipcastv1alpha1.IPPool, stats ipam.PoolStats, installed bool, refusal poolspec.Refusal) vipcastv1alpha1.IPPoolStatus {
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
	case refusal.Reason != "":
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, refusal.Reason, refusal.Message
	case !installed:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionUnknown, "Pending", "pool not loaded yet"
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	st.IPv4 = familyStatus(stats.IPv4)
	st.IPv6 = familyStatus(stats.IPv6)
	return st
}

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
