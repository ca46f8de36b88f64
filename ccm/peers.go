package ccm

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
)

// peerStatusController publishes each BGPPeer's Ready condition: whether
// its configuration is usable on every node (BGPPeerSpec.Check). Sessions
// are per node: the speakers report them in Events and metrics.
type peerStatusController struct {
	dyn      dynamic.Interface
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]
}

func newPeerStatusController(dyn dynamic.Interface, factory dynamicinformer.DynamicSharedInformerFactory) (*peerStatusController, error) {
	pc := &peerStatusController{
		dyn:      dyn,
		informer: factory.ForResource(vipcastv1alpha1.BGPPeersResource).Informer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "bgppeers"}),
	}
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			pc.queue.Add(key)
		}
	}
	if _, err := pc.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue,
		UpdateFunc: func(old, cur any) {
			// Our own status writes come back: only a new generation, or a
			// status someone else changed, needs another look.
			o, ok1 := old.(*unstructured.Unstructured)
			c, ok2 := cur.(*unstructured.Unstructured)
			if ok1 && ok2 && o.GetGeneration() == c.GetGeneration() && equality.Semantic.DeepEqual(o.Object["status"], c.Object["status"]) {
				return
			}
			enqueue(cur)
		},
	}); err != nil {
		return nil, fmt.Errorf("bgppeer handler: %w", err)
	}
	return pc, nil
}

func (pc *peerStatusController) hasSynced() bool { return pc.informer.HasSynced() }

// run writes statuses until ctx ends.
func (pc *peerStatusController) run(ctx context.Context) {
	go func() { <-ctx.Done(); pc.queue.ShutDown() }()
	for {
		key, quit := pc.queue.Get()
		if quit {
			return
		}
		err := pc.sync(ctx, key)
		switch {
		case apierrors.IsConflict(err):
			klog.FromContext(ctx).V(4).Info("BGPPeer status conflict; retrying", "peer", key)
			pc.queue.AddRateLimited(key)
		case err != nil:
			klog.FromContext(ctx).Error(err, "BGPPeer status update failed; retrying", "peer", key)
			pc.queue.AddRateLimited(key)
		default:
			pc.queue.Forget(key)
		}
		pc.queue.Done(key)
	}
}

func (pc *peerStatusController) sync(ctx context.Context, key string) error {
	obj, exists, err := pc.informer.GetStore().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	peer := &vipcastv1alpha1.BGPPeer{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, peer); err != nil {
		// The API server validated the object against the CRD schema;
		// an object this binary cannot decode is from a newer version.
		klog.FromContext(ctx).Error(err, "Decoding BGPPeer", "peer", key)
		return nil
	}
	want := peerStatus(peer)
	if equality.Semantic.DeepEqual(peer.Status, want) {
		return nil
	}
	peer.Status = want
	out, err := runtime.DefaultUnstructuredConverter.ToUnstructured(peer)
	if err != nil {
		return fmt.Errorf("encoding BGPPeer %s: %w", peer.Name, err)
	}
	_, err = pc.dyn.Resource(vipcastv1alpha1.BGPPeersResource).UpdateStatus(ctx, &unstructured.Unstructured{Object: out}, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err == nil {
		klog.FromContext(ctx).V(2).Info("BGPPeer status written", "peer", peer.Name, "ready", meta.FindStatusCondition(want.Conditions, vipcastv1alpha1.ConditionReady).Status)
	}
	return err
}

// peerStatus computes a BGPPeer's status; a condition's transition time is
// kept while it does not change.
func peerStatus(peer *vipcastv1alpha1.BGPPeer) vipcastv1alpha1.BGPPeerStatus {
	st := *peer.Status.DeepCopy()
	st.ObservedGeneration = peer.Generation
	cond := metav1.Condition{
		Type:               vipcastv1alpha1.ConditionReady,
		Status:             metav1.ConditionTrue,
		Reason:             vipcastv1alpha1.ReasonValid,
		Message:            "configuration accepted; the speakers on the selected nodes open the sessions (their Events and vipcast_bgp_session_up show each session)",
		ObservedGeneration: peer.Generation,
	}
	if prob := peer.Spec.Check(); prob != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, prob.Reason, prob.Message
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	return st
}
