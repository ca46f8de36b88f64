package ipvs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Connection sync across routers (ConnSync.Relay). The kernel's sync
// daemons speak multicast only, to the link-local group 224.0.0.81, which
// no router forwards: nodes on different subnets (a rack each, or a /31 to
// the ToR each, as in many BGP-to-the-host fabrics) never hear each
// other. With a relay the daemons run on a veth pair of their own
// (SyncLink, whose other end is SyncPeer) and the Dataplane carries their
// messages: the master's, read from SyncPeer, go by unicast UDP to every
// other node's relay (SyncRelay.Port on its address); a relay sends what
// it receives from a known node into SyncPeer, as multicast, where the
// backup on SyncLink takes it. Messages are passed on whole, as the
// kernel wrote them; a relay never passes on what another relay sent it,
// so no message goes round.
//
// What the relay accepts (syncfilter.go, syncauth.go): datagrams from the
// addresses of Dataplane's peers (Dataplane.SetSyncPeers; none until then),
// signed with one of the relays' keys (Dataplane.SetSyncKeys; without keys
// the source address alone decides), sent within syncMaxSkew, that are
// IPVS sync messages of protocol version 1 with the Dataplane's sync ID;
// of each message only the connections the node's own tier 1 could have
// written go on (filterSyncMessage). Multicast sync on a shared link has
// none of this: the tunnel guard takes the group's datagrams from node
// addresses only (tunnelguard.go), and anyone who can forge a node's
// address on that link can still enter connections.

// The sync veth pair and its addresses.
const (
	// SyncLink is the end of the relay's veth pair the sync daemons run
	// on; SyncPeer is the relay's end.
	SyncLink = "vcsync0"
	SyncPeer = "vcsync1"
	// syncLinkAddr and syncPeerAddr address the pair (link-local, never
	// routed off the node): the master sends from the one, the relay
	// injects from the other.
	syncLinkAddr = "169.254.81.1/30"
	syncPeerAddr = "169.254.81.2/30"
	// DefaultSyncRelayPort is the relays' UDP port between nodes.
	DefaultSyncRelayPort = 8849
	// syncMcastGroup and syncMcastPort are where the kernel's daemons
	// send and listen (their defaults).
	syncMcastGroup = "224.0.0.81"
	syncMcastPort  = 8848
	// syncHeaderLen is the length of a version 1 sync message's header.
	syncHeaderLen = 8
	// syncMaxMessage bounds a datagram the relay reads: the master
	// sizes its messages to SyncLink's MTU.
	syncMaxMessage = 65535
)

// SyncRelay configures the relay of ConnSync.Relay.
type SyncRelay struct {
	// Address is the node's address the relay listens on and sends from:
	// its InternalIP, which the other nodes' relays know it by.
	Address netip.Addr
	// Port is the relays' UDP port, the same on every node (0:
	// DefaultSyncRelayPort).
	Port uint16
}

func (r SyncRelay) port() uint16 {
	if r.Port == 0 {
		return DefaultSyncRelayPort
	}
	return r.Port
}

func (r SyncRelay) check() error {
	if !r.Address.IsValid() {
		return errors.New("connection sync relay: the node's address is not set")
	}
	return nil
}

// RelayStats counts what a relay did since it started.
type RelayStats struct {
	// Sent are the local master's messages sent on, once per peer.
	Sent uint64
	// Received are messages from peers sent into the local backup.
	Received uint64
	// Dropped are datagrams refused, DroppedBy the same by reason
	// (SyncDropUnknownSource, SyncDropUnsigned, SyncDropUnknownKey,
	// SyncDropBadMAC, SyncDropStale, SyncDropMalformed, SyncDropEmpty,
	// SyncDropSendFailed).
	Dropped   uint64
	DroppedBy map[string]uint64
	// DroppedConns are connections left out of messages that went on or
	// were dropped as SyncDropEmpty, by reason (SyncDropNotTunnel,
	// SyncDropUnknownTarget); ClampedConns those whose timeout was cut.
	DroppedConns map[string]uint64
	ClampedConns uint64
}

