package ipvs

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Connection synchronisation (Options.ConnSync): the kernel's IPVS sync
// daemons (what ipvsadm --start-daemon starts) share every node's tier-1
// connections with the other nodes. Each node runs both: a master, which
// sends its connections to the multicast group 224.0.0.81, UDP port 8848,
// out of one link, and a backup, which takes the other nodes' messages
// with the same sync ID from that link and enters them in its own
// connection table, bound to the same real server (here: the node the flow
// was tunnelled to).
//
// Tier 1's mh sends a flow to the same node from every node as long as
// the nodes' tables stay the same. When a table changes (a node's pods all
// terminate and its weight drops to 0; a node gains or loses endpoints)
// while ECMP moves a flow to another node, mh there picks another node,
// whose tier 2 has no state for the flow. With the other node's
// connection already in the new ingress node's table, IPVS sends the flow
// where it went before, and the pod's node's conntrack keeps it on its pod.
//
// The kernel sends a connection when its third packet arrives and every 50
// packets after (net.ipv4.vs.sync_threshold "3 50"), and when a TCP
// connection's state moves towards closing; messages go out within about
// two seconds. A flow ECMP moves sooner than that after it opened, or to a
// node the messages do not reach (multicast does not cross routers without
// multicast routing), depends on mh alone, as without synchronisation.

// ConnSync configures the IPVS sync daemons (Options.ConnSync).
type ConnSync struct {
	// Interface is the link the messages go out of and come in on: the
	// node's link to the other nodes. Empty: the link that holds Address.
	Interface string
	// Address, with Interface empty, is an address of the node (its
	// InternalIP) whose link carries the messages.
	Address netip.Addr
	// ID is the sync ID: a node's backup takes only messages with its own
	// ID, so clusters (or keepalived pairs) that share a link keep apart.
	// 0 takes every message.
	ID uint8
	// Off stops the daemons that run with ID (those of an earlier run
	// with connection sync on) instead of starting any; the other fields
	// are then unused.
	Off bool
	// Relay, when set, carries the messages between the nodes by unicast
	// (syncrelay.go) instead of multicast on a link they share: the
	// daemons run on SyncLink, and Interface and Address are unused.
	Relay *SyncRelay
}

// SyncDaemon is one IPVS sync daemon running in this network namespace.
type SyncDaemon struct {
	// Backup is true for the daemon that receives, false for the master,
	// which sends.
	Backup    bool
	Interface string
	ID        uint8
}

func (s SyncDaemon) String() string {
	role := "master"
	if s.Backup {
		role = "backup"
	}
	return fmt.Sprintf("%s on %s, sync ID %d", role, s.Interface, s.ID)
}

// Generic netlink numbers of IPVS's daemon commands (linux/ip_vs.h).
const (
	ipvsGenlFamily        = "IPVS"
	ipvsGenlVersion       = 1
	ipvsCmdNewDaemon      = 9
	ipvsCmdDelDaemon      = 10
	ipvsCmdGetDaemon      = 11
	ipvsCmdAttrDaemon     = 3
	ipvsDaemonAttrState   = 1
	ipvsDaemonAttrIfname  = 2
	ipvsDaemonAttrSyncID  = 3
	ipvsSyncStateMaster   = 1
	ipvsSyncStateBackup   = 2
	ipvsIfnameMax         = 16 // IP_VS_IFNAME_MAXLEN, with the NUL
	nlaTypeMask           = 0x3fff
	ipvsSyncDaemonsPerNet = 2
)

// on reports whether c asks for the sync daemons to run.
func (c *ConnSync) on() bool { return c != nil && !c.Off }

// relayPort is the relay's UDP port when c asks for the relay, else 0.
func (c *ConnSync) relayPort() uint16 {
	if !c.on() || c.Relay == nil {
		return 0
	}
	return c.Relay.port()
}

