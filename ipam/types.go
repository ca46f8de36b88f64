package ipam

import (
	"fmt"
	"net/netip"

	"k8s.io/apimachinery/pkg/labels"
)

// Family is an IP address family.
type Family int

// The address families, numbered after the IP version.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// String returns "IPv4" or "IPv6".
func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return fmt.Sprintf("Family(%d)", int(f))
}

// valid reports whether f is IPv4 or IPv6.
func (f Family) valid() bool { return f == IPv4 || f == IPv6 }

// slot maps a family to 0 (IPv4) or 1 (IPv6) for per-family arrays.
func (f Family) slot() int {
	if f == IPv6 {
		return 1
	}
	return 0
}

// FamilyOf returns the family of ip (IPv4-mapped IPv6 addresses count as
// IPv6; the allocator unmaps requested addresses before using them).
func FamilyOf(ip netip.Addr) Family {
	if ip.Is4() {
		return IPv4
	}
	return IPv6
}

// Pool is one IP pool's configuration as the allocator needs it.
type Pool struct {
	// Name identifies the pool; it is what Request.Pool refers to.
	Name string
	// Addresses lists CIDRs ("192.168.10.0/24") and inclusive ranges
	// ("10.0.0.5-10.0.0.20"), IPv4 or IPv6. See ParseAddresses.
	Addresses []string
	// AutoAssign lets the pool be chosen automatically. When false the pool
	// is only used by an explicit Request.Pool or a requested IP inside it.
	AutoAssign bool
	// AvoidBuggyIPs skips IPv4 addresses ending in .0 and .255: they are
	// never handed out and not counted in the capacity.
	AvoidBuggyIPs bool
	// Terminating closes the pool to new allocations (its IPPool is being
	// deleted): what its owners hold stays theirs and is still accounted
	// here, but no request is served from it.
	Terminating bool
	// Priority orders automatic selection: lower values are tried first;
	// ties are broken by Name.
	Priority int
	// Namespaces lists namespaces whose Services may use the pool.
	//
	// The namespace constraints are Namespaces and NamespaceSelectors: when
	// neither is set any namespace qualifies, otherwise a namespace
	// qualifies if it is listed in Namespaces or its labels match any of
	// NamespaceSelectors.
	Namespaces []string
	// NamespaceSelectors select namespaces by label; a namespace matching
	// any of them qualifies (nil entries are ignored).
	NamespaceSelectors []labels.Selector
	// ServiceSelectors select the Services that may use the pool by label:
	// when empty any Service qualifies, otherwise one matching any of them.
	// Both the namespace and the Service constraints must be met.
	ServiceSelectors []labels.Selector
}

// Port is a Service port as far as address sharing is concerned.
type Port struct {
	// Protocol is "TCP", "UDP" or "SCTP".
	Protocol string
	// Port is the port number.
	Port int32
}

// String returns "TCP/80".
func (p Port) String() string { return fmt.Sprintf("%s/%d", p.Protocol, p.Port) }

// Request describes what one owner (a Service) needs.
type Request struct {
	// Owner is the unique key of the requester, "namespace/name".
	Owner string
	// Namespace is the owner's namespace.
	Namespace string
	// NamespaceLabels are the labels of the owner's namespace.
	NamespaceLabels map[string]string
	// ServiceLabels are the owner's own labels.
	ServiceLabels map[string]string
	// Pool names the pool to allocate from; "" chooses automatically.
	Pool string
	// IPs are requested addresses, at most one per family. When set the
	// owner gets exactly these.
	IPs []netip.Addr
	// Families are the wanted families in order (e.g. [IPv4] or
	// [IPv6, IPv4]), used when IPs is empty. Empty means [IPv4].
	Families []Family
	// RequireAllFamilies (RequireDualStack) fails unless every family in
	// Families is served; otherwise (PreferDualStack) the request gets what
	// one pool offers, at least the first family.
	RequireAllFamilies bool
	// SharingKey lets owners of the same namespace with the same key share
	// an address when their ports do not clash and their traffic policies
	// agree (see ShareWithNamespaces for other namespaces).
	SharingKey string
	// ShareWithNamespaces are the other namespaces whose owners this owner
	// agrees to share an address with: owners of two namespaces share only
	// when each names the other's namespace, and never with
	// LocalTrafficPolicy (a pod selector selects pods of its own namespace
	// only). Sharing keys are per namespace (Namespace): without it, owners
	// of different namespaces never share.
	ShareWithNamespaces []string
	// Ports are the owner's ports, checked for clashes between sharers.
	Ports []Port
	// LocalTrafficPolicy is true for externalTrafficPolicy: Local.
	LocalTrafficPolicy bool
	// PodSelector is the canonical pod selector string; sharers must agree
	// on it when any of them uses the Local traffic policy.
	PodSelector string
}

// Assignment is what an owner holds.
type Assignment struct {
	// Pool is the pool the addresses belong to; "" if no installed pool
	// contains them any more. If the addresses lie in different pools (only
	// possible with requested or restored addresses) it is the pool of the
	// first one that is in a pool.
	Pool string
	// IPs are the addresses, in the order of the request's families.
	IPs []netip.Addr
}
