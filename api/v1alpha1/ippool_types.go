package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Notes for maintainers on the CEL rules of IPPoolSpec.Addresses (this
// comment is not part of any field's documentation):
//
//   - The API server rejects a CRD whose rules' estimated worst-case cost,
//     times maxItems of the enclosing lists, exceeds 10M. The estimate grows
//     with maxLength (79 is the longest valid entry: two 39-character IPv6
//     addresses and a dash) and maxItems; TestCELCostHeadroom prints the
//     headroom (the range-order rule uses about 70%).
//   - CEL has no IP ordering. The range-order rule turns each end into a
//     comparable value: IPv4 as the integer a*2^24+b*2^16+c*2^8+d, IPv6 as 32
//     lower-case hex digits (each group zero-padded to 4 digits, "::" expanded
//     to the missing zero groups), compared as strings.
//   - Kubernetes CEL has no cel.bind, so values are bound with one-element
//     comprehensions: [expr].all(x, ...) or [expr].map(x, ...)[0]. Bind only
//     strings and ints: elements of a bound list lose their size bound and
//     make the cost estimate explode. string(ip(...)) has no size bound
//     either, so the rules never canonicalise through it.
//   - Each rule must be safe on any input: rules run independently, so every
//     rule re-checks the shape it relies on before calling ip() or cidr().
//   - TestRangeOrder checks the range-order rule against net/netip.

// Condition types and reasons reported in IPPool and BGPPeer status.
const (
	// ConditionReady is True when vipcast accepted the object's
	// configuration and uses it, and False (with one of the reasons below
	// and a human-readable message) when it cannot.
	ConditionReady = "Ready"

	// ConditionHeldOutsideSpec is True on an IPPool when Services hold
	// addresses the pool no longer offers (spec.addresses narrowed, or the
	// pool refused): they keep them, published and announced, until they
	// let them go; the message lists them.
	ConditionHeldOutsideSpec = "HeldOutsideSpec"

	// ReasonValid is the Ready=True reason: the configuration is in use.
	ReasonValid = "Valid"
	// ReasonTerminating is the Ready=False reason for an IPPool being
	// deleted: it hands out no new address, and its deletion waits until
	// no Service holds one of its addresses (the message lists them).
	ReasonTerminating = "Terminating"
	// ReasonHeldOutsideSpec is the HeldOutsideSpec=True reason.
	ReasonHeldOutsideSpec = "HeldOutsideSpec"
	// ReasonAllInSpec is the HeldOutsideSpec=False reason: every address
	// Services hold from the pool is in its spec.
	ReasonAllInSpec = "AllInSpec"
	// ReasonOverlap is the Ready=False reason for an IPPool whose addresses
	// overlap each other or another IPPool's addresses.
	ReasonOverlap = "Overlap"
	// ReasonInvalidAddresses is the Ready=False reason for an IPPool whose
	// addresses passed API validation but are still unusable, for example
	// a range whose start address is after its end address, or an
	// aggregation length that does not fit a range.
	ReasonInvalidAddresses = "InvalidAddresses"
	// ReasonInvalidSelector is the Ready=False reason for an object with a
	// label selector that cannot be parsed (for example a bad operator).
	ReasonInvalidSelector = "InvalidSelector"
	// ReasonInvalidConfig is the Ready=False reason for a BGPPeer whose
	// settings are inconsistent in a way the API server cannot detect.
	ReasonInvalidConfig = "InvalidConfig"
	// ReasonSecretNotFound is the Ready=False reason for a BGPPeer whose
	// password Secret or key does not exist.
	ReasonSecretNotFound = "SecretNotFound"
	// ReasonAddressConflict is the Ready=False reason for a BGPPeer whose
	// spec.peerAddress is also an older BGPPeer's on a node both select:
	// a node has one session per address, so the older peer's is opened
	// and the newer one is left out on those nodes.
	ReasonAddressConflict = "AddressConflict"
)

// Defaults for IPPool fields, as applied by the API server and by the
// *OrDefault accessors.
const (
	// DefaultAggregationLength is the prefix length used to announce IPv4
	// addresses when spec.bgp.aggregationLength is unset.
	DefaultAggregationLength int32 = 32
	// DefaultAggregationLengthV6 is the prefix length used to announce IPv6
	// addresses when spec.bgp.aggregationLengthV6 is unset.
	DefaultAggregationLengthV6 int32 = 128
)

// WellKnownCommunities maps the BGP community names accepted in
// spec.bgp.communities to their RFC 1997 / IANA values (high 16 bits are
// the ASN part, low 16 bits the value part).
var WellKnownCommunities = map[string]uint32{
	"graceful-shutdown":   0xFFFF0000, // 65535:0, RFC 8326
	"accept-own":          0xFFFF0001, // 65535:1, RFC 7611
	"llgr-stale":          0xFFFF0006, // 65535:6, RFC 9494
	"no-llgr":             0xFFFF0007, // 65535:7, RFC 9494
	"blackhole":           0xFFFF029A, // 65535:666, RFC 7999
	"no-export":           0xFFFFFF01, // 65535:65281, RFC 1997
	"no-advertise":        0xFFFFFF02, // 65535:65282, RFC 1997
	"no-export-subconfed": 0xFFFFFF03, // 65535:65283, RFC 1997
	"no-peer":             0xFFFFFF04, // 65535:65284, RFC 3765
}

// IPPool is a set of IPv4 and/or IPv6 addresses that vipcast assigns to
// Services of type LoadBalancer, together with how those addresses are
// announced over BGP.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=vippool;vippools,categories=vipcast
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Addresses",type=string,JSONPath=".spec.addresses",description="Address blocks of the pool"
// +kubebuilder:printcolumn:name="IPv4 Capacity",type=string,JSONPath=".status.ipv4.capacity",description="Number of assignable IPv4 addresses"
// +kubebuilder:printcolumn:name="IPv4 In Use",type=integer,JSONPath=".status.ipv4.inUse",description="Number of IPv4 addresses assigned to Services"
// +kubebuilder:printcolumn:name="IPv6 Capacity",type=string,JSONPath=".status.ipv6.capacity",description="Number of assignable IPv6 addresses"
// +kubebuilder:printcolumn:name="IPv6 In Use",type=integer,JSONPath=".status.ipv6.inUse",description="Number of IPv6 addresses assigned to Services"
// +kubebuilder:printcolumn:name="Auto Assign",type=boolean,JSONPath=".spec.autoAssign",priority=1,description="Whether Services get addresses from this pool without asking for it"
// +kubebuilder:printcolumn:name="Priority",type=integer,JSONPath=".spec.allocation.priority",priority=1,description="Lower values are tried first"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=".status.conditions[?(@.type==\"Ready\")].status",description="Whether the pool is valid and in use"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=".status.conditions[?(@.type==\"Ready\")].reason",priority=1,description="Why the pool is or is not ready"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type IPPool struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec lists the pool's addresses and how they are handed out and
	// announced.
	// +required
	Spec IPPoolSpec `json:"spec"`

	// status is written by vipcast: how many addresses the pool has, how
	// many are assigned, and whether the pool is usable.
	// +optional
	Status IPPoolStatus `json:"status,omitempty"`
}