func (c ConnSync) check() error {
	if c.Relay != nil {
		return c.Relay.check()
	}
	if c.Interface == "" && c.Address.IsValid() {
		return nil
	}
	if c.Interface == "" || len(c.Interface) >= ipvsIfnameMax {
		return fmt.Errorf("connection sync interface %q: want a link name of 1 to %d characters", c.Interface, ipvsIfnameMax-1)
	}
	return nil
}

// daemons are the two daemons c asks for.
func (c ConnSync) daemons() [ipvsSyncDaemonsPerNet]SyncDaemon {
	// c.Interface is set: ensureConnSync resolved it.
	return [...]SyncDaemon{{Interface: c.Interface, ID: c.ID}, {Backup: true, Interface: c.Interface, ID: c.ID}}
}

// ReadSyncDaemons lists the IPVS sync daemons of this network namespace.
func ReadSyncDaemons() ([]SyncDaemon, error) {
	msgs, err := dump("IPVS sync daemons", func() ([][]byte, error) {
		return ipvsGenl(ipvsCmdGetDaemon, unix.NLM_F_DUMP, nil)
	})
	if err != nil {
		return nil, err
	}
	var out []SyncDaemon
	for _, m := range msgs {
		if len(m) < nl.SizeofGenlmsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[nl.SizeofGenlmsg:])
		if err != nil {
			return nil, fmt.Errorf("list IPVS sync daemons: %w", err)
		}
		for _, a := range attrs {
			if a.Attr.Type&nlaTypeMask != ipvsCmdAttrDaemon {
				continue
			}
			d, err := parseSyncDaemon(a.Value)
			if err != nil {
				return nil, fmt.Errorf("list IPVS sync daemons: %w", err)
			}
			out = append(out, d)
		}
	}
	return out, nil
}

func parseSyncDaemon(b []byte) (SyncDaemon, error) {
	attrs, err := nl.ParseRouteAttr(b)
	if err != nil {
		return SyncDaemon{}, err
	}
	var d SyncDaemon
	for _, a := range attrs {
		switch a.Attr.Type & nlaTypeMask {
		case ipvsDaemonAttrState:
			if len(a.Value) >= 4 {
				d.Backup = nl.NativeEndian().Uint32(a.Value) == ipvsSyncStateBackup
			}
		case ipvsDaemonAttrIfname:
			d.Interface = string(bytes.TrimRight(a.Value, "\x00"))
		case ipvsDaemonAttrSyncID:
			if len(a.Value) >= 4 {
				d.ID = uint8(nl.NativeEndian().Uint32(a.Value)) //nolint:gosec // the kernel's sync ID is 8 bits
			}
		}
	}
	return d, nil
}

// ensureConnSync starts c's master and backup daemons, on the link that
// holds c.Address when c.Interface is empty, and returns c with the link's
// name. A daemon already
// running as c asks is kept (its connections and socket go on); one
// running otherwise (another link or sync ID: an earlier configuration)
// is stopped and started again as c asks, since a network namespace has
// at most one master and one backup.
func ensureConnSync(nh *netlink.Handle, c ConnSync) (ConnSync, error) {
	if c.Interface == "" {
		name, err := linkWithAddress(nh, c.Address)
		if err != nil {
			return c, fmt.Errorf("connection sync: %w", err)
		}
		c.Interface = name
	}
	return c, startConnSync(c)
}

// linkWithAddress names the link that holds a.
func linkWithAddress(nh *netlink.Handle, a netip.Addr) (string, error) {
	addrs, err := dump("addresses", func() ([]netlink.Addr, error) {
		return nh.AddrList(nil, unix.AF_UNSPEC)
	})
	if err != nil {
		return "", err
	}
	for _, ad := range addrs {
		if got, ok := netip.AddrFromSlice(ad.IP); ok && got.Unmap() == a.Unmap() {
			l, err := nh.LinkByIndex(ad.LinkIndex)
			if err != nil {
				return "", fmt.Errorf("link of %s: %w", a, err)
			}
			return l.Attrs().Name, nil
		}
	}
	return "", fmt.Errorf("no link holds the node's address %s: name the link that reaches the other nodes", a)
}

