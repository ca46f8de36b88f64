package poolspec

import (
	"fmt"
	"math"
	"net/netip"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/ipam"
)

// UnsetPriority is the allocator priority of a pool without
// spec.allocation.priority: after every pool that has one (the CRD allows
// 0 to 2^31-1).
const UnsetPriority = math.MaxInt32

// Pool is one admitted IPPool, decoded.
type Pool struct {
	// Name is the IPPool's name.
	Name string
	// Spec is the pool as the allocator takes it: addresses, autoAssign,
	// avoidBuggyIPs, priority (UnsetPriority when unset), namespaces and
	// the parsed spec.allocation selectors.
	Spec ipam.Pool
	// Ranges are spec.addresses parsed (ipam.ParseAddresses), in the order
	// written.
	Ranges []ipam.Range
	// BGP is the decoded spec.bgp.
	BGP BGP
}

// Refusal says why an IPPool is not admitted, as the CCM publishes it in
// the pool's Ready condition.
type Refusal struct {
	// Pool is the IPPool's name.
	Pool string
	// Reason is the condition reason: v1alpha1.ReasonInvalidAddresses,
	// ReasonInvalidSelector, ReasonInvalidConfig or ReasonOverlap.
	Reason string
	// Message names the spec field at fault and the fix.
	Message string
}

// Admission is the outcome of Admit. It is immutable and safe for
// concurrent readers.
type Admission struct {
	// Pools are the admitted pools, oldest first.
	Pools []*Pool
	// Refused are the refused pools, oldest first.
	Refused []Refusal

	refused map[string]int // name → index in Refused
	// refusedRanges are the parsed addresses of each refused pool (nil
	// when they do not parse), parallel to Refused; they only explain.
	refusedRanges [][]ipam.Range
	// held are, by name, the attributes of every IPPool considered
	// (admitted or refused) for the VIPs it holds outside its spec.
	held map[string]*BGP
	// index holds every admitted range sorted by First; admitted pools do
	// not overlap, so Last is sorted too.
	index []ownedRange
}

type ownedRange struct {
	ipam.Range
	pool *Pool
}

// Admit applies pool admission to pools (the IPPools as listed, in any
// order; pools is not modified) and decodes the admitted ones. See the
// package documentation for the rule.
//
// Names are unique in the API. Should a name repeat, only its oldest
// definition is considered; a pool without a name, or a nil entry, is
// ignored.
func Admit(pools []*v1alpha1.IPPool) *Admission {
	ordered := slices.DeleteFunc(slices.Clone(pools), func(p *v1alpha1.IPPool) bool { return p == nil || p.Name == "" })
	slices.SortStableFunc(ordered, func(a, b *v1alpha1.IPPool) int { return v1alpha1.CompareAge(a, b) })

	// Each pool's own checks, oldest first.
	type outcome struct {
		pool    *Pool    // admitted so far
		refusal *Refusal // or refused, why
		ranges  []ipam.Range
	}
	var outcomes []outcome
	var specs []ipam.Pool
	seen := map[string]bool{}
	for _, p := range ordered {
		if seen[p.Name] {
			continue
		}
		seen[p.Name] = true
		pool, refusal, ranges := decode(p)
		outcomes = append(outcomes, outcome{pool, refusal, ranges})
		if pool != nil {
			specs = append(specs, pool.Spec)
		}
	}
	// Overlaps (and a pool without addresses): the allocator's own rule,
	// through the allocator itself, on the pools that passed their own
	// checks, oldest first.
	rejected := ipam.New().SetPools(specs)

	adm := &Admission{refused: map[string]int{}, held: map[string]*BGP{}}
	for _, p := range ordered {
		if _, dup := adm.held[p.Name]; !dup {
			adm.held[p.Name] = heldBGP(p.Spec.BGP)
		}
	}
	for _, o := range outcomes {
		if o.pool != nil {
			err, bad := rejected[o.pool.Name]
			if !bad {
				adm.Pools = append(adm.Pools, o.pool)
				continue
			}
			r := AllocatorRefusal(o.pool.Name, err)
			o.refusal = &r
		}
		adm.refused[o.refusal.Pool] = len(adm.Refused)
		adm.Refused = append(adm.Refused, *o.refusal)
		adm.refusedRanges = append(adm.refusedRanges, o.ranges)
	}
	for _, p := range adm.Pools {
		for _, r := range p.Ranges {
			adm.index = append(adm.index, ownedRange{Range: r, pool: p})
		}
	}
	slices.SortFunc(adm.index, func(a, b ownedRange) int { return a.First.Compare(b.First) })
	return adm
}

