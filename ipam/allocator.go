package ipam

import (
	"net/netip"
	"slices"
	"sync"
)

// Allocator hands out addresses from pools. It is safe for concurrent use.
type Allocator struct {
	mu     sync.Mutex
	pools  map[string]*pool
	order  []*pool    // installed pools by Priority, then Name
	index  rangeIndex // installed ranges by address
	owners map[string]*owner
	ips    map[netip.Addr]*ipState
	byKey  map[string]map[netip.Addr]*ipState // held addresses by sharing key
}

// owner is what one owner holds.
type owner struct {
	name   string
	held   []*ipState // in the order of the owner's wanted families
	attrs  shareAttrs
	inline [2]*ipState // backing store of held: one address per family
}

// ipState is one held address.
type ipState struct {
	addr    netip.Addr
	holders []*owner // sorted by name; never empty while in Allocator.ips
	key     string   // sharing key under which st is filed in byKey
	// legacy: Restore found holders sharing the address that today's rules
	// would not let share (as older releases did); they are judged by the
	// old rules (legacyConflict) until the exception ends, newcomers by
	// today's. Reset when the holders meet today's rules (rekey).
	legacy bool
	rng    *prange // range accounting for the address; nil for an orphan
	idx    u128    // index of addr in rng
	one    [1]*owner
}

// ips returns the owner's addresses.
func (o *owner) ips() []netip.Addr {
	out := make([]netip.Addr, len(o.held))
	for i, st := range o.held {
		out[i] = st.addr
	}
	return out
}

// holds returns the owner's state for ip, if it holds it.
func (o *owner) holds(ip netip.Addr) *ipState {
	if o == nil {
		return nil
	}
	for _, st := range o.held {
		if st.addr == ip {
			return st
		}
	}
	return nil
}

// New returns an Allocator without pools.
func New() *Allocator {
	return &Allocator{
		pools:  map[string]*pool{},
		owners: map[string]*owner{},
		ips:    map[netip.Addr]*ipState{},
		byKey:  map[string]map[netip.Addr]*ipState{},
	}
}

// locate returns the installed range containing ip and its index there;
// usable is false if no range contains ip or ip is an avoided buggy address.
func (a *Allocator) locate(ip netip.Addr) (r *prange, idx u128, usable bool) {
	r = a.index.find(ip)
	if r == nil {
		return nil, u128{}, false
	}
	idx, usable = r.index(ip)
	return r, idx, usable
}

// account places st in the range that contains its address, if any.
func (a *Allocator) account(st *ipState) {
	r, idx, ok := a.locate(st.addr)
	if !ok {
		st.rng = nil
		return
	}
	st.rng, st.idx = r, idx
	r.used.insert(idx)
	r.pool.fams[FamilyOf(st.addr).slot()].inUse++
}

// hold adds o to the holders of ip, accounting the address if it was free.
func (a *Allocator) hold(ip netip.Addr, o *owner) *ipState {
	st := a.ips[ip]
	if st == nil {
		st = &ipState{addr: ip}
		st.holders = st.one[:0]
		a.account(st)
		a.ips[ip] = st
	}
	st.addHolder(o)
	return st
}

// drop removes o from the holders of st, freeing the address when nobody
// holds it any more.
func (a *Allocator) drop(st *ipState, o *owner) {
	st.removeHolder(o)
	if len(st.holders) > 0 {
		a.rekey(st)
		return
	}
	if r := st.rng; r != nil {
		r.used.remove(st.idx)
		r.pool.fams[FamilyOf(st.addr).slot()].inUse--
	}
	a.rekey(st)
	delete(a.ips, st.addr)
}

// commit makes ips the holdings of owner `name` (o, or a new owner if o is
// nil) with attrs, obtaining the new addresses before releasing the old
// ones. It returns the owner, or nil if it holds nothing any more.
func (a *Allocator) commit(o *owner, name string, attrs shareAttrs, ips []netip.Addr) *owner {
	if o == nil {
		if len(ips) == 0 {
			return nil
		}
		o = &owner{name: name}
		o.held = o.inline[:0]
		a.owners[name] = o
	}
	o.attrs = attrs
	var buf [2]*ipState
	held := buf[:0]
	for _, ip := range ips {
		st := o.holds(ip)
		if st == nil {
			st = a.hold(ip, o)
		}
		held = append(held, st)
	}
	for _, st := range o.held {
		if !slices.Contains(held, st) {
			a.drop(st, o)
		}
	}
	o.held = append(o.inline[:0], held...)
	for _, st := range held {
		a.rekey(st)
	}
	if len(held) == 0 {
		delete(a.owners, name)
		return nil
	}
	return o
}

