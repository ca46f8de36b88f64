package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults for BGPPeer fields, as applied by the API server and by the
// *OrDefault accessors.
const (
	// DefaultBGPPort is the TCP port of the peer when spec.port is unset.
	DefaultBGPPort int32 = 179
	// DefaultHoldTime is the BGP hold time when spec.holdTime is unset.
	DefaultHoldTime = 90 * time.Second
	// DefaultGracefulRestartTime is the restart time advertised when
	// graceful restart is enabled and restartTime is unset.
	DefaultGracefulRestartTime = 120 * time.Second
	// DefaultPasswordKey is the Secret key read when
	// passwordSecretRef.key is unset.
	DefaultPasswordKey = "password"
	// DefaultEBGPMultiHop is the TTL of eBGP packets when ebgpMultiHop is
	// unset: the peer must be directly connected.
	DefaultEBGPMultiHop int32 = 1
	// DefaultBFDInterval is bfd.minTx and bfd.minRx when unset, FRR's
	// default.
	DefaultBFDInterval = 300 * time.Millisecond
	// DefaultBFDMultiplier is bfd.multiplier when unset.
	DefaultBFDMultiplier int32 = 3
	// DefaultBFDMinimumTTL is bfd.minimumTTL when unset: multihop BFD
	// packets from a router one hop away (sent with TTL 255) and no
	// farther are accepted, FRR's default.
	DefaultBFDMinimumTTL int32 = 254
)

// BFDAuthenticationType is a BFD authentication type (RFC 5880 section
// 6.7).
//
// +kubebuilder:validation:Enum=KeyedSHA1;MeticulousKeyedSHA1
type BFDAuthenticationType string

// The BFD authentication types vipcast implements.
const (
	// BFDAuthKeyedSHA1 is Keyed SHA1 (RFC 5880 section 6.7.4).
	BFDAuthKeyedSHA1 BFDAuthenticationType = "KeyedSHA1"
	// BFDAuthMeticulousKeyedSHA1 is Meticulous Keyed SHA1: the sequence
	// number grows with every packet, so no packet can be replayed.
	BFDAuthMeticulousKeyedSHA1 BFDAuthenticationType = "MeticulousKeyedSHA1"
)

// AddressFamily is a BGP address family (AFI/SAFI) negotiated with a peer.
//
// +kubebuilder:validation:Enum=ipv4-unicast;ipv6-unicast
type AddressFamily string

const (
	// AddressFamilyIPv4Unicast carries IPv4 unicast routes (AFI 1, SAFI 1).
	AddressFamilyIPv4Unicast AddressFamily = "ipv4-unicast"
	// AddressFamilyIPv6Unicast carries IPv6 unicast routes (AFI 2, SAFI 1).
	AddressFamilyIPv6Unicast AddressFamily = "ipv6-unicast"
)

// BGPPeer is a BGP router that vipcast's speakers open a session with to
// announce the addresses of LoadBalancer Services.
//
// +genclient
// +genclient:nonNamespaced
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=vippeer;vippeers,categories=vipcast
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Peer Address",type=string,JSONPath=".spec.peerAddress",description="Address of the BGP router"
// +kubebuilder:printcolumn:name="Peer ASN",type=integer,JSONPath=".spec.peerASN",description="Autonomous system number of the BGP router"
// +kubebuilder:printcolumn:name="Local ASN",type=integer,JSONPath=".spec.localASN",description="Autonomous system number vipcast uses"
// +kubebuilder:printcolumn:name="Established",type=integer,JSONPath=".status.nodesEstablished",description="Ready nodes whose session with the router is Established (written by vipcast-ccm from the SpeakerStatuses)"
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=".status.nodes",description="Ready nodes with a session with the router configured"
// +kubebuilder:printcolumn:name="Port",type=integer,JSONPath=".spec.port",priority=1,description="TCP port of the BGP router"
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=".status.conditions[?(@.type==\"Ready\")].status",priority=1,description="Whether the configuration is usable (written by vipcast-ccm)"
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=".status.conditions[?(@.type==\"Ready\")].reason",priority=1,description="Why the peer is or is not ready"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=".metadata.creationTimestamp"
type BGPPeer struct {
	metav1.TypeMeta `json:",inline"`
	// Standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec describes the BGP router and the session to open with it.
	// +required
	Spec BGPPeerSpec `json:"spec"`

	// status is written by vipcast.
	// +optional
	Status BGPPeerStatus `json:"status,omitempty"`
}

