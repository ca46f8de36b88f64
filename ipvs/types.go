package ipvs

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Protocol is a virtual server's transport protocol; the values are the IP
// protocol numbers the kernel uses.
type Protocol uint16

// Protocols IPVS balances.
const (
	TCP  Protocol = 6
	UDP  Protocol = 17
	SCTP Protocol = 132
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return fmt.Sprintf("proto-%d", uint16(p))
}

// ParseProtocol accepts a Kubernetes protocol name (TCP, UDP, SCTP; any
// case).
func ParseProtocol(s string) (Protocol, error) {
	switch strings.ToUpper(s) {
	case "TCP", "":
		return TCP, nil
	case "UDP":
		return UDP, nil
	case "SCTP":
		return SCTP, nil
	}
	return 0, fmt.Errorf("unknown protocol %q (want TCP, UDP or SCTP)", s)
}

// Service flags (include/uapi/linux/ip_vs.h, IP_VS_SVC_F_*). The persistent
// flag is not set through Flags: it follows Service.Persistent.
const (
	FlagPersistent uint32 = 0x0001 // IP_VS_SVC_F_PERSISTENT
	flagHashed     uint32 = 0x0002 // IP_VS_SVC_F_HASHED, kernel-internal
	FlagOnePacket  uint32 = 0x0004 // IP_VS_SVC_F_ONEPACKET
	FlagSched1     uint32 = 0x0008 // IP_VS_SVC_F_SCHED1
	FlagSched2     uint32 = 0x0010 // IP_VS_SVC_F_SCHED2
	FlagSched3     uint32 = 0x0020 // IP_VS_SVC_F_SCHED3

	// FlagMHFallback (IP_VS_SVC_F_SCHED_MH_FALLBACK): mh picks another
	// real server when the hashed one is unavailable (weight 0 or
	// overloaded) instead of dropping the packet.
	FlagMHFallback = FlagSched1
	// FlagMHPort (IP_VS_SVC_F_SCHED_MH_PORT): mh hashes the source port
	// too, so the connections of one client spread over the real servers.
	FlagMHPort = FlagSched2

	// userFlags are the flags a Service carries in Flags.
	userFlags = FlagOnePacket | FlagSched1 | FlagSched2 | FlagSched3
)

// Key identifies a virtual server.
type Key struct {
	VIP      netip.Addr
	Port     uint16
	Protocol Protocol
}

func (k Key) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(k.VIP, k.Port), k.Protocol)
}

func (k Key) compare(o Key) int {
	if c := k.VIP.Compare(o.VIP); c != 0 {
		return c
	}
	if c := cmp.Compare(k.Port, o.Port); c != 0 {
		return c
	}
	return cmp.Compare(k.Protocol, o.Protocol)
}

// Backend is one real server of a virtual server. Weight 0 drains it: its
// established connections go on, it gets no new ones (a terminating
// endpoint).
type Backend struct {
	Addr   netip.Addr
	Port   uint16
	Weight int
	// Tunnel forwards to this real server by IPIP instead of NAT: Addr is
	// a node's tunnel address and the packet keeps the VIP and port (tier 1
	// of the two-tier dataplane, see tunnel.go).
	Tunnel bool
}

// AddrPort is the backend's address and port: its identity in the service.
func (b Backend) AddrPort() netip.AddrPort { return netip.AddrPortFrom(b.Addr, b.Port) }

func (b Backend) String() string {
	if b.Tunnel {
		return fmt.Sprintf("%s w%d ipip", b.AddrPort(), b.Weight)
	}
	return fmt.Sprintf("%s w%d", b.AddrPort(), b.Weight)
}