// assignment reports what o holds.
func (o *owner) assignment() Assignment {
	return Assignment{Pool: o.pool(), IPs: o.ips()}
}

// pool returns the pool of the first held address that is in a pool.
func (o *owner) pool() string {
	for _, st := range o.held {
		if st.rng != nil {
			return st.rng.pool.name()
		}
	}
	return ""
}

// Release frees everything owner holds; shared addresses stay with the
// remaining sharers.
func (a *Allocator) Release(owner string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.owners[owner]
	if o == nil {
		return
	}
	for _, st := range o.held {
		a.drop(st, o)
	}
	delete(a.owners, owner)
}

// Assigned returns what owner holds.
func (a *Allocator) Assigned(owner string) (Assignment, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.owners[owner]
	if o == nil {
		return Assignment{}, false
	}
	return o.assignment(), true
}

// Holders returns the owners holding ip, sorted.
func (a *Allocator) Holders(ip netip.Addr) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.ips[ip.Unmap()]
	if st == nil {
		return nil
	}
	out := make([]string, len(st.holders))
	for i, h := range st.holders {
		out[i] = h.name
	}
	return out
}

// PoolOf returns the name of the installed pool whose addresses contain
// ip, and true; or "", false when no installed pool contains it. Pools do
// not overlap, so at most one does: it is the pool that owns ip, the one a
// Service holding ip is accounted in and a request for ip is served from.
// An address the pool avoids (AvoidBuggyIPs) still belongs to it, though it
// is never handed out. ip is looked up as given: an IPv4-mapped IPv6
// address is an IPv6 address here. It costs O(log ranges).
func (a *Allocator) PoolOf(ip netip.Addr) (string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r := a.index.find(ip); r != nil {
		return r.pool.name(), true
	}
	return "", false
}

// Restore records that the request's owner already holds ips (read back
// from a Service's status at start-up), whether or not a pool contains them,
// replacing whatever it held before; an empty ips releases the owner. It
// fails only if an address is held by another owner that may not share it
// under the rules of any release (the error names that owner), or if ips
// is malformed (two addresses of one family). A share only older releases
// allowed is restored as a legacy share (see LegacyShare): a restore never
// renumbers. Restore is meant to be called before any Assign.
func (a *Allocator) Restore(req Request, ips []netip.Addr) error {
	nr := &normReq{}
	err := normalize(Request{
		Owner: req.Owner, Namespace: req.Namespace, SharingKey: req.SharingKey,
		ShareWithNamespaces: req.ShareWithNamespaces, Ports: req.Ports,
		LocalTrafficPolicy: req.LocalTrafficPolicy, PodSelector: req.PodSelector,
		Families: req.Families,
	}, nr)
	if err != nil {
		return err
	}
	ips, err = checkIPs(req.Owner, ips)
	if err != nil {
		return err
	}
	nr.orderIPs(ips)
	a.mu.Lock()
	defer a.mu.Unlock()
	var legacy []netip.Addr
	for _, ip := range ips {
		st := a.ips[ip]
		if st == nil {
			continue
		}
		if err := canShare(st, nr.Owner, &nr.attrs); err != nil {
			// Only a share an older release made is restored anyway.
			for _, h := range st.holders {
				if h.name != nr.Owner {
					if lerr := legacyConflict(ip, nr.Owner, &nr.attrs, h); lerr != nil {
						return lerr
					}
				}
			}
			legacy = append(legacy, ip)
		}
	}
	for _, ip := range legacy {
		a.ips[ip].legacy = true
	}
	a.commit(a.owners[nr.Owner], nr.Owner, nr.attrs, ips)
	return nil
}
