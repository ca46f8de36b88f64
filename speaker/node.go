package speaker

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/vipcast/vipcast/api/v1alpha1"
)

const (
	// AnnotationLocalASN is the Node annotation that overrides the spec.localASN of every
	// BGPPeer that node's speaker peers with: a decimal ASN from 1 to
	// 4294967294. Typical use: one private ASN per rack or per node in an
	// eBGP fabric.
	AnnotationLocalASN = "vipcast.io/local-asn"

	// LabelExcludeFromExternalLB is the Node label that, with any value, keeps
	// that node's speaker from announcing any VIP (the well-known label
	// the service controller also honours).
	LabelExcludeFromExternalLB = v1.LabelNodeExcludeBalancers
)

// maxASN is the largest usable 4-byte ASN (4294967295 is reserved, RFC 7300).
const maxASN = v1alpha1.MaxASN

// Node is the routing decisions' view of the node the speaker runs on.
type Node struct {
	// Name is the Node's name, matched against EndpointSlice nodeName.
	Name string
	// Labels are the Node's labels, matched by IPPool and BGPPeer
	// nodeSelectors. Treat as read-only.
	Labels labels.Set
	// Excluded is true when the node carries LabelExcludeFromExternalLB.
	Excluded bool
	// Cordoned is true when spec.unschedulable is set.
	Cordoned bool
	// IPv4 and IPv6 are the next hops announced for VIPs of each family:
	// the first InternalIP of the family in status.addresses, or the first
	// ExternalIP of the family when there is no InternalIP. The zero Addr
	// means the node has no address of that family.
	IPv4, IPv6 netip.Addr
	// LocalASN is the AnnotationLocalASN override; 0 when unset (or
	// malformed).
	LocalASN uint32
}

// NextHop returns the node's address of ip's family, if it has one.
func (n *Node) NextHop(ip netip.Addr) (netip.Addr, bool) {
	if ip.Is4() {
		return n.IPv4, n.IPv4.IsValid()
	}
	return n.IPv6, n.IPv6.IsValid()
}

// NodeFrom builds the Node view of node. The errors describe problems the
// caller should report (an Event on the Node): a malformed
// AnnotationLocalASN, which is then ignored. Unparsable entries of
// status.addresses are skipped silently (the kubelet and the CCM write
// them).
func NodeFrom(node *v1.Node) (Node, []error) {
	n := Node{
		Name:     node.Name,
		Labels:   labels.Set(node.Labels),
		Cordoned: node.Spec.Unschedulable,
	}
	_, n.Excluded = node.Labels[LabelExcludeFromExternalLB]

	var ext4, ext6 netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != v1.NodeInternalIP && a.Type != v1.NodeExternalIP {
			continue
		}
		ip, err := netip.ParseAddr(strings.TrimSpace(a.Address))
		if err != nil || ip.Zone() != "" {
			continue
		}
		// Unmap first: ::ffff:0.0.0.0 is the unspecified IPv4 address too.
		if ip = ip.Unmap(); ip.IsUnspecified() {
			continue
		}
		internal := a.Type == v1.NodeInternalIP
		switch {
		case ip.Is4() && internal && !n.IPv4.IsValid():
			n.IPv4 = ip
		case ip.Is4() && !internal && !ext4.IsValid():
			ext4 = ip
		case ip.Is6() && internal && !n.IPv6.IsValid():
			n.IPv6 = ip
		case ip.Is6() && !internal && !ext6.IsValid():
			ext6 = ip
		}
	}
	if !n.IPv4.IsValid() {
		n.IPv4 = ext4
	}
	if !n.IPv6.IsValid() {
		n.IPv6 = ext6
	}

	var errs []error
	if raw, ok := node.Annotations[AnnotationLocalASN]; ok {
		asn, err := strconv.ParseUint(strings.TrimSpace(raw), 10, 32)
		if err != nil || asn < 1 || asn > maxASN {
			errs = append(errs, fmt.Errorf("node %s: annotation %s %q is not an ASN; write a decimal number from 1 to %d (e.g. 64512) or remove the annotation to use each BGPPeer's spec.localASN; the override is ignored until fixed",
				node.Name, AnnotationLocalASN, raw, uint64(maxASN)))
		} else {
			n.LocalASN = uint32(asn)
		}
	}
	return n, errs
}
