package ccm

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/vipcast/vipcast/poolspec"
)

// ReasonForeignStatus is the reason of the Warning Event on a Service vipcast
// serves whose status.loadBalancer lists addresses vipcast did not publish.
const ReasonForeignStatus = "ForeignLoadBalancerStatus"

// What vipcast published. While it runs, vipcast knows: the allocator holds
// exactly what vipcast last returned for each Service, so a served Service
// whose status lists other addresses was written by someone else. At
// start-up the allocator is rebuilt from every status, so vipcastWrote
// tells the two apart by what vipcast leaves behind.

// vipcastWrote reports whether a served Service's status addresses, read at
// start-up, look like vipcast's. Each must lie in an installed IPPool
// (the one its annotations name, poolspec.HeldBy, when they name an
// installed one); or be held by a pool outside its spec by poolspec's
// holding rule (they name a narrowed, refused or terminating pool); or lie
// in no pool while they name a pool that does not exist: an address whose
// pool was deleted stays with its Service.
func (p *Provider) vipcastWrote(svc *v1.Service, ips []netip.Addr) bool {
	named := poolspec.HeldBy(svc.Annotations)
	annotated := named != ""
	_, namedInstalled := p.alloc.Stats(named)
	for _, ip := range ips {
		pool, inPool := p.alloc.PoolOf(ip)
		switch {
		case inPool && namedInstalled && pool != named:
			return false
		case !inPool && (!annotated || namedInstalled) && !p.pools.holds(named, named, []netip.Addr{ip}):
			return false
		}
	}
	return true
}

// markForeign records that owner's status addresses are another writer's.
func (p *Provider) markForeign(owner string, ips []netip.Addr) {
	p.foreignMu.Lock()
	defer p.foreignMu.Unlock()
	p.foreign[owner] = slices.Clone(ips)
}

func (p *Provider) isForeign(owner string) bool {
	p.foreignMu.Lock()
	defer p.foreignMu.Unlock()
	_, ok := p.foreign[owner]
	return ok
}

// forgetForeign drops owner's foreign mark and, if it had one, the
// reservation that came with it, so vipcast may allocate afresh; and
// owner's displaced mark.
func (p *Provider) forgetForeign(owner string) {
	p.foreignMu.Lock()
	_, ok := p.foreign[owner]
	delete(p.foreign, owner)
	delete(p.displaced, owner)
	p.foreignMu.Unlock()
	if ok {
		p.alloc.Release(owner)
		p.pools.markStatusDirty()
		p.freed()
	}
}

// foreignStatus decides whether a served Service's status is another
// writer's. It returns the Service to work on (read afresh from the API
// server when the cache may only lag behind vipcast's own write) and, when
// the status is foreign, the Event message; the addresses are then reserved
// so vipcast never hands them out, and the Service is left alone until its
// status is cleared.
func (p *Provider) foreignStatus(ctx context.Context, client kubernetes.Interface, svc *v1.Service) (*v1.Service, string, error) {
	owner := Owner(svc)
	ips := statusIPs(svc)
	if len(ips) == 0 {
		p.forgetForeign(owner)
		return svc, "", nil
	}
	held, _ := p.alloc.Assigned(owner)
	marked := p.isForeign(owner)
	if !marked {
		if sameIPs(held.IPs, ips) || p.wasDisplaced(owner, ips) {
			// vipcast's own: what it holds, or what restore found an
			// older Service holding (the Service gets other addresses).
			return svc, "", nil
		}
		live, err := client.CoreV1().Services(svc.Namespace).Get(ctx, svc.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return svc, "", nil
		}
		if err != nil {
			return nil, "", fmt.Errorf("reading Service %s to check who wrote its status: %w", owner, err)
		}
		svc, ips = live, statusIPs(live)
		if len(ips) == 0 || sameIPs(held.IPs, ips) {
			return svc, "", nil
		}
	}
	if err := p.alloc.Restore(restoreRequest(svc), ips); err != nil {
		klog.FromContext(ctx).Error(err, "Another writer published a VIP vipcast gave to another Service", "service", klog.KObj(svc), "ips", ips)
	} else if !marked {
		p.accountChange("", held.IPs, nil)
	}
	p.markForeign(owner, ips)
	return svc, fmt.Sprintf("status.loadBalancer.ingress lists %v, which vipcast (serving %s) did not allocate: another controller wrote it. "+
		"vipcast leaves it and reserves those addresses; let one implementation serve this Service (spec.loadBalancerClass), "+
		"or clear the status for vipcast to allocate", ips, p.classes), nil
}

// reserveForeign keeps the allocator in line with a Service vipcast does not
// serve: while it is a LoadBalancer publishing addresses (another
// implementation's), they are reserved so vipcast never hands them out;
// once it is not, or publishes none, they are released. So a Service moving
// from another class to vipcast's leaves nothing behind.
func (p *Provider) reserveForeign(ctx context.Context, svc *v1.Service) {
	owner := Owner(svc)
	p.forgetForeign(owner)
	ips := statusIPs(svc)
	if svc.Spec.Type != v1.ServiceTypeLoadBalancer || len(ips) == 0 {
		p.release(svc)
		return
	}
	if a, held := p.alloc.Assigned(owner); held && sameIPs(a.IPs, ips) {
		return
	}
	// Restore replaces what the owner held, and only if nothing conflicts:
	// on error the earlier reservation stays.
	if err := p.alloc.Restore(restoreRequest(svc), ips); err != nil {
		klog.FromContext(ctx).Error(err, "Service vipcast does not serve publishes a VIP vipcast already gave out", "service", klog.KObj(svc), "why", p.classes.Why(svc))
	}
}
