package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Stale flows: a UDP or SCTP flow has no end the kernel sees, so its
// conntrack entry, and with it the pod tier 2 sent it to, lasts as long as
// the client keeps sending (a DNS or syslog client with a fixed source
// port: for ever). When an endpoint leaves tier 2 for good (gone, or no
// longer serving; not while it drains with weight 0, but when it leaves
// after draining), the flows tier 2 sent to it are deleted from conntrack
// after the map changes, and their next datagram is balanced afresh, as
// kube-proxy clears the conntrack entries of a removed UDP endpoint. TCP needs nothing: a client learns of
// a pod that went away from its resets or timeouts. One tier has IPVS
// itself expire the connections of a deleted real server
// (net.ipv4.vs.expire_nodest_conn, see node.go).

// StaleFlow names the flows of a tier-2 virtual server Key that tier 2
// sent to To, an endpoint that left it.
type StaleFlow struct {
	Key Key
	To  netip.AddrPort
}

// staleFlows returns the endpoints the slot map plan p (tier 2's, or the
// in-cluster map's) takes out of a UDP or SCTP virtual server for good: a
// slot's endpoint that desired (the virtual server as wanted, nil when it
// goes) does not list among its Local or Cluster endpoints at any weight.
// Sorted, without repeats.
func staleFlows(p Tier2Plan, desired func(Key) *Service) []StaleFlow {
	if len(p.Del) == 0 {
		return nil
	}
	var out []StaleFlow
	for _, s := range p.Del {
		if s.Key.Protocol != UDP && s.Key.Protocol != SCTP {
			continue
		}
		if svc := desired(s.Key); svc != nil {
			if _, ok := slices.BinarySearchFunc(servingOf(svc), s.To, netip.AddrPort.Compare); ok {
				continue
			}
		}
		out = append(out, StaleFlow{Key: s.Key, To: s.To})
	}
	slices.SortFunc(out, func(a, b StaleFlow) int {
		if c := a.Key.compare(b.Key); c != 0 {
			return c
		}
		return a.To.Compare(b.To)
	})
	return slices.Compact(out)
}

// servingSets are the Local endpoints, at any weight, of the UDP and SCTP
// virtual servers as last planned. An endpoint that drains first (weight
// 0: it loses its slots, keeping its flows) and leaves later takes no slot
// with it when it leaves: only this record knows that its flows are now
// stale. kube-proxy, likewise, clears the flows of an endpoint when it
// stops serving, whatever came before.
type servingSets map[Key][]netip.AddrPort

// servingOf returns the endpoints of svc (nil: none) that tier 2 or the
// in-cluster map may have sent UDP or SCTP flows to, sorted: its Local and
// Cluster endpoints at any weight.
func servingOf(svc *Service) []netip.AddrPort {
	if svc == nil || (svc.Protocol != UDP && svc.Protocol != SCTP) {
		return nil
	}
	var out []netip.AddrPort
	for _, b := range append(slices.Clone(svc.Local), svc.Cluster...) {
		out = append(out, netip.AddrPortFrom(b.Addr.Unmap(), b.Port))
	}
	slices.SortFunc(out, netip.AddrPort.Compare)
	return slices.Compact(out)
}

// update records desired (nil: it goes) for key and returns the endpoints
// key had and desired has not, as stale flows.
func (s servingSets) update(key Key, desired *Service) []StaleFlow {
	key.VIP = key.VIP.Unmap()
	now := servingOf(desired)
	var out []StaleFlow
	for _, ap := range s[key] {
		if _, found := slices.BinarySearchFunc(now, ap, netip.AddrPort.Compare); !found {
			out = append(out, StaleFlow{Key: key, To: ap})
		}
	}
	if now == nil {
		delete(s, key)
	} else {
		s[key] = now
	}
	return out
}

// updateAll is update for every virtual server of s and of desired.
func (s servingSets) updateAll(desired State) []StaleFlow {
	lookup := desiredIn(desired)
	var out []StaleFlow
	for k := range s {
		if lookup(k) == nil {
			out = append(out, s.update(k, nil)...)
		}
	}
	for _, svc := range desired.Services {
		out = append(out, s.update(svc.Key(), &svc)...)
	}
	return out
}

