package ccm

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"golang.org/x/time/rate"

	"github.com/vipcast/vipcast/poolspec"
)

// Background pool-annotation writing. Users wait for VIPs, not for the
// annotations that record their pool, and every annotation write also
// makes the service controller re-sync the Service (two more Events). So the
// annotator yields: it writes only after allocation has been quiet for
// annotateQuiet, at most annotateQPS writes a second.
const (
	annotateQuiet = 500 * time.Millisecond
	annotateQPS   = 50
	annotateBurst = 10
)

// poolAnnotator records the pool that handed out each Service's VIPs in its
// annotations (poolAnnotations), in the background.
type poolAnnotator struct {
	client   kubernetes.Interface
	services corelisters.ServiceLister
	queue    workqueue.TypedRateLimitingInterface[string]
	limiter  *rate.Limiter

	lastBusy atomic.Int64 // unix nanos of the last allocation activity

	mu      sync.Mutex
	pending map[string]string // namespace/name → pool to record
}

func newPoolAnnotator(client kubernetes.Interface, services corelisters.ServiceLister) *poolAnnotator {
	return &poolAnnotator{
		client:   client,
		services: services,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "pool-annotations"}),
		limiter: rate.NewLimiter(annotateQPS, annotateBurst),
		pending: map[string]string{},
	}
}

// busy notes allocation activity, which the annotator yields to.
func (a *poolAnnotator) busy() { a.lastBusy.Store(time.Now().UnixNano()) }

// record schedules writing pool into the Service's annotation.
func (a *poolAnnotator) record(key, pool string) {
	a.mu.Lock()
	a.pending[key] = pool
	a.mu.Unlock()
	a.queue.Add(key)
}

// run writes annotations until ctx ends.
func (a *poolAnnotator) run(ctx context.Context) {
	go func() { <-ctx.Done(); a.queue.ShutDown() }()
	for {
		key, quit := a.queue.Get()
		if quit {
			return
		}
		err := a.write(ctx, key)
		if err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).V(2).Info("Writing pool annotation failed; retrying", "service", key, "err", err)
			a.queue.AddRateLimited(key)
		} else {
			a.queue.Forget(key)
		}
		a.queue.Done(key)
	}
}

// waitQuiet blocks until no allocation happened for annotateQuiet.
func (a *poolAnnotator) waitQuiet(ctx context.Context) error {
	for {
		idle := time.Since(time.Unix(0, a.lastBusy.Load()))
		if idle >= annotateQuiet {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(annotateQuiet - idle):
		}
	}
}

func (a *poolAnnotator) write(ctx context.Context, key string) error {
	a.mu.Lock()
	pool, ok := a.pending[key]
	a.mu.Unlock()
	if !ok {
		return nil
	}
	if err := a.waitQuiet(ctx); err != nil {
		return err
	}
	if err := a.limiter.Wait(ctx); err != nil {
		return err
	}
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		// Keys come from the informer and always split; a key that did not
		// would not split on a retry either, so it is dropped.
		return nil //nolint:nilerr // see above
	}
	svc, err := a.services.Services(ns).Get(name)
	if apierrors.IsNotFound(err) {
		a.done(key, pool)
		return nil
	}
	if err != nil {
		return err
	}
	if ann := poolAnnotations(svc.Annotations, pool); len(ann) > 0 {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
		if err != nil {
			return fmt.Errorf("building patch: %w", err)
		}
		_, err = a.client.CoreV1().Services(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			err = nil
		}
		if err != nil {
			return fmt.Errorf("recording pool %s in annotations %v: %w", pool, ann, err)
		}
	}
	a.done(key, pool)
	return nil
}

// poolAnnotations returns the annotations to set on a Service with
// annotations cur whose VIPs pool handed out: the record
// vipcast.io/allocated-from-pool, and vipcast.io/pool when the Service has
// none in any spelling (a request its user wrote, even one naming another
// pool, or MetalLB's spelling of it, is never overwritten nor doubled).
func poolAnnotations(cur map[string]string, pool string) map[string]string {
	out := map[string]string{}
	if cur[poolspec.AnnotationAllocatedFrom] != pool {
		out[poolspec.AnnotationAllocatedFrom] = pool
	}
	if _, _, ok := requestAnnotation(cur, AnnotationPool); !ok {
		out[AnnotationPool] = pool
	}
	return out
}

// done forgets key's pending pool unless a newer one was recorded meanwhile.
func (a *poolAnnotator) done(key, pool string) {
	a.mu.Lock()
	if a.pending[key] == pool {
		delete(a.pending, key)
	}
	a.mu.Unlock()
}
