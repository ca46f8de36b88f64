// Package bgp announces vipcast's VIPs to BGP routers. It is the only
// package that imports GoBGP: the speaker talks to it through the Speaker
// interface and the plain types below, so another engine could implement
// the same surface.
package bgp

import (
	"context"
	"net/netip"
	"time"

	"github.com/vipcast/vipcast/bfd"
)

// Family is a BGP address family vipcast negotiates: IPv4 or IPv6 unicast.
type Family int

const (
	// IPv4Unicast is AFI 1 / SAFI 1.
	IPv4Unicast Family = iota + 1
	// IPv6Unicast is AFI 2 / SAFI 1 (carried with MP-BGP, also over an IPv4
	// session).
	IPv6Unicast
)

// String returns the family as written in BGPPeer.spec.families.
func (f Family) String() string {
	switch f {
	case IPv4Unicast:
		return "ipv4-unicast"
	case IPv6Unicast:
		return "ipv6-unicast"
	}
	return "unknown"
}

// Peer is the configuration of one BGP session. Name identifies the session
// (the BGPPeer object's name); two Peers with the same Name are the same
// session, and a change of any other field resets only that session.
type Peer struct {
	// Name is the BGPPeer's name; it labels metrics, events and logs.
	Name string
	// Address is the router's address.
	Address netip.Addr
	// Port is the router's TCP port (179 when 0).
	Port uint16
	// ASN is the router's autonomous system number.
	ASN uint32
	// LocalASN is the ASN this node announces itself with. The session is
	// iBGP when it equals ASN.
	LocalASN uint32
	// SourceAddress is the local address the session is opened from; the
	// zero value lets the kernel choose.
	SourceAddress netip.Addr
	// HoldTime is the proposed hold time, at least 3 s; 0 means the
	// engine's default (90 s with gobgp, which cannot propose 0).
	HoldTime time.Duration
	// KeepaliveTime is the keepalive interval (0: a third of HoldTime).
	KeepaliveTime time.Duration
	// EBGPMultiHop is the TTL of packets to an eBGP peer; 0 or 1 means the
	// peer is directly connected.
	EBGPMultiHop uint8
	// Password is the TCP MD5 (RFC 2385) password; empty for none.
	Password string
	// GracefulRestart enables RFC 4724 graceful restart with RestartTime.
	GracefulRestart bool
	// RestartTime is the restart time advertised with graceful restart.
	RestartTime time.Duration
	// Families are the address families negotiated; empty means both.
	Families []Family
	// MaxPrefixes is the most prefixes the router may send in one address
	// family (counted before the import policy rejects them); one more
	// shuts the session down with a Cease, "Maximum Number of Prefixes
	// Reached", until GoBGP reopens it (see Config.PrefixLimitRestart).
	// 0 means DefaultMaxPrefixes.
	MaxPrefixes uint32
	// BFD, when set, runs a BFD session (RFC 5880) with the router beside
	// the BGP session: BFD going from Up to Down resets the BGP session at
	// once. A change of BFD alone renegotiates the BFD timers (a Poll
	// sequence) and does not reset the BGP session.
	BFD *BFD
}

// BFD configures the Bidirectional Forwarding Detection session of a peer.
type BFD struct {
	// MinTx is the desired minimum interval between the packets this node
	// sends (bfd.DesiredMinTxInterval) while the session is Up.
	MinTx time.Duration
	// MinRx is the required minimum interval between the packets the
	// router sends (bfd.RequiredMinRxInterval).
	MinRx time.Duration
	// Multiplier is the detect multiplier: the session goes Down when the
	// router's packets stop for this many of its intervals.
	Multiplier uint8
	// Multihop selects RFC 5883 multihop BFD (UDP port 4784, a TTL of at
	// least MinTTL accepted) instead of RFC 5881 single hop (UDP port 3784,
	// TTL 255 only).
	Multihop bool
	// MinTTL is the least TTL (IPv6 hop limit) of the multihop packets
	// accepted, 1 to 255; 0 means bfd.DefaultMultihopMinTTL (254). BIRD
	// sends multihop BFD with TTL 64. Only with Multihop.
	MinTTL uint8
	// Auth, when set, authenticates the BFD packets (Keyed SHA1, RFC 5880
	// section 6.7.4); its key prints as "(redacted)". A change of it
	// restarts the BFD session.
	Auth *bfd.Auth
}