// Why a relay drops a datagram, besides the keys' reasons (syncauth.go)
// and SyncDropMalformed.
const (
	SyncDropUnknownSource = "unknown-source"
	SyncDropEmpty         = "no-connection-left"
	SyncDropSendFailed    = "send-failed"
)

// checkSyncMessage reports why b is not one IPVS sync message of protocol
// version 1 with sync ID id (0: any), as the kernel's master writes them:
// an 8-byte header (a zero byte, the sync ID, the message's length, the
// number of connections, the version 1, two spare bytes) and the
// connections.
func checkSyncMessage(b []byte, id uint8) error {
	switch {
	case len(b) < syncHeaderLen:
		return fmt.Errorf("%d bytes, shorter than a sync message's header", len(b))
	case b[0] != 0 || b[5] != 1:
		return errors.New("not an IPVS sync message of protocol version 1")
	case int(binary.BigEndian.Uint16(b[2:4])) != len(b):
		return fmt.Errorf("the header says %d bytes, the datagram has %d", binary.BigEndian.Uint16(b[2:4]), len(b))
	case id != 0 && b[1] != id:
		return fmt.Errorf("sync ID %d, not %d", b[1], id)
	}
	return nil
}

// relay carries the sync daemons' messages between nodes (see above).
type relay struct {
	id   uint8
	port uint16
	// local reads the master's messages from SyncPeer; inject sends the
	// peers' into it; wide talks to the other nodes' relays.
	local, inject, wide *net.UDPConn
	group               netip.AddrPort

	mu    sync.Mutex
	peers map[netip.Addr]struct{}
	// keys sign and check the datagrams between relays; targets are what
	// a relayed connection may name (the Dataplane's tier 1).
	keys    atomic.Pointer[SyncKeys]
	targets *syncTargets
	now     func() time.Time

	sent, received atomic.Uint64
	cmu            sync.Mutex // guards the drop counters
	dropped        uint64
	droppedBy      map[string]uint64
	droppedConns   map[string]uint64
	clampedConns   uint64
	wg             sync.WaitGroup
}

// prepareSyncRelay makes the veth pair the relay's daemons run on, with
// its addresses and sysctls, and returns the index of SyncPeer. Like
// prepareTunnel it skips what is already so, for a speaker without write
// access to /proc/sys after the init container did the writing.
func prepareSyncRelay(nh *netlink.Handle) (peerIndex int, err error) {
	link, peer, err := ensureVethPair(nh, SyncLink, SyncPeer)
	if err != nil {
		return 0, err
	}
	for _, la := range []struct {
		l    netlink.Link
		addr string
	}{{link, syncLinkAddr}, {peer, syncPeerAddr}} {
		a, err := netlink.ParseAddr(la.addr)
		if err != nil {
			return 0, err
		}
		if err := nh.AddrReplace(la.l, a); err != nil {
			return 0, fmt.Errorf("address %s on %s: %w", la.addr, la.l.Attrs().Name, err)
		}
		if err := setUp(nh, la.l); err != nil {
			return 0, err
		}
		// Each end's messages come from the other end: an address of
		// this node.
		if err := setSysctl("net/ipv4/conf/"+la.l.Attrs().Name+"/accept_local", "1"); err != nil {
			return 0, err
		}
	}
	if err := exemptFromRPFilter(SyncLink, SyncPeer); err != nil {
		return 0, err
	}
	return peer.Attrs().Index, nil
}

// PrepareSyncRelay is the part of a relay's setup that needs privilege
// (the veth pair's sysctls): the work of the chart's privileged init
// container (vipcast-speaker prepare-node --conn-sync-relay).
func PrepareSyncRelay() error {
	nh, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("rtnetlink: %w", err)
	}
	defer nh.Close()
	_, err = prepareSyncRelay(nh)
	return err
}