// mergeStale returns the lists together, sorted, without repeats.
func mergeStale(lists ...[]StaleFlow) []StaleFlow {
	out := slices.Concat(lists...)
	slices.SortFunc(out, func(x, y StaleFlow) int {
		if c := x.Key.compare(y.Key); c != 0 {
			return c
		}
		return x.To.Compare(y.To)
	})
	return slices.Compact(out)
}

// desiredIn returns a lookup of the virtual servers of st by key, for
// staleFlows: the index is built on the first lookup, so a full Sync
// whose tier-2 plan deletes nothing builds none.
func desiredIn(st State) func(Key) *Service {
	var byKey map[Key]*Service
	return func(k Key) *Service {
		if byKey == nil {
			byKey = make(map[Key]*Service, len(st.Services))
			for _, svc := range st.Services {
				sk := svc.Key()
				sk.VIP = sk.VIP.Unmap()
				byKey[sk] = &svc
			}
		}
		return byKey[k]
	}
}

// desiredOne is desiredIn for the one virtual server key (desired nil:
// it goes).
func desiredOne(key Key, desired *Service) func(Key) *Service {
	key.VIP = key.VIP.Unmap()
	return func(k Key) *Service {
		if k == key {
			return desired
		}
		return nil
	}
}

// errNoConntrackHandle: stale flows without the conntrack handle, which
// New opens with the two tiers or the in-cluster map only.
var errNoConntrackHandle = errors.New("no conntrack netlink socket (neither the two-tier dataplane nor the in-cluster map is on)")

// conntrack finds the stale flows of the plans and deletes their
// conntrack entries, through a netfilter netlink handle in New's network
// namespace. A Dataplane has one while a slot map is on (the two tiers,
// the in-cluster map); without, its conntrack is nil, which finds no stale
// flow.
type conntrack struct {
	h *netlink.Handle
	// serving are the UDP and SCTP virtual servers' Local and Cluster
	// endpoints as last planned.
	serving servingSets
}

// newConntrack opens the handle.
func newConntrack() (*conntrack, error) {
	h, err := netlink.NewHandle(unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("conntrack netlink: %w", err)
	}
	return &conntrack{h: h, serving: servingSets{}}, nil
}

// close releases the handle.
func (c *conntrack) close() {
	if c != nil {
		c.h.Close()
	}
}

// staleOfSync returns the stale flows of p, a full Sync's plan to
// desired.
func (c *conntrack) staleOfSync(p Plan, desired State) []StaleFlow {
	if c == nil {
		return nil
	}
	in := desiredIn(desired)
	return mergeStale(staleFlows(p.Tier2, in), staleFlows(p.InCluster, in), c.serving.updateAll(desired))
}

// staleOfService returns the stale flows of p, the plan of the one
// virtual server key to desired (nil: it goes).
func (c *conntrack) staleOfService(p Plan, key Key, desired *Service) []StaleFlow {
	if c == nil {
		return nil
	}
	one := desiredOne(key, desired)
	return mergeStale(staleFlows(p.Tier2, one), staleFlows(p.InCluster, one), c.serving.update(key, desired))
}

// clear deletes the conntrack entries of the flows in stale:
// the protocol, original destination the VIP and port, reply source the
// endpoint's address (a virtual server sends to one port of it). One walk
// of the conntrack table per family.
func (c *conntrack) clear(stale []StaleFlow, f *failures) {
	if len(stale) == 0 {
		return
	}
	if c == nil {
		f.add("stale flows", errNoConntrackHandle)
		return
	}
	var filters [2][]netlink.CustomConntrackFilter
	for _, s := range stale {
		var cf netlink.ConntrackFilter
		err := cf.AddProtocol(uint8(s.Key.Protocol)) //nolint:gosec // G115: staleFlows keeps UDP (17) and SCTP (132)
		if err == nil {
			err = cf.AddIP(netlink.ConntrackOrigDstIP, net.IP(s.Key.VIP.AsSlice()))
		}
		if err == nil {
			err = cf.AddPort(netlink.ConntrackOrigDstPort, s.Key.Port)
		}
		if err == nil {
			err = cf.AddIP(netlink.ConntrackReplySrcIP, net.IP(s.To.Addr().AsSlice()))
		}
		if err != nil {
			f.addKey(s.Key, "stale flows of "+s.Key.String()+" to "+s.To.String(), err)
			continue
		}
		fam := 0
		if s.Key.VIP.Is6() {
			fam = 1
		}
		filters[fam] = append(filters[fam], &cf)
	}
	for fam, fs := range filters {
		if len(fs) == 0 {
			continue
		}
		family := netlink.InetFamily(unix.AF_INET)
		if fam == 1 {
			family = unix.AF_INET6
		}
		if err := c.deleteFlows(family, fs...); err != nil {
			f.add("delete the conntrack entries of stale UDP and SCTP flows", err)
		}
	}
}