// DefaultMaxPrefixes is Peer.MaxPrefixes when unset. vipcast accepts no
// route, but a router may send some: a default route, and the VIPs of the
// other nodes that the fabric reflects back (one prefix per VIP). 10,000
// leaves room for that and keeps what a leaking router makes the speaker
// hold a hundred times below a full Internet table.
const DefaultMaxPrefixes = 10000

// IBGP reports whether the session is internal (same ASN on both sides).
func (p *Peer) IBGP() bool { return p.ASN == p.LocalASN }

// LargeCommunity is an RFC 8092 large community GLOBAL:LOCAL1:LOCAL2.
type LargeCommunity struct {
	Global, Local1, Local2 uint32
}

// Route is one prefix announced from this node with its attributes.
type Route struct {
	// Prefix is the announced prefix: a VIP's /32 or /128, or the covering
	// prefix of the pool's aggregation length.
	Prefix netip.Prefix
	// NextHop is this node's address in the prefix's family.
	NextHop netip.Addr
	// Communities are RFC 1997 communities (ASN<<16 | value).
	Communities []uint32
	// LargeCommunities are RFC 8092 large communities.
	LargeCommunities []LargeCommunity
	// LocalPref, when set, is sent to iBGP peers only.
	LocalPref *uint32
	// Peers names the peers that receive the route; nil means every peer.
	Peers []string
}

// SessionState is the observed state of one session.
type SessionState struct {
	// Peer is the session's Peer.Name.
	Peer string
	// Address is the router's address.
	Address netip.Addr
	// State is the BGP FSM state: Idle, Connect, Active, OpenSent,
	// OpenConfirm or Established.
	State string
	// Reason says why the session last left Established or failed to
	// reach it (a notification, a TCP error, a hold timer expiry), if known.
	Reason string
	// Since is when State was entered.
	Since time.Time
	// Announced is the number of prefixes sent to the peer.
	Announced int
	// UpdatesSent and UpdatesReceived count UPDATE messages.
	UpdatesSent, UpdatesReceived uint64
	// Transitions counts the state changes observed since the session
	// was configured.
	Transitions uint64
	// PrefixLimitShutdowns counts the times the session was shut down
	// because the router sent more than Peer.MaxPrefixes, since the
	// session was configured.
	PrefixLimitShutdowns uint64
	// ReopenAt, while the session is down for exceeding its prefix limit,
	// is when it is reopened; zero otherwise.
	ReopenAt time.Time
	// BFD is the state of the peer's BFD session (AdminDown, Down, Init or
	// Up); empty when the peer has no BFD.
	BFD string
	// BFDDiag is the diagnostic of the BFD session's last change to Down,
	// in words, or why the BFD session could not start; empty while it
	// never went Down.
	BFDDiag string
	// BFDDowns counts the BFD session's changes from Up to Down.
	BFDDowns uint64
	// BFDTxLateMax and BFDRxGapMax are the BFD session's bfd.Status
	// TxLateMax and RxGapMax.
	BFDTxLateMax, BFDRxGapMax time.Duration
}

// Established reports whether the session is up.
func (s SessionState) Established() bool { return s.State == "Established" }

// Speaker is what the vipcast speaker needs from a BGP engine.
type Speaker interface {
	// SetPeers makes the configured sessions exactly peers: new ones are
	// opened, changed ones are reconfigured (resetting only that session),
	// missing ones are closed with a Cease notification.
	SetPeers(ctx context.Context, peers []Peer) error
	// Apply announces (or updates the attributes of) the routes in announce
	// and withdraws the prefixes in withdraw.
	Apply(ctx context.Context, announce []Route, withdraw []netip.Prefix) error
	// Sessions returns the state of every configured session.
	Sessions(ctx context.Context) ([]SessionState, error)
	// Stop closes every session with a Cease notification (so routers drop
	// the routes at once, even with graceful restart) and stops the engine.
	Stop(ctx context.Context) error
}