// Service is one virtual server, VIP:Port/Protocol, with its real servers,
// forwarded with masquerading (IPVS NAT) or, those with Backend.Tunnel, by
// IPIP to another node's tier 2 (see tunnel.go).
type Service struct {
	VIP      netip.Addr
	Port     uint16
	Protocol Protocol
	// Scheduler is an IPVS scheduler name; "" means DefaultScheduler with
	// DefaultSchedulerFlags.
	Scheduler string
	// Flags are IPVS service flags (FlagMHPort, FlagMHFallback, ...);
	// persistence is set by Persistent, not here.
	Flags uint32
	// Persistent is the client affinity timeout in seconds
	// (sessionAffinity: ClientIP) of IPVS's persistence; 0 means none.
	Persistent uint32
	// Affinity is client affinity in tier 2 of the two-tier dataplane:
	// its endpoint is drawn from a hash of the client's address instead of
	// at random (see tier2.go). Tier 1 of such a virtual server has no
	// IPVS persistence: mh without port hashing sends a client to the same
	// node from every node, statelessly, where persistence on each node
	// would pin a client to whichever node each node's table named when
	// that node first saw it, and tables that differed for a moment (an
	// endpoint ready on one node's view before the other's) would split the
	// client's connections between two nodes for the persistence's whole
	// timeout. It is not a property of the IPVS virtual server: Read does
	// not report it (ReadTier2 does, as the hashed slots).
	Affinity bool
	// SNAT masquerades the connections to this virtual server to the
	// node's address (externalTrafficPolicy: Cluster, see snat.go); false
	// keeps the client's address (Local).
	SNAT     bool
	Backends []Backend
	// Local are this node's own endpoints, to which tier 2 of the two-tier
	// dataplane sends the flows the tunnel delivers (see tier2.go); only
	// with Options.Tunnel. They are not IPVS real servers: Read does not
	// report them (ReadTier2 does).
	Local []Backend
	// Cluster are the Service's endpoints anywhere in the cluster, for the
	// connections from inside the node that go straight to an endpoint
	// by DNAT instead of through IPVS (incluster.go): the node's own, and
	// with Options.PodCIDRs its pods' to a virtual server of one tier.
	// They are not IPVS real servers: Read does not report them
	// (ReadInCluster does, as the slots). A Dataplane without the map
	// ignores them (Options.PodCIDRs).
	Cluster []Backend
	// Restricted admits only the clients whose address is in SourceRanges
	// (spec.loadBalancerSourceRanges; see sources.go); a restricted
	// virtual server without a range of its VIP's family admits no one.
	// Unrestricted, every client is admitted and SourceRanges is unused.
	// Neither is an IPVS attribute: the VIP filter enforces them.
	Restricted   bool
	SourceRanges []netip.Prefix
}

// Key of the virtual server.
func (s Service) Key() Key { return Key{VIP: s.VIP, Port: s.Port, Protocol: s.Protocol} }

// Normalize returns s in the form the kernel reports it: the default
// scheduler filled in, addresses unmapped, the flags reduced to those a
// Service carries, backends sorted by address and port with duplicates
// removed (the last one wins).
func (s Service) Normalize() Service {
	s.VIP = s.VIP.Unmap()
	if s.Scheduler == "" {
		s.Scheduler = DefaultScheduler
		if s.Flags == 0 {
			s.Flags = DefaultSchedulerFlags
		}
	}
	s.Flags &= userFlags
	s.Backends = normalizeBackends(s.Backends)
	if s.Local != nil {
		s.Local = normalizeBackends(s.Local)
	}
	if s.Cluster != nil {
		s.Cluster = normalizeBackends(s.Cluster)
	}
	s.SourceRanges = normalizeRanges(s.VIP, s.Restricted, s.SourceRanges)
	return s
}

// normalizeBackends returns bs unmapped, sorted by address and port, with
// duplicates removed (the last one wins).
func normalizeBackends(in []Backend) []Backend {
	bs := make([]Backend, 0, len(in))
	for _, b := range in {
		b.Addr = b.Addr.Unmap()
		bs = append(bs, b)
	}
	slices.SortStableFunc(bs, func(a, b Backend) int { return a.AddrPort().Compare(b.AddrPort()) })
	out := bs[:0]
	for _, b := range bs {
		if n := len(out); n > 0 && out[n-1].AddrPort() == b.AddrPort() {
			out[n-1] = b
			continue
		}
		out = append(out, b)
	}
	return out
}

