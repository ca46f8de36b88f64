package speaker

import (
	"net/netip"
	"slices"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// This file holds the reading of a Service and its EndpointSlices that both
// halves of a Service's decisions share: ServiceRoutes (what to announce)
// and ServiceDataplane (what to program).

// ServiceKey returns the key of a Service in a RouteTable: "namespace/name",
// the informer cache key and the CCM's allocator owner.
func ServiceKey(svc *v1.Service) string { return svc.Namespace + "/" + svc.Name }

// serviceVIPs returns the distinct IPs of status.loadBalancer.ingress, in
// order, unmapped.
func serviceVIPs(svc *v1.Service) []netip.Addr {
	var out []netip.Addr
	for _, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue
		}
		ip, err := netip.ParseAddr(ing.IP)
		if err != nil || ip.Zone() != "" {
			continue
		}
		ip = ip.Unmap()
		if !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	return out
}

// famSlot returns the family slot of ip: 0 for IPv4, 1 for IPv6.
func famSlot(ip netip.Addr) int {
	if ip.Is4() {
		return 0
	}
	return 1
}

// familyName returns "IPv4" or "IPv6" for messages.
func familyName(ip netip.Addr) string {
	if ip.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// ownSlice reports whether s is one of svc's EndpointSlices: same
// namespace, and the kubernetes.io/service-name label, when present, names
// svc.
func ownSlice(svc *v1.Service, s *discoveryv1.EndpointSlice) bool {
	if s == nil || s.Namespace != svc.Namespace {
		return false
	}
	name, ok := s.Labels[discoveryv1.LabelServiceName]
	return !ok || name == svc.Name
}

// sliceSlot returns the family slot of an IPv4 or IPv6 EndpointSlice; FQDN
// slices have none.
func sliceSlot(s *discoveryv1.EndpointSlice) (int, bool) {
	if s == nil {
		return 0, false
	}
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4:
		return 0, true
	case discoveryv1.AddressTypeIPv6:
		return 1, true
	}
	return 0, false
}

// onNode reports whether the endpoint runs on the node called nodeName.
func onNode(e *discoveryv1.Endpoint, nodeName string) bool {
	return e.NodeName != nil && *e.NodeName == nodeName
}
