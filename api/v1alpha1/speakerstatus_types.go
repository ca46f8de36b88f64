package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Bounds of a SpeakerStatus's lists. The object holds what only the node
// knows — its sessions, the kernel's refusals, how much it announces — and
// never a list that grows with the Services: its size, and what writing it
// costs etcd, does not depend on how many Services the cluster has. What
// a node announces for a given Service and why not is computed from the
// API objects with the speaker's own rules (`kubectl vipcast why`).
const (
	// MaxSpeakerStatusSessions bounds status.sessions (a node peers with
	// a few routers; the count stays exact).
	MaxSpeakerStatusSessions = 32
	// MaxSpeakerStatusAnnounced bounds status.announced, a sample of the
	// announced prefixes (the count stays exact).
	MaxSpeakerStatusAnnounced = 8
	// MaxSpeakerStatusRefused bounds status.refused (the count stays
	// exact).
	MaxSpeakerStatusRefused = 8
	// MaxSpeakerStatusMessage bounds each message in the status, in
	// bytes.
	MaxSpeakerStatusMessage = 256
)

// SpeakerStatus is what vipcast-speaker on one node reports: its BGP
// sessions, how many prefixes it announces and how many Services it
// announces no route for, and the Services its kernel refused. The
// speaker writes it, named after its Node and owned by it (it goes with
// the Node), when a session changes and otherwise at most every
// --status-interval; users and `kubectl vipcast` read it.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=vipspeaker;vipspeakers,categories=vipcast
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Established",type=integer,JSONPath=".status.sessionsEstablished",description="BGP sessions Established"
// +kubebuilder:printcolumn:name="Sessions",type=integer,JSONPath=".status.sessionsConfigured",description="BGP sessions configured on this node"
// +kubebuilder:printcolumn:name="Announced",type=integer,JSONPath=".status.announcedCount",description="Prefixes this node announces"
// +kubebuilder:printcolumn:name="Not Announced",type=integer,JSONPath=".status.notAnnouncedCount",description="Services with a VIP this node announces no route for"
// +kubebuilder:printcolumn:name="Refused",type=integer,JSONPath=".status.refusedCount",description="Services whose virtual servers this node's kernel refused"
// +kubebuilder:printcolumn:name="Updated",type=date,JSONPath=".status.lastUpdateTime",description="When the speaker last changed this status"
type SpeakerStatus struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata. The name is the Node's.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Status is written by the node's vipcast-speaker.
	// +optional
	Status SpeakerStatusStatus `json:"status,omitempty"`
}

// SpeakerStatusStatus is one node's speaker state.
type SpeakerStatusStatus struct {
	// SessionsConfigured counts the BGP sessions this node opens.
	// +optional
	SessionsConfigured int32 `json:"sessionsConfigured"`
	// SessionsEstablished counts those that are Established.
	// +optional
	SessionsEstablished int32 `json:"sessionsEstablished"`
	// Sessions are this node's BGP sessions, by peer name; at most
	// MaxSpeakerStatusSessions.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Sessions []SpeakerSession `json:"sessions,omitempty"`

	// AnnouncedCount counts the prefixes this node announces.
	// +optional
	AnnouncedCount int32 `json:"announcedCount"`
	// Announced is a sample of those prefixes: the first
	// MaxSpeakerStatusAnnounced, sorted.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Announced []string `json:"announced,omitempty"`

	// NotAnnouncedCount counts the Services vipcast serves that have a VIP
	// this node announces no route for (`kubectl vipcast why SERVICE`
	// says why, node by node).
	// +optional
	NotAnnouncedCount int32 `json:"notAnnouncedCount"`

	// RefusedCount counts the Services whose virtual servers this node's
	// kernel refused, so that it announces no route for them.
	// +optional
	RefusedCount int32 `json:"refusedCount"`
	// Refused are the first MaxSpeakerStatusRefused of those Services, in
	// key order, with the kernel's reason.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Refused []RefusedService `json:"refused,omitempty"`

	// LoadBalancerClass is the speaker's --load-balancer-class: with
	// ServesClassless, which Services it serves.
	// +optional
	LoadBalancerClass string `json:"loadBalancerClass,omitempty"`
	// ServesClassless is true when the speaker serves Services without a
	// spec.loadBalancerClass.
	// +optional
	ServesClassless bool `json:"servesClassless,omitempty"`

	// LastUpdateTime is when the speaker last changed this status.
	// +optional
	LastUpdateTime *metav1.Time `json:"lastUpdateTime,omitempty"`
}

// SpeakerSession is one BGP session of a node.
type SpeakerSession struct {
	// Peer is the BGPPeer's name.
	Peer string `json:"peer"`
	// Address is the router's address.
	Address string `json:"address"`
	// State is the BGP state: Idle, Connect, Active, OpenSent, OpenConfirm
	// or Established.
	State string `json:"state"`
	// Since is when the session entered State, when known.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
	// LastError says why the session last left Established or failed to
	// reach it, when known.
	// +optional
	LastError string `json:"lastError,omitempty"`
	// PrefixesSent counts the prefixes sent to the router.
	// +optional
	PrefixesSent int32 `json:"prefixesSent"`
	// BFD is the state of the session's BFD session: Up, Init, Down or
	// AdminDown; empty when the BGPPeer has no bfd.
	// +optional
	BFD string `json:"bfd,omitempty"`
	// BFDDiagnostic says why the BFD session last went Down (RFC 5880's
	// diagnostic, in words), or why it could not start.
	// +optional
	BFDDiagnostic string `json:"bfdDiagnostic,omitempty"`
}

// RefusedService is a Service whose virtual servers a node's kernel
// refused.
type RefusedService struct {
	// Service is the Service's namespace/name.
	Service string `json:"service"`
	// Message is the kernel's reason, at most MaxSpeakerStatusMessage
	// bytes.
	Message string `json:"message"`
}

// SpeakerStatusList is a list of SpeakerStatus.
//
// +kubebuilder:object:root=true
type SpeakerStatusList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the SpeakerStatuses.
	Items []SpeakerStatus `json:"items"`
}
