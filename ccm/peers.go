package ccm

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
)

// peerStatusController publishes each BGPPeer's Ready condition: whether
// its configuration is usable on every node (BGPPeerSpec.Check), and
// whether an older BGPPeer with the same address takes its place on some
// existing node (peerConflicts); and how many Ready nodes have a session
// with it, and how many of those are Established, as the speakers'
// SpeakerStatuses report (sessionCounts).
type peerStatusController struct {
	dyn      dynamic.Interface
	informer cache.SharedIndexInformer
	// speakers caches the SpeakerStatuses, slimmed to their sessions.
	speakers cache.SharedIndexInformer
	// nodes is the cloud-controller-manager's Node informer (useNodes);
	// nil until then.
	nodes cache.SharedIndexInformer
	queue workqueue.TypedRateLimitingInterface[string]
}

func newPeerStatusController(dyn dynamic.Interface, factory dynamicinformer.DynamicSharedInformerFactory) (*peerStatusController, error) {
	pc := &peerStatusController{
		dyn:      dyn,
		informer: factory.ForResource(vipcastv1alpha1.BGPPeersResource).Informer(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "bgppeers"}),
	}
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			pc.queue.Add(key)
		}
	}
	// A peer's status depends on the peers with its address: a peer that
	// comes, goes or changes its spec requeues them all (at its old and
	// new address).
	if _, err := pc.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { enqueue(obj); pc.enqueueAddress(obj) },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*unstructured.Unstructured)
			c, ok2 := cur.(*unstructured.Unstructured)
			if ok1 && ok2 && o.GetGeneration() == c.GetGeneration() {
				// Our own status writes come back: only a status
				// someone else changed needs another look, at this
				// peer alone.
				if !equality.Semantic.DeepEqual(o.Object["status"], c.Object["status"]) {
					enqueue(cur)
				}
				return
			}
			enqueue(cur)
			pc.enqueueAddress(old)
			pc.enqueueAddress(cur)
		},
		DeleteFunc: pc.enqueueAddress,
	}); err != nil {
		return nil, fmt.Errorf("bgppeer handler: %w", err)
	}
	pc.speakers = factory.ForResource(vipcastv1alpha1.SpeakerStatusesResource).Informer()
	if err := pc.speakers.SetTransform(slimSpeakerStatus); err != nil {
		return nil, fmt.Errorf("speakerstatus transform: %w", err)
	}
	if _, err := pc.speakers.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { pc.sessionsChanged(nil, obj) },
		UpdateFunc: pc.sessionsChanged,
		DeleteFunc: func(obj any) { pc.sessionsChanged(obj, nil) },
	}); err != nil {
		return nil, fmt.Errorf("speakerstatus handler: %w", err)
	}
	return pc, nil
}

// useNodes makes node changes requeue the peers they may concern. nodes
// is the cloud-controller-manager's shared Node informer (RBAC: nodes list
// and watch, which the CCM has anyway); it must be called before run.
func (pc *peerStatusController) useNodes(nodes cache.SharedIndexInformer) error {
	pc.nodes = nodes
	// A node that comes, goes or moves in or out of Ready changes every
	// peer's session counts; a change of its labels, the conflicts of the
	// peers that share their address with another.
	_, err := nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { pc.enqueueAll() },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			c, ok2 := cur.(*corev1.Node)
			switch {
			case !ok1 || !ok2 || nodeReady(o) != nodeReady(c):
				pc.enqueueAll()
			case !maps.Equal(o.Labels, c.Labels):
				pc.enqueueShared()
			}
		},
		DeleteFunc: func(any) { pc.enqueueAll() },
	})
	if err != nil {
		return fmt.Errorf("node handler for BGPPeer status: %w", err)
	}
	return nil
}

func (pc *peerStatusController) hasSynced() bool {
	return pc.informer.HasSynced() && (pc.nodes == nil || pc.nodes.HasSynced())
}

// peerAddr is the address of a cached BGPPeer, unmapped; false when it
// does not parse (Check reports that).
func peerAddr(obj any) (netip.Addr, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return netip.Addr{}, false
	}
	s, _, _ := unstructured.NestedString(u.Object, "spec", "peerAddress")
	spec := vipcastv1alpha1.BGPPeerSpec{PeerAddress: s}
	return spec.Address()
}

// enqueueAddress queues every cached peer with obj's address.
func (pc *peerStatusController) enqueueAddress(obj any) {
	addr, ok := peerAddr(obj)
	if !ok {
		return
	}
	for _, o := range pc.informer.GetStore().List() {
		if a, ok := peerAddr(o); ok && a == addr {
			if key, err := cache.MetaNamespaceKeyFunc(o); err == nil {
				pc.queue.Add(key)
			}
		}
	}
}

