package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Bounds of a SpeakerStatus's lists, so the object stays far below the
// API server's object size limit (1.5 MiB in etcd) however many Services
// the cluster has: the counts stay exact, the lists stop there.
const (
	// MaxSpeakerStatusAnnounced bounds status.announced (at most 44 bytes
	// a prefix).
	MaxSpeakerStatusAnnounced = 10000
	// MaxSpeakerStatusNotAnnouncedBytes bounds the Service names and
	// reasons listed in status.notAnnounced, in bytes.
	MaxSpeakerStatusNotAnnouncedBytes = 512 << 10
)

// SpeakerStatus is what vipcast-speaker on one node reports: its BGP
// sessions, the prefixes it announces, and why it announces no route for
// the others. The speaker writes it, named after its Node and owned by it
// (it goes with the Node); users read it.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=vipspeaker;vipspeakers,categories=vipcast
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Established",type=integer,JSONPath=".status.sessionsEstablished",description="BGP sessions Established"
// +kubebuilder:printcolumn:name="Sessions",type=integer,JSONPath=".status.sessionsConfigured",description="BGP sessions configured on this node"
// +kubebuilder:printcolumn:name="Announced",type=integer,JSONPath=".status.announcedCount",description="Prefixes this node announces"
// +kubebuilder:printcolumn:name="Not Announced",type=integer,JSONPath=".status.notAnnouncedCount",description="Services with a VIP this node announces no route for"
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
	// Sessions are this node's BGP sessions, by peer name.
	// +optional
	// +listType=atomic
	Sessions []SpeakerSession `json:"sessions,omitempty"`

	// AnnouncedCount counts the prefixes this node announces.
	// +optional
	AnnouncedCount int32 `json:"announcedCount"`
	// Announced are the prefixes this node announces, sorted; at most
	// MaxSpeakerStatusAnnounced.
	// +optional
	// +listType=atomic
	Announced []string `json:"announced,omitempty"`

	// NotAnnouncedCount counts the Services vipcast serves that have a VIP
	// this node announces no route for.
	// +optional
	NotAnnouncedCount int32 `json:"notAnnouncedCount"`
	// NotAnnounced groups those Services by why, in words (no ready
	// endpoint on this node, the pool's nodeSelector, the dataplane
	// refused it, ...), Services in key order up to
	// MaxSpeakerStatusNotAnnouncedBytes.
	// +optional
	// +listType=atomic
	NotAnnounced []NotAnnounced `json:"notAnnounced,omitempty"`

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

// NotAnnounced is the Services a node announces no route for, for one
// reason.
type NotAnnounced struct {
	// Reason says why, in words.
	Reason string `json:"reason"`
	// Services are the Services' namespace/name, sorted.
	// +listType=atomic
	Services []string `json:"services"`
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