// IPPoolSpec is the desired state of an IPPool.
//
// +kubebuilder:validation:XValidation:rule="!has(self.bgp) || !has(self.bgp.aggregationLength) || self.addresses.all(a, !isCIDR(a) || cidr(a).ip().family() != 4 || cidr(a).prefixLength() <= self.bgp.aggregationLength)",fieldPath=".bgp.aggregationLength",message="bgp.aggregationLength must be at least the prefix length of every IPv4 CIDR in addresses (a shorter prefix would announce addresses outside the pool); raise it or split the CIDR"
// +kubebuilder:validation:XValidation:rule="!has(self.bgp) || !has(self.bgp.aggregationLengthV6) || self.addresses.all(a, !isCIDR(a) || cidr(a).ip().family() != 6 || cidr(a).prefixLength() <= self.bgp.aggregationLengthV6)",fieldPath=".bgp.aggregationLengthV6",message="bgp.aggregationLengthV6 must be at least the prefix length of every IPv6 CIDR in addresses (a shorter prefix would announce addresses outside the pool); raise it or split the CIDR"
type IPPoolSpec struct {
	// addresses are the blocks of addresses in the pool. Each entry is
	// either a CIDR such as 192.0.2.0/24 or 2001:db8:1::/120 (use /32 or
	// /128 for a single address; host bits must be zero), or an inclusive
	// range first-last such as 192.0.2.10-192.0.2.20 or
	// 2001:db8::10-2001:db8::1f, with no spaces and both ends in the same
	// IP family. IPv6 addresses are written in hex (::102:304, not
	// ::1.2.3.4); quote entries ending in ":" in YAML. IPv4 and IPv6 entries
	// may be mixed in one pool. Entries must not overlap each other or
	// another pool; vipcast reports overlaps in the Ready condition.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=79
	// +kubebuilder:validation:items:XValidation:rule="self.contains('-') ? (size(self.split('-')) == 2 && isIP(self.split('-')[0]) && isIP(self.split('-')[1])) : isCIDR(self)",messageExpression="'addresses entry \"' + self + '\" is invalid: each entry must be a CIDR (10.0.0.0/24, 2001:db8::/64; /32 or /128 for one address) or a range first-last (10.0.0.1-10.0.0.9) with no spaces'",message="each entry must be a CIDR (10.0.0.0/24, 2001:db8::/64; /32 or /128 for one address) or a range first-last (10.0.0.1-10.0.0.9) with no spaces"
	// +kubebuilder:validation:items:XValidation:rule="[self.split('-')[0], self.split('-')[size(self.split('-')) - 1]].all(p, !(isIP(p) || isCIDR(p)) || !p.contains(':') || !p.contains('.'))",messageExpression="'addresses entry \"' + self + '\" writes an IPv6 address with an embedded IPv4 part: write it in hex instead (::102:304, not ::1.2.3.4)'",message="write IPv6 addresses in hex, without an embedded IPv4 part (::102:304, not ::1.2.3.4)"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",messageExpression="'addresses entry \"' + self + '\" has host bits set: use the network address of the block (e.g. 10.0.0.0/24, not 10.0.0.1/24), or /' + (cidr(self).ip().family() == 4 ? '32' : '128') + ' for a single address'",message="CIDR has host bits set: use the network address (10.0.0.0/24, not 10.0.0.1/24)"
	// +kubebuilder:validation:items:XValidation:rule="!(self.contains('-') && size(self.split('-')) == 2 && isIP(self.split('-')[0]) && isIP(self.split('-')[1])) || ip(self.split('-')[0]).family() == ip(self.split('-')[1]).family()",messageExpression="'addresses entry \"' + self + '\" mixes IP families: both ends of a range must be IPv4 or both IPv6'",message="both ends of a range must be IPv4 or both IPv6"
	// +kubebuilder:validation:items:XValidation:rule="!self.contains('-') || size(self.split('-')) != 2 || [self.split('-')[0]].all(s, [self.split('-')[1]].all(e, !isIP(s) || !isIP(e) || ip(s).family() != ip(e).family() || (ip(s).family() == 4 ? (int(s.split('.')[0]) * 16777216 + int(s.split('.')[1]) * 65536 + int(s.split('.')[2]) * 256 + int(s.split('.')[3]) * 1) <= (int(e.split('.')[0]) * 16777216 + int(e.split('.')[1]) * 65536 + int(e.split('.')[2]) * 256 + int(e.split('.')[3]) * 1) : (s.contains('.') || e.contains('.') || [s.lowerAscii()].map(x, [x.split('::')[0]].map(a, [(x + '::').split('::')[1]].map(b, [size(a) == 0 ? 0 : size(a.split(':'))].map(nl, [size(b) == 0 ? 0 : size(b.split(':'))].map(nr, (0 < nl ? [a.split(':')[0]].map(g, ('000' + g).substring(size(g) - 1))[0] : (0 >= 8 - nr ? [b.split(':')[0 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (1 < nl ? [a.split(':')[1]].map(g, ('000' + g).substring(size(g) - 1))[0] : (1 >= 8 - nr ? [b.split(':')[1 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (2 < nl ? [a.split(':')[2]].map(g, ('000' + g).substring(size(g) - 1))[0] : (2 >= 8 - nr ? [b.split(':')[2 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (3 < nl ? [a.split(':')[3]].map(g, ('000' + g).substring(size(g) - 1))[0] : (3 >= 8 - nr ? [b.split(':')[3 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (4 < nl ? [a.split(':')[4]].map(g, ('000' + g).substring(size(g) - 1))[0] : (4 >= 8 - nr ? [b.split(':')[4 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (5 < nl ? [a.split(':')[5]].map(g, ('000' + g).substring(size(g) - 1))[0] : (5 >= 8 - nr ? [b.split(':')[5 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (6 < nl ? [a.split(':')[6]].map(g, ('000' + g).substring(size(g) - 1))[0] : (6 >= 8 - nr ? [b.split(':')[6 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (7 < nl ? [a.split(':')[7]].map(g, ('000' + g).substring(size(g) - 1))[0] : (7 >= 8 - nr ? [b.split(':')[7 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')))[0])[0])[0])[0])[0] <= [e.lowerAscii()].map(x, [x.split('::')[0]].map(a, [(x + '::').split('::')[1]].map(b, [size(a) == 0 ? 0 : size(a.split(':'))].map(nl, [size(b) == 0 ? 0 : size(b.split(':'))].map(nr, (0 < nl ? [a.split(':')[0]].map(g, ('000' + g).substring(size(g) - 1))[0] : (0 >= 8 - nr ? [b.split(':')[0 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (1 < nl ? [a.split(':')[1]].map(g, ('000' + g).substring(size(g) - 1))[0] : (1 >= 8 - nr ? [b.split(':')[1 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (2 < nl ? [a.split(':')[2]].map(g, ('000' + g).substring(size(g) - 1))[0] : (2 >= 8 - nr ? [b.split(':')[2 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (3 < nl ? [a.split(':')[3]].map(g, ('000' + g).substring(size(g) - 1))[0] : (3 >= 8 - nr ? [b.split(':')[3 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (4 < nl ? [a.split(':')[4]].map(g, ('000' + g).substring(size(g) - 1))[0] : (4 >= 8 - nr ? [b.split(':')[4 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (5 < nl ? [a.split(':')[5]].map(g, ('000' + g).substring(size(g) - 1))[0] : (5 >= 8 - nr ? [b.split(':')[5 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (6 < nl ? [a.split(':')[6]].map(g, ('000' + g).substring(size(g) - 1))[0] : (6 >= 8 - nr ? [b.split(':')[6 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')) + (7 < nl ? [a.split(':')[7]].map(g, ('000' + g).substring(size(g) - 1))[0] : (7 >= 8 - nr ? [b.split(':')[7 - 8 + nr]].map(g, ('000' + g).substring(size(g) - 1))[0] : '0000')))[0])[0])[0])[0])[0]))))",messageExpression="'addresses entry \"' + self + '\" is backwards: the first address of a range must not be after the last (write first-last, e.g. 10.0.0.1-10.0.0.9)'",message="the first address of a range must not be after the last (write first-last, e.g. 10.0.0.1-10.0.0.9)"
	Addresses []string `json:"addresses"`

	// autoAssign lets vipcast give addresses from this pool to any
	// LoadBalancer Service that does not ask for a specific pool. Set it to
	// false to reserve the pool for Services that request it explicitly.
	// Defaults to true.
	// +optional
	// +kubebuilder:default=true
	AutoAssign *bool `json:"autoAssign,omitempty"`

	// avoidBuggyIPs, when true, never assigns IPv4 addresses ending in .0
	// or .255, which some old clients and middleboxes mishandle. It has no
	// effect on IPv6. Defaults to false.
	// +optional
	AvoidBuggyIPs bool `json:"avoidBuggyIPs,omitempty"`

	// allocation restricts which Services may get addresses from this pool
	// and in which order pools are tried. When omitted, any Service in any
	// namespace may use the pool.
	// +optional
	Allocation *IPPoolAllocation `json:"allocation,omitempty"`

	// bgp controls how addresses from this pool are announced to BGP peers.
	// When omitted, every assigned address is announced as a host route
	// (/32 or /128) to every BGPPeer, with no communities.
	// +optional
	BGP *IPPoolBGP `json:"bgp,omitempty"`
}