// BGPPeerSpec is the desired state of a BGPPeer.
//
// +kubebuilder:validation:XValidation:rule="!has(self.sourceAddress) || !isIP(self.sourceAddress) || !isIP(self.peerAddress) || ip(self.sourceAddress).family() == ip(self.peerAddress).family()",fieldPath=".sourceAddress",message="sourceAddress must be in the same IP family as peerAddress (both IPv4 or both IPv6)"
// +kubebuilder:validation:XValidation:rule="!has(self.keepaliveTime) || !has(self.holdTime) || !(self.holdTime == '0' || (size(self.holdTime) > 0 && self.holdTime.matches('^([0-9]{1,5}h)?([0-9]{1,7}m)?([0-9]{1,9}s)?$'))) || !(self.keepaliveTime == '0' || (size(self.keepaliveTime) > 0 && self.keepaliveTime.matches('^([0-9]{1,5}h)?([0-9]{1,7}m)?([0-9]{1,9}s)?$'))) || duration(self.holdTime) == duration('0s') || duration(self.keepaliveTime) < duration(self.holdTime)",fieldPath=".keepaliveTime",message="keepaliveTime must be shorter than holdTime (holdTime defaults to 90s; a third of holdTime, e.g. 30s, is usual)"
// +kubebuilder:validation:XValidation:rule="!has(self.ebgpMultiHop) || self.peerASN != self.localASN",fieldPath=".ebgpMultiHop",message="ebgpMultiHop applies only to eBGP sessions (peerASN different from localASN); remove it for iBGP"
// +kubebuilder:validation:XValidation:rule="!has(self.bfd) || !has(self.ebgpMultiHop) || self.ebgpMultiHop <= 1 || (has(self.bfd.multihop) && self.bfd.multihop)",fieldPath=".bfd.multihop",message="bfd.multihop must be true when ebgpMultiHop is above 1: single-hop BFD (RFC 5881) uses TTL 255 and does not cross a router; set bfd.multihop: true, or remove bfd"
type BGPPeerSpec struct {
	// peerAddress is the IPv4 or IPv6 address of the BGP router, such as
	// 192.0.2.1 or 2001:db8::1, without prefix length, port or zone.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",messageExpression="'peerAddress \"' + self + '\" is not an IP address: use an IPv4 or IPv6 address such as 192.0.2.1 or 2001:db8::1, without prefix length, port or zone'",message="peerAddress must be an IPv4 or IPv6 address such as 192.0.2.1 or 2001:db8::1, without prefix length, port or zone"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || !ip(self).isUnspecified()",message="peerAddress must not be the unspecified address 0.0.0.0 or ::"
	PeerAddress string `json:"peerAddress"`

	// peerASN is the autonomous system number of the BGP router, from 1 to
	// 4294967294. When it equals localASN the session is iBGP, otherwise
	// eBGP.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967294
	// +kubebuilder:validation:Format=int64
	PeerASN uint32 `json:"peerASN"`

	// localASN is the autonomous system number vipcast announces itself
	// with, from 1 to 4294967294.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967294
	// +kubebuilder:validation:Format=int64
	LocalASN uint32 `json:"localASN"`

	// port is the TCP port the BGP router listens on, from 1 to 65535.
	// Defaults to 179.
	// +optional
	// +kubebuilder:default=179
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port *int32 `json:"port,omitempty"`

	// sourceAddress is the local IP address the session is opened from. It
	// must be in the same IP family as peerAddress and configured on every
	// selected node. When unset, the node's routing table picks it.
	// +optional
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",messageExpression="'sourceAddress \"' + self + '\" is not an IP address: use an IPv4 or IPv6 address such as 192.0.2.10, or omit the field'",message="sourceAddress must be an IPv4 or IPv6 address such as 192.0.2.10, or omitted"
	SourceAddress string `json:"sourceAddress,omitempty"`

	// holdTime is the BGP hold time proposed to the peer: the session is
	// dropped when nothing is heard from the peer for this long. It is
	// written as a duration in whole seconds such as 90s or 3m, and must be
	// between 3s and 65535s. A hold time of 0 (no keepalives, a session
	// that never times out) is refused: vipcast's BGP engine always
	// proposes a hold time, and a dead node must not keep its routes.
	// Defaults to 90s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:default="90s"
	// +kubebuilder:validation:XValidation:rule="self == '0' || (size(self) > 0 && self.matches('^([0-9]{1,5}h)?([0-9]{1,7}m)?([0-9]{1,9}s)?$'))",message="holdTime must be a duration in whole seconds, such as 90s, 1m30s or 0s"
	// +kubebuilder:validation:XValidation:rule="!(self == '0' || (size(self) > 0 && self.matches('^([0-9]{1,5}h)?([0-9]{1,7}m)?([0-9]{1,9}s)?$'))) || (duration(self) >= duration('3s') && duration(self) <= duration('65535s'))",message="holdTime must be between 3s and 65535s (0s, no keepalives, is not supported), such as 90s"
	HoldTime *metav1.Duration `json:"holdTime,omitempty"`

	// keepaliveTime is the interval between BGP keepalive messages, such as
	// 30s, between 1s and 65535s. It must be shorter than holdTime. When
	// unset it is a third of holdTime.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self == '0' || (size(self) > 0 && self.matches('^([0-9]{1,5}h)?([0-9]{1,7}m)?([0-9]{1,9}s)?$'))",message="keepaliveTime must be a duration in whole seconds, such as 30s or 1m"
	// +kubebuilder:validation:XValidation:rule="!(self == '0' || (size(self) > 0 && self.matches('^([0-9]{1,5}h)?([0-9]{1,7}m)?([0-9]{1,9}s)?$'))) || (duration(self) >= duration('1s') && duration(self) <= duration('65535s'))",message="keepaliveTime must be between 1s and 65535s"
	KeepaliveTime *metav1.Duration `json:"keepaliveTime,omitempty"`

	// ebgpMultiHop is the IP TTL of packets sent to an eBGP peer, from 1 to
	// 255. Set it above 1 when the peer is not directly connected. Only
	// valid for eBGP (peerASN different from localASN). Defaults to 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	EBGPMultiHop *int32 `json:"ebgpMultiHop,omitempty"`

	// passwordSecretRef names a Secret key holding the TCP MD5 password
	// (RFC 2385) of the session. When unset, no password is used.
	// +optional
	PasswordSecretRef *SecretKeyReference `json:"passwordSecretRef,omitempty"`

	// gracefulRestart configures BGP graceful restart (RFC 4724), which
	// lets the peer keep vipcast's routes while a speaker restarts. When
	// unset, graceful restart is disabled.
	// +optional
	GracefulRestart *GracefulRestart `json:"gracefulRestart,omitempty"`

	// nodeSelector selects, by Node labels, the nodes whose speakers peer
	// with this router. When unset, every node running the vipcast speaker
	// does.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// families are the address families negotiated with the peer:
	// ipv4-unicast and/or ipv6-unicast. When unset, both are negotiated.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	Families []AddressFamily `json:"families,omitempty"`

	// bfd runs Bidirectional Forwarding Detection (RFC 5880) beside the
	// BGP session, so that a dead node or path is detected in
	// multiplier x interval instead of the hold time. A BFD session that
	// goes from Up to Down resets the BGP session at once; the router must
	// run BFD for the session too (see docs/routers.md). Until the BFD session
	// has come Up, the BGP session does not wait for it. When unset, no
	// BFD.
	// +optional
	BFD *BFDConfig `json:"bfd,omitempty"`
}

