package speaker

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// sourceRanges reads which clients a Service admits, as the cloud-provider
// helper (servicehelper.GetLoadBalancerSourceRanges) does:
// spec.loadBalancerSourceRanges when it lists any range, else the
// service.beta.kubernetes.io/load-balancer-source-ranges annotation (a
// comma-separated list), else every client (restricted false).
//
// A range that does not parse fails closed: the Service is restricted to
// the ranges that do parse, possibly none, and problem names the field
// and the fix. A range is masked to its prefix ("10.0.0.1/8" is
// 10.0.0.0/8), as kube-proxy reads it.
func sourceRanges(svc *v1.Service) (restricted bool, ranges []netip.Prefix, problem string) {
	field := "spec.loadBalancerSourceRanges"
	list := svc.Spec.LoadBalancerSourceRanges
	if len(list) == 0 {
		field = "annotation " + v1.AnnotationLoadBalancerSourceRangesKey
		val := strings.TrimSpace(svc.Annotations[v1.AnnotationLoadBalancerSourceRangesKey])
		if val == "" {
			return false, nil, ""
		}
		list = strings.Split(val, ",")
	}
	var bad []string
	for _, s := range list {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil || p.Addr().Zone() != "" {
			bad = append(bad, fmt.Sprintf("%q", s))
			continue
		}
		ranges = append(ranges, p.Masked())
	}
	if len(bad) > 0 {
		admits := "only the valid ranges"
		if len(ranges) == 0 {
			admits = "no client"
		}
		problem = fmt.Sprintf("%s: %s: not a source range (a CIDR such as 10.20.0.0/16 or 2001:db8::/48); the VIP admits %s until it is fixed",
			field, strings.Join(bad, ", "), admits)
	}
	return true, ranges, problem
}

// vipRanges returns the ranges of vip's family among ranges, plus vip
// itself when one of them holds the node's address of that family: the
// node's own connections to a VIP leave from the VIP (the kernel's source
// for a local destination), and kube-proxy lets the node in on that same
// condition.
func vipRanges(vip netip.Addr, ranges []netip.Prefix, node *Node) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ranges)+1)
	self, hasSelf := node.NextHop(vip)
	admitsNode := false
	for _, r := range ranges {
		if r.Addr().Is4() != vip.Is4() {
			continue
		}
		out = append(out, r)
		admitsNode = admitsNode || (hasSelf && r.Contains(self))
	}
	if admitsNode {
		out = append(out, netip.PrefixFrom(vip, vip.BitLen()))
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
