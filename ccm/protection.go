package ccm

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/poolspec"
)

// maxListed bounds the Services and addresses named in an IPPool's
// conditions and Events; the rest are counted.
const maxListed = 10

// EventDeletionBlocked is the reason of the Warning Event on an IPPool
// whose deletion waits for the Services holding its addresses.
const EventDeletionBlocked = "DeletionBlocked"

// publishedServices returns what the holding rule reads of every Service
// vipcast serves (type LoadBalancer, no loadBalancerClass) that has a VIP
// in its status, by namespace/name.
func publishedServices(svcs []*v1.Service) []poolspec.Published {
	var out []poolspec.Published
	for _, svc := range svcs {
		if svc.Spec.Type != v1.ServiceTypeLoadBalancer || svc.Spec.LoadBalancerClass != nil {
			continue
		}
		if ips := statusIPs(svc); len(ips) > 0 {
			out = append(out, poolspec.Published{Service: Owner(svc), Pool: poolspec.HeldBy(svc.Annotations), IPs: ips})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Service < out[j].Service })
	return out
}

// holdStatus adds to st, the desired status of pool, what the Services
// holding its addresses imply: heldOutsideSpec and the HeldOutsideSpec
// condition; and for a pool being deleted, Ready=False (Terminating)
// naming the holders its deletion waits for.
func holdStatus(st *vipcastv1alpha1.IPPoolStatus, pool *vipcastv1alpha1.IPPool, holdings []poolspec.Holding) {
	var outside []string
	addrs := map[netip.Addr]bool{} // a shared VIP is one address
	for _, h := range holdings {
		if !h.InSpec {
			outside = append(outside, h.String())
			addrs[h.IP] = true
		}
	}
	st.HeldOutsideSpec = int64(len(addrs))
	cond := metav1.Condition{
		Type:               vipcastv1alpha1.ConditionHeldOutsideSpec,
		Status:             metav1.ConditionFalse,
		Reason:             vipcastv1alpha1.ReasonAllInSpec,
		Message:            "every address Services hold from this pool is in its spec",
		ObservedGeneration: pool.Generation,
	}
	if len(outside) > 0 {
		cond.Status, cond.Reason = metav1.ConditionTrue, vipcastv1alpha1.ReasonHeldOutsideSpec
		cond.Message = fmt.Sprintf("%d addresses held outside the pool's spec stay with their Services, published and announced, until released: %s; no new address comes from outside the spec",
			len(addrs), poolspec.Summary(outside, maxListed))
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	if pool.DeletionTimestamp == nil {
		return
	}
	ready := metav1.Condition{
		Type:               vipcastv1alpha1.ConditionReady,
		Status:             metav1.ConditionFalse,
		Reason:             vipcastv1alpha1.ReasonTerminating,
		Message:            "the pool is being deleted and hands out no new address",
		ObservedGeneration: pool.Generation,
	}
	if len(holdings) > 0 {
		ready.Message = deletionMessage(holdings)
	}
	meta.SetStatusCondition(&st.Conditions, ready)
}

// deletionMessage says which Services a pool's deletion waits for.
func deletionMessage(holdings []poolspec.Holding) string {
	holders := poolspec.Holders(holdings)
	return fmt.Sprintf("deletion waits for %d Service(s) holding the pool's addresses: %s; delete them, or move them to another pool, and the pool goes",
		len(holders), poolspec.Summary(holders, maxListed))
}

// finalizerPatch returns the merge patch that sets pool's finalizers to
// want, guarded by resourceVersion rv; nil when they already are want.
func finalizerPatch(pool *vipcastv1alpha1.IPPool, rv string, held bool) ([]byte, error) {
	has := slices.Contains(pool.Finalizers, poolspec.Finalizer)
	var want []string
	switch {
	case pool.DeletionTimestamp == nil && !has:
		want = append(slices.Clone(pool.Finalizers), poolspec.Finalizer)
	case pool.DeletionTimestamp != nil && has && !held:
		want = slices.DeleteFunc(slices.Clone(pool.Finalizers), func(f string) bool { return f == poolspec.Finalizer })
		if want == nil {
			want = []string{}
		}
	default:
		return nil, nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"finalizers": want, "resourceVersion": rv}})
	if err != nil {
		return nil, fmt.Errorf("encoding the finalizers of IPPool %s: %w", pool.Name, err)
	}
	return patch, nil
}

// syncFinalizer puts poolspec.Finalizer on a pool, or takes it off a pool
// being deleted that no Service holds an address of any more (the API
// server then deletes it). rv is the pool's current resourceVersion.
func (pc *poolController) syncFinalizer(ctx context.Context, pool *vipcastv1alpha1.IPPool, rv string, held bool) error {
	patch, err := finalizerPatch(pool, rv, held)
	if patch == nil || err != nil {
		return err
	}
	_, err = pc.dyn.Resource(vipcastv1alpha1.IPPoolsResource).Patch(ctx, pool.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("updating the finalizers of IPPool %s: %w", pool.Name, err)
	}
	return nil
}

// reportBlocked records a Warning Event on a pool whose deletion waits for
// Services, once per change of the list.
func (pc *poolController) reportBlocked(pool *vipcastv1alpha1.IPPool, holdings []poolspec.Holding) {
	msg := ""
	if pool.DeletionTimestamp != nil && len(holdings) > 0 {
		msg = deletionMessage(holdings)
	}
	pc.mu.Lock()
	changed := pc.blocked[pool.Name] != msg
	if msg == "" {
		delete(pc.blocked, pool.Name)
	} else {
		pc.blocked[pool.Name] = msg
	}
	pc.mu.Unlock()
	if changed && msg != "" {
		pc.recorder.Event(pool, v1.EventTypeWarning, EventDeletionBlocked, msg)
	}
}

// holds reports whether the pool called name holds every one of ips
// (poolspec.Admission.Holder) for a Service whose annotations name the pool
// named (poolspec.HeldBy): then the Service keeps them, though the pool may
// have been narrowed, refused or be being deleted since.
func (pc *poolController) holds(name, named string, ips []netip.Addr) bool {
	adm := pc.currentAdmission()
	if adm == nil || len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if h, ok := adm.Holder(ip, named); !ok || h.Pool != name {
			return false
		}
	}
	return true
}

// unheld reports whether a pool is loaded and no pool holds one of ips by
// the holding rule, for a Service whose annotations name the pool named
// (poolspec.HeldBy): no speaker announces such a VIP, say because the pool
// recorded for it was deleted.
func (pc *poolController) unheld(named string, ips []netip.Addr) bool {
	adm := pc.currentAdmission()
	if adm == nil {
		return false
	}
	for _, ip := range ips {
		if _, ok := adm.Holder(ip, named); !ok {
			return true
		}
	}
	return false
}

// currentAdmission returns the pools' last admission (nil before the
// first load).
func (pc *poolController) currentAdmission() *poolspec.Admission {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.admission
}