// BFDConfig configures the BFD session of a BGPPeer.
//
// +kubebuilder:validation:XValidation:rule="!has(self.minimumTTL) || (has(self.multihop) && self.multihop)",fieldPath=".minimumTTL",message="bfd.minimumTTL applies to multihop BFD only: single-hop BFD (RFC 5881) accepts TTL 255 alone; set bfd.multihop: true, or remove bfd.minimumTTL"
type BFDConfig struct {
	// minTx is the desired minimum interval between the BFD packets a
	// node sends once the session is Up, between 10ms and 60s, such as
	// 300ms. The router may ask for a slower rate. Defaults to 300ms.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:default="300ms"
	// +kubebuilder:validation:XValidation:rule="size(self) > 0 && self.matches('^([0-9]{1,2}m)?([0-9]{1,5}([.][0-9]{1,9})?s)?([0-9]{1,5}ms)?$')",message="bfd.minTx must be a duration such as 300ms, 1s or 1s500ms"
	// +kubebuilder:validation:XValidation:rule="!(size(self) > 0 && self.matches('^([0-9]{1,2}m)?([0-9]{1,5}([.][0-9]{1,9})?s)?([0-9]{1,5}ms)?$')) || (duration(self) >= duration('10ms') && duration(self) <= duration('60s'))",message="bfd.minTx must be between 10ms and 60s, such as 300ms"
	MinTx *metav1.Duration `json:"minTx,omitempty"`

	// minRx is the required minimum interval between the BFD packets the
	// router sends: the fastest rate a node accepts, between 10ms and 60s,
	// such as 300ms. Defaults to 300ms.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:default="300ms"
	// +kubebuilder:validation:XValidation:rule="size(self) > 0 && self.matches('^([0-9]{1,2}m)?([0-9]{1,5}([.][0-9]{1,9})?s)?([0-9]{1,5}ms)?$')",message="bfd.minRx must be a duration such as 300ms, 1s or 1s500ms"
	// +kubebuilder:validation:XValidation:rule="!(size(self) > 0 && self.matches('^([0-9]{1,2}m)?([0-9]{1,5}([.][0-9]{1,9})?s)?([0-9]{1,5}ms)?$')) || (duration(self) >= duration('10ms') && duration(self) <= duration('60s'))",message="bfd.minRx must be between 10ms and 60s, such as 300ms"
	MinRx *metav1.Duration `json:"minRx,omitempty"`

	// multiplier is the detect multiplier, from 2 to 255: a side declares
	// the session Down when this many of the other's packets in a row do
	// not arrive. Defaults to 3.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=2
	// +kubebuilder:validation:Maximum=255
	Multiplier *int32 `json:"multiplier,omitempty"`

	// multihop selects multihop BFD (RFC 5883: UDP port 4784, packets with
	// a TTL of minimumTTL, 254 by default, or more accepted) for a router that is not directly
	// connected; required when ebgpMultiHop is above 1. Defaults to false:
	// single hop (RFC 5881: UDP port 3784, TTL 255 only).
	// +optional
	Multihop bool `json:"multihop,omitempty"`

	// minimumTTL is the least IP TTL (IPv6 hop limit) of the multihop BFD
	// packets a node accepts, from 1 to 255: 255 minus the number of
	// routers between the node and the peer, for a peer that sends with
	// TTL 255 (FRR). BIRD sends multihop BFD packets with TTL 64: set 64
	// for a directly connected BIRD peer, one less per router between. Packets with a lower TTL are dropped in
	// the kernel (they come from farther away, such as a forged packet)
	// and counted in vipcast_bfd_discarded_packets_total. Only with
	// multihop: true. Defaults to 254.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	MinimumTTL *int32 `json:"minimumTTL,omitempty"`

	// authentication authenticates the BFD packets with a key both sides
	// share (RFC 5880 section 6.7.4): packets without it, with another
	// key or with a sequence number out of order are discarded. The router
	// must be configured with the same type, key ID and key (BIRD supports
	// it; FRR's bfdd does not). When unset, packets are not authenticated.
	// +optional
	Authentication *BFDAuthentication `json:"authentication,omitempty"`
}