// decode parses p's addresses, allocation settings and spec.bgp, in that
// order, and returns the decoded pool or the first problem (with the
// ranges, when the addresses parsed).
func decode(p *v1alpha1.IPPool) (*Pool, *Refusal, []ipam.Range) {
	ranges, err := ipam.ParseAddresses(p.Spec.Addresses)
	if err != nil {
		return nil, &Refusal{p.Name, addressesReason(err), "spec.addresses: " + err.Error()}, nil
	}
	spec := ipam.Pool{
		Name:          p.Name,
		Addresses:     p.Spec.Addresses,
		AutoAssign:    p.Spec.AutoAssignOrDefault(),
		AvoidBuggyIPs: p.Spec.AvoidBuggyIPs,
		Priority:      UnsetPriority,
		// A pool being deleted keeps what its Services hold and hands out
		// nothing new.
		Terminating: p.DeletionTimestamp != nil,
	}
	if a := p.Spec.Allocation; a != nil {
		if a.Priority != nil {
			spec.Priority = int(*a.Priority)
		}
		spec.Namespaces = a.Namespaces
		var msg string
		if spec.NamespaceSelectors, msg = selectors("spec.allocation.namespaceSelectors", a.NamespaceSelectors); msg != "" {
			return nil, &Refusal{p.Name, v1alpha1.ReasonInvalidSelector, msg}, ranges
		}
		if spec.ServiceSelectors, msg = selectors("spec.allocation.serviceSelectors", a.ServiceSelectors); msg != "" {
			return nil, &Refusal{p.Name, v1alpha1.ReasonInvalidSelector, msg}, ranges
		}
	}
	bgp, prob := decodeBGP(p.Spec.BGP, ranges)
	if prob != nil {
		// A pool the speakers would not announce would hand out VIPs that
		// nobody routes: refuse it until spec.bgp is fixed.
		return nil, &Refusal{p.Name, prob.reason, prob.message + " (the speakers would not announce this pool, so no VIP is allocated from it)"}, ranges
	}
	return &Pool{Name: p.Name, Spec: spec, Ranges: ranges, BGP: bgp}, nil, ranges
}

// AllocatorRefusal is the Refusal of pool for err, an error of
// ipam.Allocator.SetPools about it (an overlap, or no addresses).
func AllocatorRefusal(pool string, err error) Refusal {
	return Refusal{pool, addressesReason(err), "spec.addresses: " + err.Error()}
}

// addressesReason is the condition reason of an error about spec.addresses:
// ReasonOverlap when addresses overlap (within the pool or with an older
// pool), else ReasonInvalidAddresses.
func addressesReason(err error) string {
	if ipam.ReasonOf(err) == ipam.ReasonOverlap {
		return v1alpha1.ReasonOverlap
	}
	return v1alpha1.ReasonInvalidAddresses
}

// selectors parses a list of label selectors; the message names the entry
// at fault and the fix.
func selectors(field string, in []metav1.LabelSelector) ([]labels.Selector, string) {
	var out []labels.Selector
	for i := range in {
		sel, msg := selector(fmt.Sprintf("%s[%d]", field, i), &in[i])
		if msg != "" {
			return nil, msg
		}
		out = append(out, sel)
	}
	return out, ""
}

// selector parses one label selector (nil gives nil); the message names
// field and the fix.
func selector(field string, s *metav1.LabelSelector) (labels.Selector, string) {
	if s == nil {
		return nil, ""
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return nil, fmt.Sprintf("%s: %v; fix the selector (operators are In, NotIn, Exists, DoesNotExist)", field, err)
	}
	return sel, ""
}

// Specs returns the admitted pools as the allocator takes them, oldest
// first. ipam.Allocator.SetPools accepts every one of them.
func (a *Admission) Specs() []ipam.Pool {
	out := make([]ipam.Pool, len(a.Pools))
	for i, p := range a.Pools {
		out[i] = p.Spec
	}
	return out
}

// PoolFor returns the admitted pool that owns ip, or nil. It costs
// O(log ranges).
func (a *Admission) PoolFor(ip netip.Addr) *Pool {
	i, _ := slices.BinarySearchFunc(a.index, ip, func(r ownedRange, ip netip.Addr) int {
		return r.Last.Compare(ip)
	})
	if i < len(a.index) && a.index[i].Contains(ip) {
		return a.index[i].pool
	}
	return nil
}

// Owner returns the name of the admitted pool that owns ip, or "".
func (a *Admission) Owner(ip netip.Addr) string {
	if p := a.PoolFor(ip); p != nil {
		return p.Name
	}
	return ""
}

// RefusalOf returns why the pool called name was refused, if it was.
func (a *Admission) RefusalOf(name string) (Refusal, bool) {
	i, ok := a.refused[name]
	if !ok {
		return Refusal{}, false
	}
	return a.Refused[i], true
}

// RefusedContaining returns the refusal of the oldest refused pool whose
// spec.addresses contain ip, if any. A refused pool owns nothing: this
// only explains why an address a Service asks for is in no pool.
func (a *Admission) RefusedContaining(ip netip.Addr) (Refusal, bool) {
	for i, ranges := range a.refusedRanges {
		if slices.ContainsFunc(ranges, func(r ipam.Range) bool { return r.Contains(ip) }) {
			return a.Refused[i], true
		}
	}
	return Refusal{}, false
}
