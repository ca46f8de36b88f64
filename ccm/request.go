package ccm

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/vipcast/vipcast/ipam"
	"github.com/vipcast/vipcast/poolspec"
)

// Service annotations read (and, for AnnotationPool, written) by vipcast.
const (
	// AnnotationPool names the IPPool to allocate from. The CCM writes it
	// with the pool it chose when the Service did not ask for one; it
	// records the pool of every Service's VIPs in
	// poolspec.AnnotationAllocatedFrom.
	AnnotationPool = poolspec.AnnotationPool
	// AnnotationIPs requests specific VIPs: a comma-separated list with at
	// most one IPv4 and one IPv6 address.
	AnnotationIPs = "vipcast.io/ips"
	// AnnotationSharingKey lets Services of one namespace with the same key
	// share a VIP when their ports do not clash and their
	// externalTrafficPolicy is the same.
	AnnotationSharingKey = "vipcast.io/sharing-key"
	// AnnotationAllowSharedIPAcrossNamespaces names, comma-separated, the
	// other namespaces whose Services a Service agrees to share a VIP with
	// under its sharing key; each must name the other's namespace, and
	// Local Services never share across namespaces. "false" or empty names
	// none; "true" (any namespace that opts in, before this release) is
	// refused: it let any namespace that knew the key join.
	AnnotationAllowSharedIPAcrossNamespaces = "vipcast.io/allow-shared-ip-across-namespaces"
)

// requestAliases are MetalLB's spellings of the request annotation key of
// vipcast's (AnnotationIPs, AnnotationPool, AnnotationSharingKey), which
// vipcast honours as aliases so that Services keep asking for what they
// asked MetalLB for: its current prefix, then the older one.
func requestAliases(key string) []string {
	var suffix string
	switch key {
	case AnnotationIPs:
		suffix = "loadBalancerIPs"
	case AnnotationPool:
		suffix = "address-pool"
	case AnnotationSharingKey:
		suffix = "allow-shared-ip"
	default:
		return nil
	}
	return []string{"metallb.io/" + suffix, "metallb.universe.tf/" + suffix}
}

// requestAnnotation returns the first spelling of the request annotation
// key that ann sets, vipcast's before MetalLB's (requestAliases), its value,
// and whether any is set.
func requestAnnotation(ann map[string]string, key string) (spelling, value string, set bool) {
	for _, k := range append([]string{key}, requestAliases(key)...) {
		if v, ok := ann[k]; ok {
			return k, v, true
		}
	}
	return key, "", false
}

// checkSpellings returns an error naming the first two spellings of one
// request (vipcast's and MetalLB's, requestAliases) that ask for different
// things: vipcast cannot tell which one is meant.
func checkSpellings(ann map[string]string) error {
	for _, key := range []string{AnnotationIPs, AnnotationPool, AnnotationSharingKey} {
		first, firstVal := "", ""
		for _, k := range append([]string{key}, requestAliases(key)...) {
			v, ok := ann[k]
			if !ok {
				continue
			}
			if first == "" {
				first, firstVal = k, v
				continue
			}
			if spelledAlike(key, firstVal, v) {
				continue
			}
			return invalid("annotations %s %q and %s %q ask for different things (MetalLB's spelling is an alias of vipcast's); keep one of them, or make them agree",
				first, firstVal, k, v)
		}
	}
	return nil
}

// spelledAlike reports whether two values of the request annotation key
// ask for the same: the same trimmed text, or for AnnotationIPs the same
// addresses in any order.
func spelledAlike(key, a, b string) bool {
	norm := func(v string) string {
		if key != AnnotationIPs {
			return strings.TrimSpace(v)
		}
		var ips []string
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			if ip, err := netip.ParseAddr(f); err == nil {
				f = ip.Unmap().String()
			}
			if f != "" {
				ips = append(ips, f)
			}
		}
		slices.Sort(ips)
		return strings.Join(ips, ",")
	}
	return norm(a) == norm(b)
}

// maxSharingKeyLen bounds the sharing key; it is compared, never parsed.
const maxSharingKeyLen = 253

// Owner returns the allocator owner key of a Service: "namespace/name".
func Owner(svc *v1.Service) string {
	return svc.Namespace + "/" + svc.Name
}