// BFDAuthentication configures the authentication of a BFD session.
type BFDAuthentication struct {
	// type is KeyedSHA1 or MeticulousKeyedSHA1 (the sequence number grows
	// with every packet, so that no packet can be replayed; BIRD calls it
	// "meticulous keyed sha1").
	// +required
	Type BFDAuthenticationType `json:"type"`

	// keyID is the key's ID, from 0 to 255, the same on both sides (BIRD's
	// password "id").
	// +required
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=255
	KeyID int32 `json:"keyID"`

	// secretRef names the Secret key holding the shared key, 1 to 20
	// bytes. The Secret must be one the speaker is told to read, as for
	// passwordSecretRef.
	// +required
	SecretRef SecretKeyReference `json:"secretRef"`
}

// MinimumTTLOrDefault returns minimumTTL, or DefaultBFDMinimumTTL when
// unset.
func (b *BFDConfig) MinimumTTLOrDefault() int32 {
	if b.MinimumTTL == nil {
		return DefaultBFDMinimumTTL
	}
	return *b.MinimumTTL
}

// MinTxOrDefault returns minTx, or DefaultBFDInterval when unset.
func (b *BFDConfig) MinTxOrDefault() time.Duration {
	if b.MinTx == nil {
		return DefaultBFDInterval
	}
	return b.MinTx.Duration
}