// Validate reports what the kernel would refuse: an invalid VIP, port 0,
// an unknown protocol or scheduler, a backend of another address family
// (but for a tunnel real server, which is IPv4 for every VIP),
// a negative weight.
func (s Service) Validate() error {
	var errs []error
	if !s.VIP.IsValid() {
		errs = append(errs, errors.New("no VIP"))
	}
	if s.Port == 0 {
		errs = append(errs, errors.New("port 0"))
	}
	switch s.Protocol {
	case TCP, UDP, SCTP:
	default:
		errs = append(errs, fmt.Errorf("unknown protocol %d", uint16(s.Protocol)))
	}
	if s.Scheduler != "" {
		if err := ValidScheduler(s.Scheduler); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, s.validateBackends("backend", s.Backends)...)
	errs = append(errs, s.validateBackends("local endpoint", s.Local)...)
	errs = append(errs, s.validateBackends("in-cluster endpoint", s.Cluster)...)
	for _, b := range append(slices.Clone(s.Local), s.Cluster...) {
		if b.Tunnel {
			errs = append(errs, fmt.Errorf("endpoint %s: tunnel forwarding is for tier-1 backends only", b.AddrPort()))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("virtual server %s: %w", s.Key(), err)
	}
	return nil
}

// validateBackends checks the real servers bs, called what in errors.
func (s Service) validateBackends(what string, bs []Backend) []error {
	var errs []error
	for _, b := range bs {
		switch {
		case !b.Addr.IsValid():
			errs = append(errs, fmt.Errorf("%s without address", what))
		case b.Tunnel && !b.Addr.Unmap().Is4() && s.VIP.Unmap().Is4():
			// An IPv4 VIP's tunnel addresses are IPv4; an IPv6 VIP's
			// are IPv4 (6in4) or IPv6 (ip6ip6).
			errs = append(errs, fmt.Errorf("%s %s: an IPv4 VIP's tunnel real server (two-tier dataplane) must be an IPv4 tunnel address", what, b.AddrPort()))
		case !b.Tunnel && b.Addr.Unmap().Is4() != s.VIP.Unmap().Is4():
			errs = append(errs, fmt.Errorf("%s %s: address family differs from the VIP's", what, b.AddrPort()))
		case b.Port == 0:
			errs = append(errs, fmt.Errorf("%s %s: port 0", what, b.AddrPort()))
		case b.Weight < 0 || b.Weight > 65535:
			errs = append(errs, fmt.Errorf("%s %s: weight %d out of 0..65535", what, b.AddrPort(), b.Weight))
		}
	}
	return errs
}

func (s Service) sameAttrs(o Service) bool {
	return s.Scheduler == o.Scheduler && s.Flags == o.Flags && s.Persistent == o.Persistent
}

func (s Service) withoutBackends() Service {
	s.Backends, s.Local, s.Cluster = nil, nil, nil
	return s
}

// State is a node's IPVS configuration: virtual servers by key and the VIPs
// bound to the dummy link. A desired State's VIPs include the VIP of each of
// its services (Diff adds them).
type State struct {
	Services map[Key]Service
	VIPs     map[netip.Addr]struct{}
}

// NewState returns an empty State.
func NewState() State {
	return State{Services: map[Key]Service{}, VIPs: map[netip.Addr]struct{}{}}
}

// Add puts svc (normalized) into s and binds its VIP.
func (s *State) Add(svc Service) {
	if s.Services == nil {
		s.Services = map[Key]Service{}
	}
	svc = svc.Normalize()
	s.Services[svc.Key()] = svc
	s.AddVIP(svc.VIP)
}

// AddVIP binds a VIP without any virtual server.
func (s *State) AddVIP(a netip.Addr) {
	if s.VIPs == nil {
		s.VIPs = map[netip.Addr]struct{}{}
	}
	s.VIPs[a.Unmap()] = struct{}{}
}

// Validate checks every service.
func (s State) Validate() error {
	var errs []error
	for _, k := range s.keys() {
		if err := s.Services[k].Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Clone returns a deep copy.
func (s State) Clone() State {
	c := State{Services: make(map[Key]Service, len(s.Services)), VIPs: make(map[netip.Addr]struct{}, len(s.VIPs))}
	for k, v := range s.Services {
		v.Backends = slices.Clone(v.Backends)
		v.Local = slices.Clone(v.Local)
		v.Cluster = slices.Clone(v.Cluster)
		v.SourceRanges = slices.Clone(v.SourceRanges)
		c.Services[k] = v
	}
	for a := range s.VIPs {
		c.VIPs[a] = struct{}{}
	}
	return c
}

func (s State) keys() []Key {
	ks := make([]Key, 0, len(s.Services))
	for k := range s.Services {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, Key.compare)
	return ks
}

// allVIPs is s.VIPs plus every service's VIP.
func (s State) allVIPs() map[netip.Addr]struct{} {
	m := make(map[netip.Addr]struct{}, len(s.VIPs)+len(s.Services))
	for a := range s.VIPs {
		m[a.Unmap()] = struct{}{}
	}
	for k := range s.Services {
		m[k.VIP.Unmap()] = struct{}{}
	}
	return m
}
