package ccm

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/ipam"
	"github.com/vipcast/vipcast/poolspec"
)

var _ cloudprovider.LoadBalancer = (*Provider)(nil)

// GetLoadBalancer reports the Service's VIPs. A Service whose status still
// lists addresses also "exists", so the service controller cleans it up.
func (p *Provider) GetLoadBalancer(ctx context.Context, _ string, svc *v1.Service) (*v1.LoadBalancerStatus, bool, error) {
	if err := p.waitReady(ctx); err != nil {
		return nil, false, err
	}
	if a, ok := p.alloc.Assigned(Owner(svc)); ok && len(a.IPs) > 0 {
		return lbStatus(a.IPs), true, nil
	}
	if len(svc.Status.LoadBalancer.Ingress) > 0 {
		return svc.Status.LoadBalancer.DeepCopy(), true, nil
	}
	return nil, false, nil
}

// GetLoadBalancerName returns the cloud-provider's default name for the
// Service's load balancer; vipcast keys its state by namespace/name.
func (p *Provider) GetLoadBalancerName(_ context.Context, _ string, svc *v1.Service) string {
	return cloudprovider.DefaultLoadBalancerName(svc)
}

// EnsureLoadBalancer allocates the Service's VIPs, or keeps the ones it has,
// and returns them with ipMode Proxy. It records the pool that handed them
// out in the vipcast.io/allocated-from-pool annotation, and in
// vipcast.io/pool when the Service did not ask for one, in the background
// (poolAnnotator). Errors name their cause; the service controller turns
// them into a SyncLoadBalancerFailed Event and retries. With an allocation
// error it may also return a status: what the Service still holds, when its
// status lists an address it holds no more (see withdrawnStatus); the
// service controller publishes that one before it retries.
func (p *Provider) EnsureLoadBalancer(ctx context.Context, _ string, svc *v1.Service, _ []*v1.Node) (*v1.LoadBalancerStatus, error) {
	if err := p.waitReady(ctx); err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx).WithValues("service", klog.KObj(svc))
	req, err := RequestFor(svc, p.namespaceLabels(svc.Namespace))
	if err != nil {
		p.metrics.errors.WithLabelValues(string(ipam.ReasonOf(err))).Inc()
		return nil, err
	}
	before, held := p.alloc.Assigned(req.Owner)
	heldBy := poolspec.HeldBy(svc.Annotations)
	if held && req.Pool != "" && (len(req.IPs) == 0 || sameIPs(req.IPs, before.IPs)) && p.pools.holds(req.Pool, heldBy, before.IPs) {
		// Already served by the pool the request names, which still holds
		// the VIPs (poolspec's holding rule, the speakers' too): keep them
		// even if the pool was narrowed, refused or is being deleted since,
		// or its namespace or Service selectors changed; all that governs
		// new allocations.
		req.Pool = ""
	} else if held && req.Pool == "" && p.pools.unheld(heldBy, before.IPs) {
		// No pool holds these VIPs (they lie outside every spec and no
		// existing pool is recorded for them), so no speaker announces
		// them. Publishing them on would leave the Service unreachable; it
		// gets new VIPs from the pools instead.
		logger.Info("VIPs held by no pool: allocating new ones", "ips", before.IPs, "recordedPool", heldBy)
		p.release(svc)
		before = ipam.Assignment{}
	}
	a, err := p.alloc.Assign(req)
	if err != nil {
		p.metrics.errors.WithLabelValues(string(ipam.ReasonOf(err))).Inc()
		kept, _ := p.alloc.Assigned(req.Owner)
		p.accountChange("", before.IPs, kept.IPs)
		err = p.pools.explain(req, err)
		status := withdrawnStatus(svc, kept.IPs)
		if status != nil {
			logger.Info("Withdrawing VIPs the Service no longer holds", "published", statusIPs(svc), "kept", kept.IPs, "reason", err)
			err = fmt.Errorf("%w; meanwhile the Service stops publishing %v, which it no longer holds", err, newIPs(kept.IPs, statusIPs(svc)))
		}
		return status, err
	}
	if added := newIPs(before.IPs, a.IPs); len(added) > 0 {
		// New Services are arriving: annotations wait until they stop.
		p.annotator.busy()
		logger.V(2).Info("Allocated VIPs", "pool", a.Pool, "ips", a.IPs, "previous", before.IPs)
	}
	p.accountChange(a.Pool, before.IPs, a.IPs)
	if _, _, pinned := requestAnnotation(svc.Annotations, AnnotationPool); a.Pool != "" && (svc.Annotations[poolspec.AnnotationAllocatedFrom] != a.Pool || !pinned) {
		p.annotator.record(req.Owner, a.Pool)
	}
	return lbStatus(a.IPs), nil
}

