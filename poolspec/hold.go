package poolspec

import (
	"cmp"
	"fmt"
	"net/netip"
	"strings"

	"github.com/vipcast/vipcast/api/v1alpha1"
)

// AnnotationPool is the Service annotation that names the IPPool a Service
// asks for; vipcast-ccm writes it with the pool it allocated from when the
// Service did not ask for one. The holding rule (Admission.Holder) reads
// it.
const AnnotationPool = "vipcast.io/pool"

// AnnotationAllocatedFrom is the Service annotation in which vipcast-ccm
// records the IPPool that handed out the Service's VIPs. Unlike
// AnnotationPool, a request users edit, it is vipcast's own record: a VIP
// outside every pool's spec stays held by the recorded pool whatever
// becomes of the request (HeldBy).
const AnnotationAllocatedFrom = "vipcast.io/allocated-from-pool"

// HeldBy returns the pool name the holding rule reads of a Service's
// annotations (Holder's named): the pool vipcast-ccm recorded in
// AnnotationAllocatedFrom; for a Service published before vipcast wrote
// that record, its AnnotationPool; "" when it has neither.
func HeldBy(annotations map[string]string) string {
	if p := annotations[AnnotationAllocatedFrom]; p != "" {
		return p
	}
	return annotations[AnnotationPool]
}

// Finalizer is the finalizer vipcast-ccm puts on every IPPool: it removes
// it from a deleted pool only once no Service's status holds an address
// the pool holds (Admission.Holdings).
const Finalizer = "vipcast.io/pool-protection"

// Hold is the pool that holds a VIP published in a Service's status, and
// how the VIP is announced.
type Hold struct {
	// Pool is the holding IPPool's name.
	Pool string
	// InSpec is true when Pool is admitted and its spec.addresses contain
	// the VIP (the pool owns it); false when the pool holds the VIP outside
	// its spec: its addresses no longer contain it, or the pool is refused.
	InSpec bool
	// BGP are the attributes the VIP is announced with: the pool's decoded
	// spec.bgp when InSpec; otherwise HeldBGP's.
	BGP *BGP
}

// Holder returns the pool that holds ip, a VIP published in the status of
// a Service whose annotations name the pool named (HeldBy; "" when they
// name none), for the first of these that applies:
//
//  1. the admitted pool whose spec.addresses contain ip (InSpec);
//  2. the IPPool called named, if it exists, admitted or refused,
//     Terminating or not: the pool the VIP came from, narrowed or broken
//     since;
//  3. the oldest refused pool whose spec.addresses contain ip.
//
// Otherwise no pool holds ip (false). A published VIP that a pool holds
// stays published and announced until its Service lets it go; new VIPs
// come only from admitted pools' spec.addresses.
func (a *Admission) Holder(ip netip.Addr, named string) (Hold, bool) {
	if p := a.PoolFor(ip); p != nil {
		return Hold{Pool: p.Name, InSpec: true, BGP: &p.BGP}, true
	}
	if b, ok := a.held[named]; ok {
		return Hold{Pool: named, BGP: b}, true
	}
	if r, ok := a.RefusedContaining(ip); ok {
		return Hold{Pool: r.Pool, BGP: a.held[r.Pool]}, true
	}
	return Hold{}, false
}

// HeldBGP returns the attributes the VIPs that the pool called name holds
// outside its spec are announced with, or nil when no such pool exists:
// host routes (/32, /128: an aggregate could cover addresses outside the
// pool), and of spec.bgp every field that decodes — communities, large
// communities and localPref that parse, peerSelector and nodeSelector when
// they parse; a field that does not decode takes its default (no such
// community; every peer; every node).
func (a *Admission) HeldBGP(name string) *BGP { return a.held[name] }

// heldBGP decodes b for VIPs held outside the pool's spec: see HeldBGP.
func heldBGP(b *v1alpha1.IPPoolBGP) *BGP {
	out := &BGP{AggregationLength: 32, AggregationLengthV6: 128}
	if b == nil {
		return out
	}
	out.Communities, _ = parseAll(b.Communities, parseCommunity, cmp.Compare[uint32])
	out.LargeCommunities, _ = parseAll(b.LargeCommunities, parseLargeCommunity, compareLarge)
	if b.LocalPref != nil {
		lp := *b.LocalPref
		out.LocalPref = &lp
	}
	out.PeerSelector, _ = selector("", b.PeerSelector)
	out.NodeSelector, _ = selector("", b.NodeSelector)
	return out
}

// Published is what the holding rule reads of one Service: its key, the
// pool its annotations name (HeldBy) and the VIPs of its status.
type Published struct {
	// Service is "namespace/name".
	Service string
	// Pool is the pool its annotations name (HeldBy; "" when none).
	Pool string
	// IPs are the addresses of status.loadBalancer.ingress.
	IPs []netip.Addr
}

// Holding is one published VIP a pool holds.
type Holding struct {
	// Service is the holder, "namespace/name".
	Service string
	// IP is the VIP.
	IP netip.Addr
	// InSpec is false when the pool holds IP outside its spec (see Hold).
	InSpec bool
}

// String renders the holding as "IP (namespace/name)".
func (h Holding) String() string { return fmt.Sprintf("%s (%s)", h.IP, h.Service) }

// Holdings applies Holder to every VIP of pubs and returns, by pool name,
// the holdings of each pool that holds any, in the order of pubs.
func (a *Admission) Holdings(pubs []Published) map[string][]Holding {
	out := map[string][]Holding{}
	for _, p := range pubs {
		for _, ip := range p.IPs {
			if h, ok := a.Holder(ip, p.Pool); ok {
				out[h.Pool] = append(out[h.Pool], Holding{Service: p.Service, IP: ip, InSpec: h.InSpec})
			}
		}
	}
	return out
}

// Holders returns the distinct Services of hs, in order (linear: a pool
// may hold the VIPs of thousands of Services).
func Holders(hs []Holding) []string {
	var out []string
	seen := make(map[string]struct{}, len(hs))
	for _, h := range hs {
		if _, ok := seen[h.Service]; !ok {
			seen[h.Service] = struct{}{}
			out = append(out, h.Service)
		}
	}
	return out
}

// Summary renders up to limit items of list, then how many more there are:
// "a, b, c and 7 more".
func Summary(list []string, limit int) string {
	if len(list) <= limit {
		return strings.Join(list, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(list[:limit], ", "), len(list)-limit)
}