// MinRxOrDefault returns minRx, or DefaultBFDInterval when unset.
func (b *BFDConfig) MinRxOrDefault() time.Duration {
	if b.MinRx == nil {
		return DefaultBFDInterval
	}
	return b.MinRx.Duration
}

// MultiplierOrDefault returns multiplier, or DefaultBFDMultiplier when
// unset.
func (b *BFDConfig) MultiplierOrDefault() int32 {
	if b.Multiplier == nil {
		return DefaultBFDMultiplier
	}
	return *b.Multiplier
}

// SecretKeyReference points to one key of a Secret.
type SecretKeyReference struct {
	// name is the name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	Name string `json:"name"`

	// namespace is the namespace of the Secret. The Secret, namespace/name,
	// must be one the speaker is told to read (its --bgp-password-secrets;
	// with the Helm chart, speaker.bgpPasswordSecrets.secrets, such as
	// vipcast-bgp-passwords/tor-a-md5): the speaker reads those Secrets and
	// no other.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Namespace string `json:"namespace"`

	// key is the key within the Secret's data. Defaults to "password".
	// +optional
	// +kubebuilder:default=password
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	Key string `json:"key,omitempty"`
}

// GracefulRestart configures BGP graceful restart for a peer.
type GracefulRestart struct {
	// enabled turns graceful restart on.
	// +required
	Enabled bool `json:"enabled"`

	// restartTime is how long the peer should keep routes after the session
	// drops while the speaker restarts, in whole seconds from 1s to 4095s.
	// Defaults to 120s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:default="120s"
	// +kubebuilder:validation:XValidation:rule="self == '0' || (size(self) > 0 && self.matches('^([0-9]{1,5}h)?([0-9]{1,7}m)?([0-9]{1,9}s)?$'))",message="restartTime must be a duration in whole seconds, such as 120s or 2m"
	// +kubebuilder:validation:XValidation:rule="!(self == '0' || (size(self) > 0 && self.matches('^([0-9]{1,5}h)?([0-9]{1,7}m)?([0-9]{1,9}s)?$'))) || (duration(self) >= duration('1s') && duration(self) <= duration('4095s'))",message="restartTime must be between 1s and 4095s"
	RestartTime *metav1.Duration `json:"restartTime,omitempty"`
}

