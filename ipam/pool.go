package ipam

import (
	"fmt"
	"math/big"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
)

// pool is an installed pool.
type pool struct {
	cfg     Pool
	ranges  []*prange // in the order given
	fams    [2]famState
	nsSels  []labels.Selector // NamespaceSelectors without nil entries
	svcSels []labels.Selector // ServiceSelectors without nil entries
}

// famState is the per-family accounting of a pool.
type famState struct {
	capacity *big.Int // usable addresses
	inUse    int      // distinct held addresses
}

// prange is one address entry of an installed pool.
type prange struct {
	Range
	pool  *pool
	pos   int    // index in the pool's Addresses
	entry string // the entry as written
	space
	used runs
}

func newPool(cfg Pool, rs []Range) *pool {
	cfg.Addresses = slices.Clone(cfg.Addresses)
	cfg.Namespaces = slices.Clone(cfg.Namespaces)
	p := &pool{
		cfg:     cfg,
		nsSels:  nonNil(cfg.NamespaceSelectors),
		svcSels: nonNil(cfg.ServiceSelectors),
	}
	p.fams[0].capacity = new(big.Int)
	p.fams[1].capacity = new(big.Int)
	for i, r := range rs {
		pr := &prange{Range: r, pool: p, pos: i, entry: cfg.Addresses[i], space: newSpace(r, cfg.AvoidBuggyIPs)}
		p.ranges = append(p.ranges, pr)
		c := p.fams[r.Family().slot()].capacity
		c.Add(c, pr.capacity())
	}
	return p
}

func (p *pool) name() string { return p.cfg.Name }

// has reports whether the pool has usable addresses of family f.
func (p *pool) has(f Family) bool { return p.fams[f.slot()].capacity.Sign() > 0 }

// lowestFree returns the lowest free address of family f, ranges in the
// order given.
func (p *pool) lowestFree(f Family) (netip.Addr, bool) {
	for _, r := range p.ranges {
		if r.fam != f || r.empty {
			continue
		}
		if i, ok := r.used.lowestFree(r.last); ok {
			return r.addr(i), true
		}
	}
	return netip.Addr{}, false
}

// refuses returns why the pool does not admit the request — it is
// Terminating, or its namespace and Service constraints exclude the
// request — or "" if it does. AutoAssign is not considered.
func (p *pool) refuses(req *normReq) string {
	if p.cfg.Terminating {
		return fmt.Sprintf("pool %q is being deleted and hands out no new address", p.name())
	}
	if !p.admitsNamespace(req) {
		return fmt.Sprintf("pool %q only serves namespaces %s, not %q", p.name(), p.namespaceRule(), req.Namespace)
	}
	if !p.admitsService(req) {
		return fmt.Sprintf("pool %q only serves Services labelled %s, which this Service's labels do not match", p.name(), p.serviceRule())
	}
	return ""
}

func (p *pool) admitsNamespace(req *normReq) bool {
	c := &p.cfg
	sels := p.nsSels
	if len(c.Namespaces) == 0 && len(sels) == 0 {
		return true
	}
	if slices.Contains(c.Namespaces, req.Namespace) {
		return true
	}
	set := labels.Set(req.NamespaceLabels)
	return slices.ContainsFunc(sels, func(s labels.Selector) bool { return s.Matches(set) })
}

func (p *pool) admitsService(req *normReq) bool {
	if len(p.svcSels) == 0 {
		return true
	}
	set := labels.Set(req.ServiceLabels)
	return slices.ContainsFunc(p.svcSels, func(s labels.Selector) bool { return s.Matches(set) })
}

// namespaceRule describes the namespace constraints, e.g.
// `a, b or labelled "env=prod"`.
func (p *pool) namespaceRule() string {
	var parts []string
	if len(p.cfg.Namespaces) > 0 {
		parts = append(parts, strings.Join(p.cfg.Namespaces, ", "))
	}
	if len(p.nsSels) > 0 {
		parts = append(parts, "labelled "+selectorList(p.nsSels))
	}
	return strings.Join(parts, " or ")
}

func (p *pool) serviceRule() string { return selectorList(p.svcSels) }

// selectorList renders selectors as `"a=b" or "c in (d)"`.
func selectorList(sels []labels.Selector) string {
	parts := make([]string, len(sels))
	for i, s := range sels {
		parts[i] = strconv.Quote(s.String())
	}
	return strings.Join(parts, " or ")
}

// nonNil returns the non-nil selectors of many.
func nonNil(many []labels.Selector) []labels.Selector {
	var out []labels.Selector
	for _, s := range many {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}

// offers returns why the pool cannot serve the request's families, or "".
func (p *pool) offers(req *normReq) string {
	if req.require {
		for _, f := range req.fams {
			if !p.has(f) {
				return fmt.Sprintf("pool %q has no %s addresses (RequireDualStack)", p.name(), f)
			}
		}
		return ""
	}
	if !p.has(req.fams[0]) {
		return fmt.Sprintf("pool %q has no %s addresses", p.name(), req.fams[0])
	}
	return ""
}

// inUseString summarises usage of family f, e.g. "254 of 254 in use".
func (p *pool) inUseString(f Family) string {
	return fmt.Sprintf("%d of %s in use", p.fams[f.slot()].inUse, p.fams[f.slot()].capacity)
}

// comparePools orders pools by Priority, then Name.
func comparePools(a, b *pool) int {
	if a.cfg.Priority != b.cfg.Priority {
		if a.cfg.Priority < b.cfg.Priority {
			return -1
		}
		return 1
	}
	return strings.Compare(a.cfg.Name, b.cfg.Name)
}

// rangeIndex holds every installed range sorted by First, for lookups and
// overlap checks.
type rangeIndex []*prange

// find returns the range containing ip, if any.
func (x rangeIndex) find(ip netip.Addr) *prange {
	// First range whose Last >= ip; ranges do not overlap, so Last is
	// sorted too.
	i, _ := slices.BinarySearchFunc(x, ip, func(r *prange, ip netip.Addr) int {
		return r.Last.Compare(ip)
	})
	if i < len(x) && x[i].Contains(ip) {
		return x[i]
	}
	return nil
}

// overlapping returns an installed range overlapping r, if any.
func (x rangeIndex) overlapping(r Range) *prange {
	i, _ := slices.BinarySearchFunc(x, r.First, func(pr *prange, ip netip.Addr) int {
		return pr.Last.Compare(ip)
	})
	if i < len(x) && x[i].Overlaps(r) {
		return x[i]
	}
	return nil
}

// insert adds r keeping the index sorted.
func (x rangeIndex) insert(r *prange) rangeIndex {
	i, _ := slices.BinarySearchFunc(x, r.First, func(pr *prange, ip netip.Addr) int {
		return pr.First.Compare(ip)
	})
	return slices.Insert(x, i, r)
}