// UpdateLoadBalancer has nothing to do: the node set matters to the speakers
// (which announce from eligible nodes), not to VIP allocation.
func (p *Provider) UpdateLoadBalancer(context.Context, string, *v1.Service, []*v1.Node) error {
	return nil
}

// EnsureLoadBalancerDeleted releases the Service's VIPs.
func (p *Provider) EnsureLoadBalancerDeleted(ctx context.Context, _ string, svc *v1.Service) error {
	if err := p.waitReady(ctx); err != nil {
		return err
	}
	p.release(svc)
	return nil
}

func (p *Provider) release(svc *v1.Service) {
	a, ok := p.alloc.Assigned(Owner(svc))
	if !ok {
		return
	}
	p.alloc.Release(Owner(svc))
	p.accountChange("", a.IPs, nil)
}

// accountChange counts a Service's move from addresses before to after
// (allocations in pool, releases) and, if anything changed, schedules the
// pool status refresh.
func (p *Provider) accountChange(pool string, before, after []netip.Addr) {
	added, removed := newIPs(before, after), newIPs(after, before)
	for _, ip := range added {
		p.metrics.allocations.WithLabelValues(pool, familyOf(ip).String()).Inc()
	}
	for _, ip := range removed {
		p.metrics.releases.WithLabelValues(familyOf(ip).String()).Inc()
	}
	if len(added)+len(removed) > 0 {
		p.pools.markStatusDirty()
	}
	if len(removed) > 0 {
		p.freed()
	}
}

// namespaceLabels returns the labels of a namespace, or nil if unknown.
func (p *Provider) namespaceLabels(name string) map[string]string {
	ns, err := p.nsLister.Get(name)
	if err != nil {
		return nil
	}
	return ns.Labels
}

// withdrawnStatus is the status a Service whose allocation failed must
// publish: the addresses it still holds, when its status lists one it does
// not hold (it gave up an address it may no longer share with the other
// Services holding it, see ipam.Allocator.Assign; or a restart found an
// older Service holding it); nil when its status may stay as it is. So two
// Services that may not share a VIP never publish it together, and the
// one that did not change keeps it.
func withdrawnStatus(svc *v1.Service, kept []netip.Addr) *v1.LoadBalancerStatus {
	if len(newIPs(kept, statusIPs(svc))) == 0 {
		return nil
	}
	return lbStatus(kept)
}

// lbStatus builds the status the service controller publishes. ipMode Proxy
// tells kube-proxy to leave VIP traffic to vipcast's dataplane.
func lbStatus(ips []netip.Addr) *v1.LoadBalancerStatus {
	st := &v1.LoadBalancerStatus{}
	for _, ip := range ips {
		mode := v1.LoadBalancerIPModeProxy
		st.Ingress = append(st.Ingress, v1.LoadBalancerIngress{IP: ip.String(), IPMode: &mode})
	}
	return st
}

// newIPs returns the addresses in b that are not in a.
func newIPs(a, b []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, ip := range b {
		if !slices.Contains(a, ip) {
			out = append(out, ip)
		}
	}
	return out
}