// BGPPeerStatus is the observed state of a BGPPeer, written by vipcast.
type BGPPeerStatus struct {
	// observedGeneration is the metadata.generation that this status
	// describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions describe the peer's state. The Ready condition, written
	// by vipcast-ccm, is True when the configuration is usable and False
	// with reason InvalidConfig or InvalidSelector when it is not, or with
	// reason AddressConflict when an older BGPPeer has the same peerAddress
	// and both select an existing node: a node opens one session per
	// address, the older peer's, and leaves this one out. Sessions
	// and password Secrets are per node: each speaker reports them in
	// Events on the BGPPeer (reason SecretNotFound, for example) and in
	// its vipcast_bgp_session_up metric.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`

	// nodes counts the Ready nodes whose speaker has a session with this
	// peer configured, as their SpeakerStatuses report; written by
	// vipcast-ccm.
	// +optional
	Nodes int32 `json:"nodes,omitempty"`
	// nodesEstablished counts those whose session is Established.
	// +optional
	NodesEstablished int32 `json:"nodesEstablished,omitempty"`
}

// BGPPeerList is a list of BGPPeers.
//
// +k8s:deepcopy-gen:interfaces=k8s.io/apimachinery/pkg/runtime.Object
// +kubebuilder:object:root=true
type BGPPeerList struct {
	metav1.TypeMeta `json:",inline"`
	// Standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`
	// items are the BGPPeers.
	Items []BGPPeer `json:"items"`
}

// PortOrDefault returns the peer's TCP port: port, or DefaultBGPPort (179)
// when it is unset.
func (s *BGPPeerSpec) PortOrDefault() int32 {
	if s.Port == nil {
		return DefaultBGPPort
	}
	return *s.Port
}

// HoldTimeOrDefault returns the BGP hold time: holdTime, or
// DefaultHoldTime (90s) when it is unset. Zero means keepalives are
// disabled and the session never times out.
func (s *BGPPeerSpec) HoldTimeOrDefault() time.Duration {
	if s.HoldTime == nil {
		return DefaultHoldTime
	}
	return s.HoldTime.Duration
}

// KeepaliveTimeOrDefault returns the BGP keepalive interval: keepaliveTime,
// or a third of HoldTimeOrDefault() when it is unset (zero when the hold
// time is zero).
func (s *BGPPeerSpec) KeepaliveTimeOrDefault() time.Duration {
	if s.KeepaliveTime != nil {
		return s.KeepaliveTime.Duration
	}
	return s.HoldTimeOrDefault() / 3
}

// EBGPMultiHopOrDefault returns the TTL for eBGP packets: ebgpMultiHop, or
// DefaultEBGPMultiHop (1) when it is unset.
func (s *BGPPeerSpec) EBGPMultiHopOrDefault() int32 {
	if s.EBGPMultiHop == nil {
		return DefaultEBGPMultiHop
	}
	return *s.EBGPMultiHop
}

// FamiliesOrDefault returns the address families to negotiate: families,
// or both ipv4-unicast and ipv6-unicast when it is empty. The returned
// slice is a copy.
func (s *BGPPeerSpec) FamiliesOrDefault() []AddressFamily {
	if len(s.Families) == 0 {
		return []AddressFamily{AddressFamilyIPv4Unicast, AddressFamilyIPv6Unicast}
	}
	return append([]AddressFamily(nil), s.Families...)
}

// IsIBGP reports whether the session is internal BGP (peerASN equals
// localASN).
func (s *BGPPeerSpec) IsIBGP() bool {
	return s.PeerASN == s.LocalASN
}

// KeyOrDefault returns the Secret key to read: key, or DefaultPasswordKey
// ("password") when it is empty.
func (r *SecretKeyReference) KeyOrDefault() string {
	if r.Key == "" {
		return DefaultPasswordKey
	}
	return r.Key
}

// RestartTimeOrDefault returns the graceful restart time: restartTime, or
// DefaultGracefulRestartTime (120s) when it is unset.
func (g *GracefulRestart) RestartTimeOrDefault() time.Duration {
	if g.RestartTime == nil {
		return DefaultGracefulRestartTime
	}
	return g.RestartTime.Duration
}
