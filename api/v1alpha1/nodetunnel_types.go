package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeTunnel is one node's place in the two-tier dataplane, published by
// that node's vipcast-speaker and read by every other: the node addresses
// the others route its tunnel addresses through and accept tunnelled
// packets from, and whether it announces VIPs (the connection-sync
// relay's peers). Its tunnel addresses are derived from these addresses
// and --tunnel-prefix, the same on every node.
//
// The speaker writes it, named after its Node and owned by it (it goes
// with the Node), only when what it says changes — its first start, a new
// node address, the node starting or stopping to announce — so a
// cluster's NodeTunnels cost nothing at rest, where every speaker
// watching every Node would receive each node's status heartbeat.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=viptunnel;viptunnels,categories=vipcast
// +kubebuilder:printcolumn:name="IPv4",type=string,JSONPath=".spec.ipv4",description="The node's IPv4 address"
// +kubebuilder:printcolumn:name="IPv6",type=string,JSONPath=".spec.ipv6",description="The node's IPv6 address"
// +kubebuilder:printcolumn:name="Announces",type=boolean,JSONPath=".spec.announces",description="Whether the node announces VIPs (a usable BGPPeer selects it and it is not excluded)"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type NodeTunnel struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata. The name is the Node's.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is written by the node's vipcast-speaker.
	// +optional
	Spec NodeTunnelSpec `json:"spec,omitempty"`
}

// NodeTunnelSpec is what one node's speaker publishes for the others.
type NodeTunnelSpec struct {
	// IPv4 is the node's IPv4 address (its first InternalIP of the
	// family, else its first ExternalIP): the other nodes route its IPv4
	// tunnel address through it and accept tunnelled packets from it.
	// Empty when the node has none.
	// +optional
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="isIP(self) && ip(self).family() == 4 && ip.isCanonical(self)",messageExpression="'ipv4 \"' + self + '\" is not an IPv4 address: the speaker of the node writes its IPv4 address here, such as 10.0.0.11'",message="ipv4 must be an IPv4 address such as 10.0.0.11"
	IPv4 string `json:"ipv4,omitempty"`
	// IPv6 is the node's IPv6 address, chosen the same way.
	// +optional
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self) && ip(self).family() == 6 && ip.isCanonical(self)",messageExpression="'ipv6 \"' + self + '\" is not an IPv6 address in canonical form: the speaker of the node writes its IPv6 address here, such as fd00:10::11'",message="ipv6 must be an IPv6 address in canonical form such as fd00:10::11"
	IPv6 string `json:"ipv6,omitempty"`
	// Announces is true when the node announces VIPs: a usable BGPPeer
	// selects it and it is not excluded from external load balancers.
	// Only announcing nodes exchange connections over the relay.
	// +optional
	Announces bool `json:"announces,omitempty"`
}

// NodeTunnelList is a list of NodeTunnel.
//
// +kubebuilder:object:root=true
type NodeTunnelList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the NodeTunnels.
	Items []NodeTunnel `json:"items"`
}