// startRelay opens the relay's sockets in the calling thread's network
// namespace and starts carrying messages of sync ID id.
func startRelay(peerIndex int, id uint8, c SyncRelay, targets *syncTargets) (*relay, error) {
	r := newRelay(id, c.port(), targets)
	var err error
	defer func() {
		if err != nil {
			r.closeSockets()
		}
	}()
	if r.local, err = listenGroup(peerIndex, r.group); err != nil {
		return nil, fmt.Errorf("connection sync relay: read the sync daemons on %s: %w", SyncPeer, err)
	}
	if r.inject, err = injector(peerIndex); err != nil {
		return nil, fmt.Errorf("connection sync relay: send into %s: %w", SyncPeer, err)
	}
	wideAddr := netip.AddrPortFrom(c.Address.Unmap(), r.port)
	if r.wide, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(wideAddr)); err != nil {
		return nil, fmt.Errorf("connection sync relay: listen on %s (the node's address and --conn-sync-relay-port): %w", wideAddr, err)
	}
	r.wg.Add(2)
	go r.pump(r.local, &r.sent, r.toPeers)
	go r.pump(r.wide, &r.received, r.toBackup)
	return r, nil
}

// newRelay returns a relay without sockets.
func newRelay(id uint8, port uint16, targets *syncTargets) *relay {
	r := &relay{id: id, port: port, group: netip.AddrPortFrom(netip.MustParseAddr(syncMcastGroup), syncMcastPort),
		targets: targets, now: time.Now, droppedBy: map[string]uint64{}, droppedConns: map[string]uint64{}}
	r.setPeers(nil)
	r.keys.Store(&SyncKeys{})
	return r
}

// listenGroup opens a socket that receives the sync group's datagrams
// arriving on link ifindex only: it joins the group there and takes no
// multicast of memberships it does not hold itself (IP_MULTICAST_ALL
// off, which also checks the link), or it would read what the relay
// injects for the backup on the other end and send it round. (Not
// SO_BINDTODEVICE: before Linux 5.7 that needs CAP_NET_RAW, which the
// speaker does not have.)
func listenGroup(ifindex int, group netip.AddrPort) (*net.UDPConn, error) {
	ifi, err := net.InterfaceByIndex(ifindex)
	if err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			s := int(fd)
			serr = errors.Join(
				unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1),
				unix.SetsockoptInt(s, unix.IPPROTO_IP, unix.IP_MULTICAST_ALL, 0),
			)
		})
		return errors.Join(err, serr)
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp4", group.String())
	if err != nil {
		return nil, err
	}
	conn := pc.(*net.UDPConn)
	if err := control(conn, func(s int) error {
		return unix.SetsockoptIPMreqn(s, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP,
			&unix.IPMreqn{Multiaddr: group.Addr().As4(), Ifindex: int32(ifindex)}) //nolint:gosec // an interface index
	}); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("join %s on %s: %w", group.Addr(), ifi.Name, err)
	}
	return conn, nil
}

// injector opens the socket the relay sends the peers' messages from:
// out of link ifindex, to the link only (TTL 1), not looped back.
func injector(ifindex int) (*net.UDPConn, error) {
	src, err := netip.ParsePrefix(syncPeerAddr)
	if err != nil {
		return nil, err
	}
	conn, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src.Addr(), 0)))
	if err != nil {
		return nil, err
	}
	if err := control(conn, func(s int) error {
		return errors.Join(
			unix.SetsockoptIPMreqn(s, unix.IPPROTO_IP, unix.IP_MULTICAST_IF, &unix.IPMreqn{Ifindex: int32(ifindex)}), //nolint:gosec // an interface index
			unix.SetsockoptInt(s, unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP, 0),
			unix.SetsockoptInt(s, unix.IPPROTO_IP, unix.IP_MULTICAST_TTL, 1),
		)
	}); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

// control runs f on conn's file descriptor.
func control(conn *net.UDPConn, f func(fd int) error) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil { //nolint:gosec // a file descriptor
		return err
	}
	return ferr
}

// setPeers replaces the addresses the relay sends to and accepts from.
func (r *relay) setPeers(peers []netip.Addr) {
	set := make(map[netip.Addr]struct{}, len(peers))
	for _, p := range peers {
		set[p.Unmap()] = struct{}{}
	}
	r.mu.Lock()
	r.peers = set
	r.mu.Unlock()
}