// IPPoolAllocation restricts which Services may get addresses from an
// IPPool. A Service may use the pool only if its namespace matches (listed
// in namespaces, or matching any of namespaceSelectors, when either is set)
// and the Service itself matches any of serviceSelectors (when set).
type IPPoolAllocation struct {
	// priority orders the pools a Service may use: pools with a lower value
	// are tried first, and pools without a priority are tried after all
	// pools that have one. Ties are broken by pool name.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Priority *int32 `json:"priority,omitempty"`

	// namespaces lists namespaces whose Services may use this pool.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespaces []string `json:"namespaces,omitempty"`

	// namespaceSelectors select, by namespace labels, namespaces whose
	// Services may use this pool. A namespace matching any selector
	// qualifies.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	NamespaceSelectors []metav1.LabelSelector `json:"namespaceSelectors,omitempty"`

	// serviceSelectors select, by Service labels, the Services that may use
	// this pool. A Service matching any selector qualifies.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	ServiceSelectors []metav1.LabelSelector `json:"serviceSelectors,omitempty"`
}

// IPPoolBGP controls how addresses of an IPPool are announced over BGP.
type IPPoolBGP struct {
	// communities are BGP standard communities attached to the announced
	// routes. Each entry is ASN:VALUE with both parts between 0 and 65535
	// (for example 64512:100), or one of the well-known names no-export,
	// no-advertise, no-export-subconfed, no-peer, blackhole,
	// graceful-shutdown, accept-own, llgr-stale or no-llgr.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=32
	// +kubebuilder:validation:items:XValidation:rule="self in ['no-export', 'no-advertise', 'no-export-subconfed', 'no-peer', 'blackhole', 'graceful-shutdown', 'accept-own', 'llgr-stale', 'no-llgr'] || (self.matches('^[0-9]{1,5}:[0-9]{1,5}$') && int(self.split(':')[0]) <= 65535 && int(self.split(':')[1]) <= 65535)",messageExpression="'community \"' + self + '\" is invalid: use ASN:VALUE with both parts 0-65535 (e.g. 64512:100) or a well-known name such as no-export'",message="a community must be ASN:VALUE with both parts 0-65535 (e.g. 64512:100) or a well-known name such as no-export"
	Communities []string `json:"communities,omitempty"`

	// largeCommunities are BGP large communities (RFC 8092) attached to the
	// announced routes. Each entry is GLOBAL:LOCAL1:LOCAL2 with every part
	// between 0 and 4294967295 (for example 4200000000:1:2).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=32
	// +kubebuilder:validation:items:XValidation:rule="self.matches('^[0-9]{1,10}:[0-9]{1,10}:[0-9]{1,10}$') && int(self.split(':')[0]) <= 4294967295 && int(self.split(':')[1]) <= 4294967295 && int(self.split(':')[2]) <= 4294967295",messageExpression="'large community \"' + self + '\" is invalid: use GLOBAL:LOCAL1:LOCAL2 with each part 0-4294967295 (e.g. 4200000000:1:2)'",message="a large community must be GLOBAL:LOCAL1:LOCAL2 with each part 0-4294967295 (e.g. 4200000000:1:2)"
	LargeCommunities []string `json:"largeCommunities,omitempty"`

	// localPref is the LOCAL_PREF attribute sent with the routes to iBGP
	// peers (peers whose ASN equals the local ASN). It is not sent to eBGP
	// peers. When unset, no LOCAL_PREF is set by vipcast.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	// +kubebuilder:validation:Format=int64
	LocalPref *uint32 `json:"localPref,omitempty"`

	// aggregationLength is the prefix length used to announce IPv4
	// addresses, from 0 to 32. The default 32 announces each assigned
	// address on its own; a shorter length such as 24 announces the
	// covering prefix instead. It must not be shorter than the prefix
	// length of any IPv4 CIDR in the pool.
	// +optional
	// +kubebuilder:default=32
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=32
	AggregationLength *int32 `json:"aggregationLength,omitempty"`

	// aggregationLengthV6 is the prefix length used to announce IPv6
	// addresses, from 0 to 128. The default 128 announces each assigned
	// address on its own. It must not be shorter than the prefix length of
	// any IPv6 CIDR in the pool.
	// +optional
	// +kubebuilder:default=128
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=128
	AggregationLengthV6 *int32 `json:"aggregationLengthV6,omitempty"`

	// peerSelector selects, by BGPPeer labels, the peers that receive the
	// announcements. When unset, all BGPPeers receive them.
	// +optional
	PeerSelector *metav1.LabelSelector `json:"peerSelector,omitempty"`

	// nodeSelector selects, by Node labels, the nodes that announce the
	// addresses. When unset, all nodes running the vipcast speaker may
	// announce them (subject to the Service's externalTrafficPolicy).
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
}