// enqueueShared queues every cached peer whose address another peer has.
func (pc *peerStatusController) enqueueShared() {
	byAddr := map[netip.Addr][]string{}
	for _, o := range pc.informer.GetStore().List() {
		if a, ok := peerAddr(o); ok {
			if key, err := cache.MetaNamespaceKeyFunc(o); err == nil {
				byAddr[a] = append(byAddr[a], key)
			}
		}
	}
	for _, keys := range byAddr {
		if len(keys) > 1 {
			for _, k := range keys {
				pc.queue.Add(k)
			}
		}
	}
}

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
	nodes, established := pc.sessionCounts(peer.Name)
	want := peerStatus(peer, pc.conflict(ctx, peer), nodes, established)
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

// conflict is peer's ReasonAddressConflict message, "" for none, decided
// among the cached peers with its address and the cached Nodes.
func (pc *peerStatusController) conflict(ctx context.Context, peer *vipcastv1alpha1.BGPPeer) string {
	addr, ok := peer.Spec.Address()
	if !ok || pc.nodes == nil {
		return "" // Check reports the address
	}
	var same []*vipcastv1alpha1.BGPPeer
	for _, o := range pc.informer.GetStore().List() {
		if a, ok := peerAddr(o); !ok || a != addr {
			continue
		}
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		p := &vipcastv1alpha1.BGPPeer{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, p); err != nil {
			klog.FromContext(ctx).V(4).Info("Skipping undecodable BGPPeer", "peer", u.GetName(), "err", err)
			continue
		}
		same = append(same, p)
	}
	if len(same) < 2 {
		return ""
	}
	var nodes []*corev1.Node
	for _, o := range pc.nodes.GetStore().List() {
		if n, ok := o.(*corev1.Node); ok {
			nodes = append(nodes, n)
		}
	}
	return peerConflicts(same, nodes)[peer.Name]
}

// peerConflicts returns, by name, the ReasonAddressConflict message of
// every BGPPeer that some existing node leaves out because an older BGPPeer
// has its address there: v1alpha1.ShadowedPeers, the rule each speaker
// applies to its own node, applied to every node. The message names the
// oldest such peer and the nodes where it shadows this one. Only existing
// nodes count: selectors that could overlap on a node that does not exist
// yet are no conflict until such a node appears.
func peerConflicts(peers []*vipcastv1alpha1.BGPPeer, nodes []*corev1.Node) map[string]string {
	nodes = slices.Clone(nodes)
	slices.SortFunc(nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	byName := make(map[string]*vipcastv1alpha1.BGPPeer, len(peers))
	for _, p := range peers {
		byName[p.Name] = p
	}
	// shadowed: newer peer → older peer → nodes (sorted by name).
	shadowed := map[string]map[string][]string{}
	for _, n := range nodes {
		for newer, older := range vipcastv1alpha1.ShadowedPeers(peers, labels.Set(n.Labels)) {
			if shadowed[newer] == nil {
				shadowed[newer] = map[string][]string{}
			}
			shadowed[newer][older] = append(shadowed[newer][older], n.Name)
		}
	}
	out := make(map[string]string, len(shadowed))
	for newer, olders := range shadowed {
		var oldest *vipcastv1alpha1.BGPPeer
		for name := range olders {
			if o := byName[name]; oldest == nil || vipcastv1alpha1.OlderFirst(o, oldest) {
				oldest = o
			}
		}
		addr, _ := byName[newer].Spec.Address() // ShadowedPeers checked it
		out[newer] = vipcastv1alpha1.AddressConflictMessage(addr, oldest.Name, olders[oldest.Name])
	}
	return out
}

// peerStatus computes a BGPPeer's status from its spec, conflict (its
// peerConflicts message, "" for none) and session counts (sessionCounts); a
// condition's transition time is kept while it does not change.
func peerStatus(peer *vipcastv1alpha1.BGPPeer, conflict string, nodes, established int32) vipcastv1alpha1.BGPPeerStatus {
	st := *peer.Status.DeepCopy()
	st.ObservedGeneration = peer.Generation
	st.Nodes, st.NodesEstablished = nodes, established
	cond := metav1.Condition{
		Type:               vipcastv1alpha1.ConditionReady,
		Status:             metav1.ConditionTrue,
		Reason:             vipcastv1alpha1.ReasonValid,
		Message:            "configuration accepted; the speakers on the selected nodes open the sessions (status.nodesEstablished counts those up; each node's SpeakerStatus, its Events and vipcast_bgp_session_up show each session)",
		ObservedGeneration: peer.Generation,
	}
	if prob := peer.Spec.Check(); prob != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, prob.Reason, prob.Message
	} else if conflict != "" {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, vipcastv1alpha1.ReasonAddressConflict, conflict
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	return st
}
