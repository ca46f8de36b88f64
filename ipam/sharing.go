package ipam

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// crossNamespaceAnnotation is the Service annotation the CCM reads into
// Request.ShareWithNamespaces, named in errors so users know the fix.
const crossNamespaceAnnotation = "vipcast.io/allow-shared-ip-across-namespaces"

// shareAttrs are the parts of a request that decide whether two owners may
// share an address.
type shareAttrs struct {
	key         string
	namespace   string
	shareWith   []string // other namespaces it agrees to share with, sorted
	ports       []Port   // sorted by comparePorts, without duplicates
	local       bool
	podSelector string
}

// sortedNamespaces returns a sorted copy of namespaces without duplicates.
func sortedNamespaces(namespaces []string) []string {
	out := slices.Clone(namespaces)
	slices.Sort(out)
	return slices.Compact(out)
}

// names reports whether a agrees to share with namespace ns.
func (a *shareAttrs) names(ns string) bool {
	_, ok := slices.BinarySearch(a.shareWith, ns)
	return ok
}

// comparePorts orders ports by protocol, then number.
func comparePorts(p, q Port) int {
	if c := strings.Compare(p.Protocol, q.Protocol); c != 0 {
		return c
	}
	return cmp.Compare(p.Port, q.Port)
}

// sortedPorts returns a sorted copy of ports without duplicates, in
// O(P log P), so that clashes between two owners are found by a merge.
func sortedPorts(ports []Port) []Port {
	out := slices.Clone(ports)
	slices.SortFunc(out, comparePorts)
	return slices.Compact(out)
}

// firstClash returns the lowest port in both sorted lists, in O(P+Q).
func firstClash(ps, qs []Port) (Port, bool) {
	for i, j := 0, 0; i < len(ps) && j < len(qs); {
		switch c := comparePorts(ps[i], qs[j]); {
		case c < 0:
			i++
		case c > 0:
			j++
		default:
			return ps[i], true
		}
	}
	return Port{}, false
}

// shareConflict returns why an owner `name` with attrs a may not share ip
// with holder h under today's rules, or nil if it may: the same sharing
// key, the same externalTrafficPolicy, no common port, and with Local the
// same pod selector.
func shareConflict(ip netip.Addr, name string, a *shareAttrs, h *owner) *Error {
	if err := keyConflict(ip, name, a, h); err != nil {
		return err
	}
	if err := ruleConflict(ip, name, a, h); err != nil {
		return err
	}
	return portConflict(ip, name, a, h)
}

// legacyConflict is shareConflict under the rules of vipcast releases that
// let a Local and a Cluster Service share: the sharing key, the ports and,
// when either is Local, the pod selector. Restore admits shares it allows
// (see ipState.legacy).
func legacyConflict(ip netip.Addr, name string, a *shareAttrs, h *owner) *Error {
	if err := keyConflict(ip, name, a, h); err != nil {
		return err
	}
	return portConflict(ip, name, a, h)
}

func keyConflict(ip netip.Addr, name string, a *shareAttrs, h *owner) *Error {
	if a.key != "" && a.key == h.attrs.key {
		return nil
	}
	hint := "request another address, or set the same sharing key on both Services if they should share it"
	if a.key != "" && h.attrs.key != "" {
		hint = "their sharing keys differ (" + strconv.Quote(a.key) + " vs " + strconv.Quote(h.attrs.key) + "); use the same key on both to share it, or request another address"
	}
	return newError(ReasonInUse, "%s: address %s is already in use by %s; %s", name, ip, h.name, hint)
}

// ruleConflict checks the sharing rules older releases did not have: the
// same namespace unless each names the other's, never Local across
// namespaces, and the same traffic policy.
func ruleConflict(ip netip.Addr, name string, a *shareAttrs, h *owner) *Error {
	if a.namespace != h.attrs.namespace {
		var missing []string
		if !a.names(h.attrs.namespace) {
			missing = append(missing, fmt.Sprintf("%s does not name %s", name, h.attrs.namespace))
		}
		if !h.attrs.names(a.namespace) {
			missing = append(missing, fmt.Sprintf("%s does not name %s", h.name, a.namespace))
		}
		if len(missing) > 0 {
			return newError(ReasonInUse,
				"%s: address %s is already in use by %s, of another namespace, under sharing key %q; sharing keys are per namespace: to share across namespaces each Service names the other's namespace in annotation %s (%s), or request another address",
				name, ip, h.name, a.key, crossNamespaceAnnotation, strings.Join(missing, "; "))
		}
		if a.local || h.attrs.local {
			return newError(ReasonPolicyClash,
				"%s: cannot share address %s with %s, of another namespace, under sharing key %q: with externalTrafficPolicy Local the nodes announce the VIP by the Services' endpoints, and a pod selector selects pods of its own namespace only, so another namespace's pods would draw the traffic; use Cluster on both, or request another address",
				name, ip, h.name, a.key)
		}
	}
	if a.local != h.attrs.local {
		return newError(ReasonPolicyClash,
			"%s: cannot share address %s with %s under sharing key %q: %s has externalTrafficPolicy %s and %s has %s, and a Cluster Service's route from every node would draw the Local Service's traffic to nodes without its endpoints; give both the same externalTrafficPolicy, or use another sharing key",
			name, ip, h.name, a.key, name, policyName(a.local), h.name, policyName(h.attrs.local))
	}
	return nil
}