// servedBy is, for each UDP and SCTP virtual server of a desired state,
// every endpoint a flow to it may rightly be sent to: its Local endpoints
// at any weight and its real servers. A virtual server that goes has an
// entry with none.
type servedBy map[Key][]netip.AddrPort

// servedByOf returns the servedBy of desired, with an empty entry for
// each virtual server of gone that desired no longer has.
func servedByOf(desired State, gone []StaleFlow) servedBy {
	out := servedBy{}
	for _, s := range gone {
		out[s.Key] = nil
	}
	for _, svc := range desired.Services {
		if svc.Protocol != UDP && svc.Protocol != SCTP {
			continue
		}
		k := svc.Key()
		k.VIP = k.VIP.Unmap()
		eps := servingOf(&svc)
		for _, b := range svc.Backends {
			eps = append(eps, netip.AddrPortFrom(b.Addr.Unmap(), b.Port))
		}
		out[k] = eps
	}
	return out
}

// MatchConntrackFlow matches the conntrack entry of a UDP or SCTP flow
// to one of s's virtual servers that was sent (its reply's source is not
// the VIP: tier 2's DNAT, or IPVS's) to an endpoint s does not list.
func (s servedBy) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if p := Protocol(flow.Forward.Protocol); p != UDP && p != SCTP {
		return false
	}
	vip, ok := netip.AddrFromSlice(flow.Forward.DstIP)
	to, ok2 := netip.AddrFromSlice(flow.Reverse.SrcIP)
	if !ok || !ok2 || vip.Unmap() == to.Unmap() {
		return false
	}
	eps, ok := s[Key{VIP: vip.Unmap(), Port: flow.Forward.DstPort, Protocol: Protocol(flow.Forward.Protocol)}]
	return ok && !slices.Contains(eps, netip.AddrPortFrom(to.Unmap(), flow.Reverse.SrcPort))
}

// clearUnserved deletes the conntrack entries of the UDP and SCTP flows to
// desired's virtual servers that went to an endpoint desired does not
// list, and those of the flows in stale, in one walk of the table per
// family. A full Sync after New (or after a failure) does it, in place of
// clear: what servingSets knew of the endpoints that drained
// before they left is gone with the process that knew it, and the
// endpoints that left while no speaker ran left no plan behind; as
// kube-proxy reconciles the whole conntrack table against its endpoints.
// It reports whether it cleared them all.
func (c *conntrack) clearUnserved(desired State, stale []StaleFlow, f *failures) (ok bool) {
	if c == nil {
		return true
	}
	served := servedByOf(desired, stale)
	if len(served) == 0 {
		return true
	}
	ok = true
	for _, family := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		if err := c.deleteFlows(family, served); err != nil {
			f.add("delete the conntrack entries of UDP and SCTP flows to endpoints that left", err)
			ok = false
		}
	}
	return ok
}

// deleteFlows walks the conntrack table of family once and deletes the
// flows filters match. A walk the kernel marks interrupted (the table
// changed under it) has deleted what it read and may have missed some: it
// is made again, through dump.
func (c *conntrack) deleteFlows(family netlink.InetFamily, filters ...netlink.CustomConntrackFilter) error {
	_, err := dump("the conntrack table", func() ([]uint, error) {
		n, err := c.h.ConntrackDeleteFilters(netlink.ConntrackTable, family, filters...)
		return []uint{n}, err
	})
	return err
}