// startConnSync starts c's daemons (c.Interface set).
func startConnSync(c ConnSync) error {
	running, err := ReadSyncDaemons()
	if err != nil {
		return err
	}
	for _, want := range c.daemons() {
		for _, have := range running {
			if have.Backup == want.Backup && have != want {
				if err := stopSyncDaemon(have); err != nil {
					return err
				}
			}
		}
	}
	for _, want := range c.daemons() {
		err := startSyncDaemon(want)
		if err != nil && !errors.Is(err, syscall.EEXIST) {
			return fmt.Errorf("%w (name the link to the other nodes, or turn connection sync off)", err)
		}
	}
	return nil
}

// stopConnSyncID stops the daemons of this namespace that run with sync
// ID id; others are left alone.
func stopConnSyncID(id uint8) error {
	running, err := ReadSyncDaemons()
	if err != nil {
		return err
	}
	var errs []error
	for _, have := range running {
		if have.ID == id {
			errs = append(errs, stopSyncDaemon(have))
		}
	}
	return errors.Join(errs...)
}

func startSyncDaemon(d SyncDaemon) error {
	attr := nl.NewRtAttr(ipvsCmdAttrDaemon, nil)
	attr.AddRtAttr(ipvsDaemonAttrState, nl.Uint32Attr(syncState(d)))
	attr.AddRtAttr(ipvsDaemonAttrIfname, nl.ZeroTerminated(d.Interface))
	attr.AddRtAttr(ipvsDaemonAttrSyncID, nl.Uint32Attr(uint32(d.ID)))
	if _, err := ipvsGenl(ipvsCmdNewDaemon, unix.NLM_F_ACK, attr); err != nil {
		return fmt.Errorf("start IPVS sync daemon (%s): %w", d, err)
	}
	return nil
}

func stopSyncDaemon(d SyncDaemon) error {
	attr := nl.NewRtAttr(ipvsCmdAttrDaemon, nil)
	attr.AddRtAttr(ipvsDaemonAttrState, nl.Uint32Attr(syncState(d)))
	if _, err := ipvsGenl(ipvsCmdDelDaemon, unix.NLM_F_ACK, attr); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop IPVS sync daemon (%s): %w", d, err)
	}
	return nil
}

func syncState(d SyncDaemon) uint32 {
	if d.Backup {
		return ipvsSyncStateBackup
	}
	return ipvsSyncStateMaster
}

// ipvsGenl sends one IPVS generic netlink command in the calling thread's
// network namespace and returns the answers.
func ipvsGenl(cmd uint8, flags int, attr *nl.RtAttr) ([][]byte, error) {
	id, err := ipvsGenlFamilyID()
	if err != nil {
		return nil, err
	}
	var attrs []*nl.RtAttr
	if attr != nil {
		attrs = append(attrs, attr)
	}
	return ipvsGenlExec(id, nil, cmd, flags, attrs...)
}

// ipvsGenlFamilyID is the number of IPVS's generic netlink family.
func ipvsGenlFamilyID() (int, error) {
	fam, err := netlink.GenlFamilyGet(ipvsGenlFamily)
	if err != nil {
		return 0, fmt.Errorf("generic netlink family %s: %w (is the ip_vs module loaded?)", ipvsGenlFamily, err)
	}
	return int(fam.ID), nil
}

// ipvsGenlExec sends the IPVS command cmd with attrs to family id over
// sock (nil: a socket of the calling thread's namespace) and returns the
// answers.
func ipvsGenlExec(id int, sock *nl.SocketHandle, cmd uint8, flags int, attrs ...*nl.RtAttr) ([][]byte, error) {
	req := nl.NewNetlinkRequest(id, flags)
	if sock != nil {
		req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_GENERIC: sock}
	}
	req.AddData(&nl.Genlmsg{Command: cmd, Version: ipvsGenlVersion})
	for _, a := range attrs {
		req.AddData(a)
	}
	return req.Execute(unix.NETLINK_GENERIC, 0)
}