func policyName(local bool) string {
	if local {
		return "Local"
	}
	return "Cluster"
}

func portConflict(ip netip.Addr, name string, a *shareAttrs, h *owner) *Error {
	if p, clash := firstClash(a.ports, h.attrs.ports); clash {
		return newError(ReasonPortClash,
			"%s: cannot share address %s with %s under sharing key %q: both use port %s; change the port, or use another sharing key",
			name, ip, h.name, a.key, p)
	}
	if (a.local || h.attrs.local) && a.podSelector != h.attrs.podSelector {
		return newError(ReasonPortClash,
			"%s: cannot share address %s with %s under sharing key %q: with externalTrafficPolicy Local both Services must select the same pods, but their selectors differ (%s vs %s); align the selectors, or use Cluster on both",
			name, ip, h.name, a.key, strconv.Quote(a.podSelector), strconv.Quote(h.attrs.podSelector))
	}
	return nil
}

// canShare returns why owner `name` (with attrs a) may not hold st's
// address alongside its other holders, or nil. A holder of a legacy
// address is judged by the old rules; anyone else by today's.
func canShare(st *ipState, name string, a *shareAttrs) *Error {
	check := shareConflict
	if st.legacy && st.heldByName(name) {
		check = legacyConflict
	}
	for _, h := range st.holders {
		if h.name == name {
			continue
		}
		if err := check(st.addr, name, a, h); err != nil {
			return err
		}
	}
	return nil
}

// breaksRules returns the first pair of st's holders that today's rules
// would not let share, as the later one's error; nil if there is none.
func (st *ipState) breaksRules() *Error {
	for i, h := range st.holders {
		for _, g := range st.holders[:i] {
			if err := ruleConflict(st.addr, h.name, &h.attrs, g); err != nil {
				return err
			}
		}
	}
	return nil
}

// LegacyShare returns why owner could not share one of its addresses with
// the other holders under today's rules, when it holds it only because
// Restore found them sharing it (as an older release allowed); "" when it
// holds no such address. The holders keep the address; nobody may join it
// unless it meets today's rules with every holder.
func (a *Allocator) LegacyShare(owner string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.owners[owner]
	if o == nil {
		return ""
	}
	for _, st := range o.held {
		if !st.legacy {
			continue
		}
		for _, h := range st.holders {
			if h == o {
				continue
			}
			if err := ruleConflict(st.addr, o.name, &o.attrs, h); err != nil {
				return err.Msg
			}
		}
	}
	return ""
}

// addHolder inserts o into st.holders keeping them sorted by name.
func (st *ipState) addHolder(o *owner) {
	i, found := slices.BinarySearchFunc(st.holders, o.name, func(h *owner, n string) int { return strings.Compare(h.name, n) })
	if !found {
		st.holders = slices.Insert(st.holders, i, o)
	}
}

// removeHolder removes o from st.holders.
func (st *ipState) removeHolder(o *owner) {
	st.holders = slices.DeleteFunc(st.holders, func(h *owner) bool { return h == o })
}

// heldByName reports whether the owner called name holds st's address.
func (st *ipState) heldByName(name string) bool {
	_, found := slices.BinarySearchFunc(st.holders, name, func(h *owner, n string) int { return strings.Compare(h.name, n) })
	return found
}

// heldBy reports whether o holds st's address.
func (st *ipState) heldBy(o *owner) bool {
	return o != nil && slices.Contains(st.holders, o)
}

// rekey files st under the sharing key of its holders (all holders of a
// shared address have the same key) in a.byKey, and ends st's legacy
// exception once its holders meet today's rules.
func (a *Allocator) rekey(st *ipState) {
	if st.legacy && st.breaksRules() == nil {
		st.legacy = false
	}
	key := ""
	if len(st.holders) > 0 {
		key = st.holders[0].attrs.key
	}
	if key == st.key {
		return
	}
	if st.key != "" {
		if m := a.byKey[st.key]; m != nil {
			delete(m, st.addr)
			if len(m) == 0 {
				delete(a.byKey, st.key)
			}
		}
	}
	st.key = key
	if key != "" {
		m := a.byKey[key]
		if m == nil {
			m = make(map[netip.Addr]*ipState)
			a.byKey[key] = m
		}
		m[st.addr] = st
	}
}

// shareable returns the lowest address of family f in pool p already used
// under req's sharing key that the owner may share, if any.
func (a *Allocator) shareable(p *pool, f Family, req *normReq) (netip.Addr, bool) {
	if req.attrs.key == "" {
		return netip.Addr{}, false
	}
	var best netip.Addr
	for ip, st := range a.byKey[req.attrs.key] {
		if st.rng == nil || st.rng.pool != p || FamilyOf(ip) != f {
			continue
		}
		if best.IsValid() && !ip.Less(best) {
			continue
		}
		if canShare(st, req.Owner, &req.attrs) == nil {
			best = ip
		}
	}
	return best, best.IsValid()
}

// poolsSharable returns the pools holding an address the owner may share
// under req's sharing key.
func (a *Allocator) poolsSharable(req *normReq) map[*pool]bool {
	if req.attrs.key == "" {
		return nil
	}
	out := map[*pool]bool{}
	for _, st := range a.byKey[req.attrs.key] {
		if st.rng != nil && !out[st.rng.pool] && req.wants(FamilyOf(st.addr)) && canShare(st, req.Owner, &req.attrs) == nil {
			out[st.rng.pool] = true
		}
	}
	return out
}
