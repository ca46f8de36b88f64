package ipam

import (
	"net/netip"
	"slices"
)

// normReq is a validated Request.
type normReq struct {
	Request
	fams    []Family // wanted families, never empty; read only
	require bool     // every family in fams must be served
	attrs   shareAttrs
}

// normalize validates req and fills n. Requested addresses are unmapped
// (::ffff:a.b.c.d becomes a.b.c.d) and ordered by the wanted families.
func normalize(req Request, n *normReq) error {
	if req.Owner == "" {
		return newError(ReasonInvalid, "request has no owner; set Owner to the Service's namespace/name")
	}
	*n = normReq{Request: req}
	for i, f := range req.Families {
		if !f.valid() {
			return newError(ReasonInvalid, "%s: unknown address family %d; use IPv4 or IPv6", req.Owner, int(f))
		}
		if slices.Contains(req.Families[:i], f) {
			return newError(ReasonInvalid, "%s: family %s is listed twice; list each family once", req.Owner, f)
		}
	}
	n.fams = req.Families // read only
	ips, err := checkIPs(req.Owner, req.IPs)
	if err != nil {
		return err
	}
	n.IPs = ips
	if len(n.fams) == 0 {
		for _, ip := range ips {
			n.fams = append(n.fams, FamilyOf(ip))
		}
		if len(n.fams) == 0 {
			n.fams = []Family{IPv4}
		}
	}
	n.require = req.RequireAllFamilies && len(n.fams) > 1
	if n.require && len(ips) > 0 {
		for _, f := range n.fams {
			if !slices.ContainsFunc(ips, func(ip netip.Addr) bool { return FamilyOf(ip) == f }) {
				return newError(ReasonInvalid,
					"%s: RequireDualStack needs an address of every family but no %s address is requested; request one address per family, or use PreferDualStack",
					req.Owner, f)
			}
		}
	}
	n.orderIPs(n.IPs)
	n.attrs = shareAttrs{
		key:         req.SharingKey,
		namespace:   req.Namespace,
		shareWith:   sortedNamespaces(req.ShareWithNamespaces),
		ports:       sortedPorts(req.Ports),
		local:       req.LocalTrafficPolicy,
		podSelector: req.PodSelector,
	}
	return nil
}

// checkIPs validates requested or restored addresses: valid, unscoped, at
// most one per family. It returns unmapped copies.
func checkIPs(owner string, in []netip.Addr) ([]netip.Addr, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]netip.Addr, 0, len(in))
	for _, ip := range in {
		if !ip.IsValid() {
			return nil, newError(ReasonInvalid, "%s: requested address is empty or invalid; give an IPv4 or IPv6 address", owner)
		}
		if ip.Zone() != "" {
			return nil, newError(ReasonInvalid, "%s: address %s has a zone; VIPs cannot be scoped, remove %q", owner, ip, "%"+ip.Zone())
		}
		ip = ip.Unmap()
		for _, prev := range out {
			if FamilyOf(prev) == FamilyOf(ip) {
				return nil, newError(ReasonInvalid, "%s: two %s addresses (%s and %s); a Service gets at most one address per family, keep one",
					owner, FamilyOf(ip), prev, ip)
			}
		}
		out = append(out, ip)
	}
	return out, nil
}

// famRank is the position of f in the wanted families (len if absent).
func (n *normReq) famRank(f Family) int {
	if i := slices.Index(n.fams, f); i >= 0 {
		return i
	}
	return len(n.fams)
}

// wants reports whether family f is wanted.
func (n *normReq) wants(f Family) bool { return slices.Contains(n.fams, f) }

// orderIPs sorts ips by the wanted family order.
func (n *normReq) orderIPs(ips []netip.Addr) {
	if len(ips) < 2 {
		return
	}
	slices.SortStableFunc(ips, func(a, b netip.Addr) int { return n.famRank(FamilyOf(a)) - n.famRank(FamilyOf(b)) })
}
