package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Real servers of another address family than their virtual server: the
// two tiers send an IPv6 VIP's packets to IPv4 tunnel addresses (6in4).
// The kernel takes such a real server in tunnel mode when the request
// names its family (IPVS_DEST_ATTR_ADDR_FAMILY, Linux 3.18), which
// github.com/moby/ipvs does not send: without it the kernel reads an IPv4
// address as the start of an IPv6 one. These commands are sent here, over
// a generic netlink socket of the Dataplane's namespace; every other real
// server goes through moby/ipvs.

// Generic netlink numbers of IPVS's real-server commands (linux/ip_vs.h).
const (
	ipvsCmdNewDest        = 5
	ipvsCmdSetDest        = 6
	ipvsCmdDelDest        = 7
	ipvsCmdAttrService    = 1
	ipvsCmdAttrDest       = 2
	ipvsSvcAttrAF         = 1
	ipvsSvcAttrProtocol   = 2
	ipvsSvcAttrAddr       = 3
	ipvsSvcAttrPort       = 4
	ipvsDestAttrAddr      = 1
	ipvsDestAttrPort      = 2
	ipvsDestAttrFwdMethod = 3
	ipvsDestAttrWeight    = 4
	ipvsDestAttrUThresh   = 5
	ipvsDestAttrLThresh   = 6
	ipvsDestAttrAF        = 11
)

// mixedFamily reports whether b is of another address family than the
// virtual server k.
func mixedFamily(k Key, b Backend) bool { return k.VIP.Unmap().Is4() != b.Addr.Unmap().Is4() }

// genlConn is a generic netlink socket in the network namespace of the
// Dataplane that opened it, with IPVS's family number, both found once.
type genlConn struct {
	sock *nl.SocketHandle
	id   int
}

// openGenl opens a genlConn in the calling thread's network namespace.
func openGenl() (*genlConn, error) {
	id, err := ipvsGenlFamilyID()
	if err != nil {
		return nil, err
	}
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("generic netlink socket: %w", err)
	}
	return &genlConn{sock: &nl.SocketHandle{Socket: s}, id: id}, nil
}

func (g *genlConn) close() { g.sock.Socket.Close() }

// mixedDest sends cmd (ipvsCmdNewDest, SetDest or DelDest) for the real
// server b of another family than its virtual server k, with the
// attributes kernelDest gives moby/ipvs and the family it leaves out.
func (d *Dataplane) mixedDest(cmd uint8, k Key, b Backend) error {
	g := d.tiers.genl()
	if g == nil {
		return errNoGenl
	}
	svc, dest := destAttrs(cmd, k, b)
	_, err := ipvsGenlExec(g.id, g.sock, cmd, unix.NLM_F_ACK, svc, dest)
	return err
}

// errNoGenl: a command only the Dataplane's own generic netlink socket
// sends, which New opens with the two tiers only.
var errNoGenl = errors.New("no generic netlink socket (the two-tier dataplane is off)")

// destAttrs returns the attributes of cmd (ipvsCmdNewDest, SetDest or
// DelDest) for the real server b of virtual server k: those kernelDest
// gives moby/ipvs, and b's address family, which moby/ipvs leaves out.
func destAttrs(cmd uint8, k Key, b Backend) (svc, dest *nl.RtAttr) {
	b.Addr = b.Addr.Unmap()
	vip, kd := k.VIP.Unmap(), kernelDest(b)
	svc = nl.NewRtAttr(ipvsCmdAttrService, nil)
	svc.AddRtAttr(ipvsSvcAttrAF, nl.Uint16Attr(family(vip)))
	svc.AddRtAttr(ipvsSvcAttrProtocol, nl.Uint16Attr(uint16(k.Protocol)))
	svc.AddRtAttr(ipvsSvcAttrAddr, vip.AsSlice())
	svc.AddRtAttr(ipvsSvcAttrPort, binary.BigEndian.AppendUint16(nil, k.Port))
	dest = nl.NewRtAttr(ipvsCmdAttrDest, nil)
	dest.AddRtAttr(ipvsDestAttrAF, nl.Uint16Attr(kd.AddressFamily))
	dest.AddRtAttr(ipvsDestAttrAddr, kd.Address)
	dest.AddRtAttr(ipvsDestAttrPort, binary.BigEndian.AppendUint16(nil, kd.Port))
	if cmd != ipvsCmdDelDest {
		// Only tunnel mode crosses families: the kernel refuses another.
		dest.AddRtAttr(ipvsDestAttrFwdMethod, nl.Uint32Attr(kd.ConnectionFlags&libipvs.ConnectionFlagFwdMask))
		dest.AddRtAttr(ipvsDestAttrWeight, nl.Uint32Attr(uint32(kd.Weight))) //nolint:gosec // Validate: 0..65535
		dest.AddRtAttr(ipvsDestAttrUThresh, nl.Uint32Attr(kd.UpperThreshold))
		dest.AddRtAttr(ipvsDestAttrLThresh, nl.Uint32Attr(kd.LowerThreshold))
	}
	return svc, dest
}

// dropMixedDests deletes every tunnel real server of another family than
// its virtual server (those the two tiers give IPv6 VIPs), so that the
// kernel starts the sync daemons.
func (d *Dataplane) dropMixedDests() error {
	kss, err := d.ipvs.GetServices()
	if err != nil {
		return fmt.Errorf("list virtual servers: %w", err)
	}
	var errs []error
	for _, ks := range kss {
		svc, ok := serviceFrom(ks)
		if !ok {
			continue
		}
		k := svc.Key()
		bs, err := d.readBackends(ks, k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, b := range bs {
			if b.Tunnel && mixedFamily(k, b) {
				if err := d.mixedDest(ipvsCmdDelDest, k, b); err != nil && !isNotFound(err) {
					errs = append(errs, fmt.Errorf("delete real server %s -> %s: %w", k, b, err))
				}
			}
		}
	}
	return errors.Join(errs...) // New's Dataplane is stale: its first Sync reads the kernel

}