// IPPoolStatus is the observed state of an IPPool, written by vipcast.
type IPPoolStatus struct {
	// observedGeneration is the metadata.generation that this status
	// describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// ipv4 counts the pool's IPv4 addresses. It is absent when the pool has
	// no IPv4 addresses.
	// +optional
	IPv4 *IPPoolFamilyStatus `json:"ipv4,omitempty"`

	// ipv6 counts the pool's IPv6 addresses. It is absent when the pool has
	// no IPv6 addresses.
	// +optional
	IPv6 *IPPoolFamilyStatus `json:"ipv6,omitempty"`

	// heldOutsideSpec is the number of addresses Services hold from this
	// pool outside what it offers: addresses its spec.addresses no longer
	// contain, or every address held while the pool is refused. They stay
	// with their Services, published and announced, until released; the
	// HeldOutsideSpec condition lists them.
	// +optional
	// +kubebuilder:validation:Minimum=0
	HeldOutsideSpec int64 `json:"heldOutsideSpec,omitempty"`

	// conditions describe the pool's state. The Ready condition is True
	// when vipcast assigns addresses from the pool, and False with reason
	// Overlap, InvalidAddresses, InvalidSelector or InvalidConfig when it
	// cannot, or Terminating while its deletion waits for the Services
	// that hold its addresses. HeldOutsideSpec is True while Services hold
	// addresses outside the pool's spec.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// IPPoolFamilyStatus counts the addresses of one IP family in an IPPool.
type IPPoolFamilyStatus struct {
	// capacity is the number of assignable addresses, as a decimal string
	// because IPv6 pools can exceed a 64-bit integer. Addresses skipped by
	// avoidBuggyIPs are not counted.
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:Pattern=`^[0-9]+$`
	Capacity string `json:"capacity"`

	// inUse is the number of addresses currently assigned to Services.
	// +kubebuilder:validation:Minimum=0
	InUse int64 `json:"inUse"`
}

// IPPoolList is a list of IPPools.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type IPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the IPPools.
	Items []IPPool `json:"items"`
}

// AutoAssignOrDefault reports whether Services that do not ask for a
// specific pool may get addresses from this pool: the value of autoAssign,
// or true when it is unset.
func (s *IPPoolSpec) AutoAssignOrDefault() bool {
	if s == nil || s.AutoAssign == nil {
		return true
	}
	return *s.AutoAssign
}

// AggregationLengthOrDefault returns the IPv4 announcement prefix length:
// aggregationLength, or DefaultAggregationLength (32) when it is unset. It
// is safe to call on a nil receiver.
func (b *IPPoolBGP) AggregationLengthOrDefault() int32 {
	if b == nil || b.AggregationLength == nil {
		return DefaultAggregationLength
	}
	return *b.AggregationLength
}

// AggregationLengthV6OrDefault returns the IPv6 announcement prefix length:
// aggregationLengthV6, or DefaultAggregationLengthV6 (128) when it is
// unset. It is safe to call on a nil receiver.
func (b *IPPoolBGP) AggregationLengthV6OrDefault() int32 {
	if b == nil || b.AggregationLengthV6 == nil {
		return DefaultAggregationLengthV6
	}
	return *b.AggregationLengthV6
}