// RequestFor translates a Service into an allocation request. nsLabels are
// the labels of the Service's namespace (nil if unknown). Every error names
// the field at fault and how to fix it.
func RequestFor(svc *v1.Service, nsLabels map[string]string) (ipam.Request, error) {
	req := baseRequest(svc)
	req.NamespaceLabels = nsLabels
	if err := checkSpellings(svc.Annotations); err != nil {
		return req, err
	}

	if spelling, pool, ok := requestAnnotation(svc.Annotations, AnnotationPool); ok {
		pool = strings.TrimSpace(pool)
		if errs := validation.IsDNS1123Subdomain(pool); len(errs) > 0 {
			return req, invalid("annotation %s %q is not a valid IPPool name (%s); set it to the name of an existing IPPool or remove it",
				spelling, pool, strings.Join(errs, "; "))
		}
		req.Pool = pool
	}

	if spelling, _, ok := requestAnnotation(svc.Annotations, AnnotationSharingKey); ok && (req.SharingKey == "" || len(req.SharingKey) > maxSharingKeyLen) {
		return req, invalid("annotation %s must be a non-empty string of at most %d characters; set the same key on every Service that should share a VIP, or remove it",
			spelling, maxSharingKeyLen)
	}

	if err := checkCrossNamespace(svc); err != nil {
		return req, err
	}

	ips, err := requestedIPs(svc)
	if err != nil {
		return req, err
	}
	req.IPs = ips

	req.Families, req.RequireAllFamilies = families(svc)
	for _, ip := range ips {
		if !containsFamily(req.Families, familyOf(ip)) && len(svc.Spec.IPFamilies) > 0 {
			return req, invalid("requested VIP %s is %s but the Service's spec.ipFamilies is %v; request an address of the Service's family or change spec.ipFamilyPolicy/ipFamilies",
				ip, familyOf(ip), svc.Spec.IPFamilies)
		}
	}
	return req, nil
}

// baseRequest holds what every request of the Service carries, none of it
// validated: owner, labels, traffic policy, pod selector, ports (protocol
// defaulting to TCP as the API server does), the trimmed sharing key and
// whether it may be shared across namespaces.
func baseRequest(svc *v1.Service) ipam.Request {
	req := ipam.Request{
		Owner:               Owner(svc),
		Namespace:           svc.Namespace,
		ServiceLabels:       svc.Labels,
		LocalTrafficPolicy:  svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal,
		SharingKey:          strings.TrimSpace(sharingKey(svc.Annotations)),
		ShareWithNamespaces: shareNamespaces(svc.Annotations[AnnotationAllowSharedIPAcrossNamespaces]),
	}
	if len(svc.Spec.Selector) > 0 {
		req.PodSelector = labels.SelectorFromSet(svc.Spec.Selector).String()
	}
	for _, p := range svc.Spec.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = v1.ProtocolTCP
		}
		req.Ports = append(req.Ports, ipam.Port{Protocol: string(proto), Port: p.Port})
	}
	return req
}

// checkCrossNamespace validates the vipcast.io/allow-shared-ip-across-namespaces
// annotation: namespace names, or "false", and only next to a sharing key.
func checkCrossNamespace(svc *v1.Service) error {
	raw, ok := svc.Annotations[AnnotationAllowSharedIPAcrossNamespaces]
	if !ok {
		return nil
	}
	v := strings.TrimSpace(raw)
	if strings.EqualFold(v, "true") {
		return invalid("annotation %s is \"true\", which would let any namespace that knows the sharing key join; name the namespaces whose Services may share this Service's VIP instead, comma-separated (such as \"team-b,team-c\"), each of which must name %s in turn",
			AnnotationAllowSharedIPAcrossNamespaces, svc.Namespace)
	}
	names := shareNamespaces(raw)
	for _, ns := range names {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return invalid("annotation %s: %q is not a namespace name (%s); name the namespaces whose Services may share this Service's VIP, comma-separated, or \"false\"",
				AnnotationAllowSharedIPAcrossNamespaces, ns, strings.Join(errs, "; "))
		}
	}
	if len(names) > 0 && strings.TrimSpace(sharingKey(svc.Annotations)) == "" {
		return invalid("annotation %s names namespaces but the Service has no %s; set the same sharing key on every Service that should share a VIP, or remove %s",
			AnnotationAllowSharedIPAcrossNamespaces, AnnotationSharingKey, AnnotationAllowSharedIPAcrossNamespaces)
	}
	return nil
}