func (r *relay) peerList() []netip.AddrPort {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]netip.AddrPort, 0, len(r.peers))
	for p := range r.peers {
		out = append(out, netip.AddrPortFrom(p, r.port))
	}
	return out
}

func (r *relay) known(a netip.Addr) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.peers[a.Unmap()]
	return ok
}

// pump reads conn's datagrams until conn is closed and hands each to
// pass, which sends it on and reports how many times it did (counted in
// done); pass counts what it drops.
func (r *relay) pump(conn *net.UDPConn, done *atomic.Uint64, pass func(msg []byte, from netip.AddrPort) int) {
	defer r.wg.Done()
	buf := make([]byte, syncMaxMessage)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		switch {
		case errors.Is(err, net.ErrClosed):
			return
		case err != nil:
			r.drop(SyncDropMalformed)
			continue
		}
		done.Add(uint64(pass(buf[:n], from))) //nolint:gosec // a count
	}
}

// drop counts a datagram dropped for reason.
func (r *relay) drop(reason string) {
	r.cmu.Lock()
	r.dropped++
	r.droppedBy[reason]++
	r.cmu.Unlock()
}

// toPeers sends the local master's message, signed, to every peer.
func (r *relay) toPeers(msg []byte, _ netip.AddrPort) (ok int) {
	if checkSyncMessage(msg, r.id) != nil {
		r.drop(SyncDropMalformed)
		return 0
	}
	msg = r.keys.Load().seal(msg, r.now())
	for _, p := range r.peerList() {
		if _, err := r.wide.WriteToUDPAddrPort(msg, p); err != nil {
			r.drop(SyncDropSendFailed)
			continue
		}
		ok++
	}
	return ok
}

// toBackup sends into the local backup what check lets through of a
// peer's datagram.
func (r *relay) toBackup(b []byte, from netip.AddrPort) int {
	msg, reason := r.check(b, from)
	if msg == nil {
		r.drop(reason)
		return 0
	}
	if _, err := r.inject.WriteToUDPAddrPort(msg, r.group); err != nil {
		r.drop(SyncDropSendFailed)
		return 0
	}
	return 1
}

// check returns the message of datagram b from address from with only
// the connections the relay lets in, or nil and why it is dropped: from an
// address not a peer's, not signed with a current key or stale, not a sync
// message of the relay's sync ID, or with no connection left.
func (r *relay) check(b []byte, from netip.AddrPort) ([]byte, string) {
	if !r.known(from.Addr()) {
		return nil, SyncDropUnknownSource
	}
	msg, err := r.keys.Load().open(b, r.now())
	if err != nil {
		return nil, err.Error()
	}
	if checkSyncMessage(msg, r.id) != nil {
		return nil, SyncDropMalformed
	}
	out, res := filterSyncMessage(msg, r.targets.allows)
	r.cmu.Lock()
	for reason, n := range res.Dropped {
		if reason != SyncDropMalformed {
			r.droppedConns[reason] += uint64(n) //nolint:gosec // a count
		}
	}
	r.clampedConns += uint64(res.Clamped) //nolint:gosec // a count
	r.cmu.Unlock()
	switch {
	case res.Dropped[SyncDropMalformed] > 0:
		return nil, SyncDropMalformed
	case out == nil:
		return nil, SyncDropEmpty
	}
	return out, ""
}

func (r *relay) stats() RelayStats {
	r.cmu.Lock()
	defer r.cmu.Unlock()
	return RelayStats{Sent: r.sent.Load(), Received: r.received.Load(), Dropped: r.dropped,
		DroppedBy: maps.Clone(r.droppedBy), DroppedConns: maps.Clone(r.droppedConns), ClampedConns: r.clampedConns}
}

func (r *relay) closeSockets() {
	for _, c := range []*net.UDPConn{r.local, r.inject, r.wide} {
		if c != nil {
			_ = c.Close()
		}
	}
}

// stop closes the sockets and waits for the relay's goroutines.
func (r *relay) stop() {
	r.closeSockets()
	r.wg.Wait()
}