// sharingKey is the Service's sharing key in any spelling.
func sharingKey(ann map[string]string) string {
	_, v, _ := requestAnnotation(ann, AnnotationSharingKey)
	return v
}

// shareNamespaces returns the namespaces the annotation value raw names:
// comma-separated, trimmed, none for "false" or "true" (which
// checkCrossNamespace refuses).
func shareNamespaces(raw string) []string {
	v := strings.TrimSpace(raw)
	if strings.EqualFold(v, "false") || strings.EqualFold(v, "true") {
		return nil
	}
	var out []string
	for _, ns := range strings.Split(v, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			out = append(out, ns)
		}
	}
	return out
}

// requestedIPs merges the vipcast.io/ips annotation and the deprecated
// spec.loadBalancerIP; asking both for different addresses is an error.
func requestedIPs(svc *v1.Service) ([]netip.Addr, error) {
	var fromAnn []netip.Addr
	spelling, raw, ok := requestAnnotation(svc.Annotations, AnnotationIPs)
	if ok {
		seen := map[ipam.Family]netip.Addr{}
		for _, field := range strings.Split(raw, ",") {
			field = strings.TrimSpace(field)
			if field == "" {
				continue // "" or a trailing comma requests nothing
			}
			ip, err := netip.ParseAddr(field)
			if err != nil || ip.Zone() != "" {
				return nil, invalid("annotation %s: %q is not an IP address; write a comma-separated list with at most one IPv4 and one IPv6 address, e.g. \"192.0.2.10,2001:db8::10\"",
					spelling, field)
			}
			ip = ip.Unmap()
			if prev, dup := seen[familyOf(ip)]; dup {
				return nil, invalid("annotation %s asks for two %s addresses (%s and %s); a Service gets at most one VIP per family, keep one",
					spelling, familyOf(ip), prev, ip)
			}
			seen[familyOf(ip)] = ip
			fromAnn = append(fromAnn, ip)
		}
	}
	lbIP := strings.TrimSpace(svc.Spec.LoadBalancerIP)
	if lbIP == "" {
		return fromAnn, nil
	}
	ip, err := netip.ParseAddr(lbIP)
	if err != nil || ip.Zone() != "" {
		return nil, invalid("spec.loadBalancerIP %q is not an IP address; use annotation %s instead (spec.loadBalancerIP is deprecated)", lbIP, AnnotationIPs)
	}
	ip = ip.Unmap()
	if len(fromAnn) == 0 {
		return []netip.Addr{ip}, nil
	}
	for _, a := range fromAnn {
		if a == ip {
			return fromAnn, nil
		}
	}
	return nil, invalid("spec.loadBalancerIP %s and annotation %s %q disagree; remove spec.loadBalancerIP (deprecated) or make it one of the annotation's addresses",
		ip, AnnotationIPs, svc.Annotations[AnnotationIPs])
}

// families returns the address families a Service wants, in order, and
// whether all of them are required (RequireDualStack).
func families(svc *v1.Service) ([]ipam.Family, bool) {
	var fams []ipam.Family
	for _, f := range svc.Spec.IPFamilies {
		switch f {
		case v1.IPv4Protocol:
			fams = append(fams, ipam.IPv4)
		case v1.IPv6Protocol:
			fams = append(fams, ipam.IPv6)
		}
	}
	if len(fams) == 0 {
		fams = []ipam.Family{ipam.IPv4}
	}
	policy := v1.IPFamilyPolicySingleStack
	if svc.Spec.IPFamilyPolicy != nil {
		policy = *svc.Spec.IPFamilyPolicy
	}
	switch policy {
	case v1.IPFamilyPolicyRequireDualStack:
		return fams, true
	case v1.IPFamilyPolicyPreferDualStack:
		return fams, false
	default:
		return fams[:1], false
	}
}

func familyOf(ip netip.Addr) ipam.Family {
	if ip.Is4() {
		return ipam.IPv4
	}
	return ipam.IPv6
}

func containsFamily(fams []ipam.Family, f ipam.Family) bool {
	for _, x := range fams {
		if x == f {
			return true
		}
	}
	return false
}

func invalid(format string, args ...any) error {
	return &ipam.Error{Reason: ipam.ReasonInvalid, Msg: fmt.Sprintf(format, args...)}
}
