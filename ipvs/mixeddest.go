package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
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
	ipvsFwdTunnel         = 2 // IP_VS_CONN_F_TUNNEL
)

// mixedFamily reports whether b is of another address family than the
// virtual server k.
func mixedFamily(k Key, b Backend) bool { return k.VIP.Unmap().Is4() != b.Addr.Unmap().Is4() }

// genlSocket is a generic netlink socket in the calling thread's network
// namespace, for the commands moby/ipvs cannot send.
func genlSocket() (*nl.SocketHandle, error) {
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_GENERIC)
	if err != nil {
		return nil, fmt.Errorf("generic netlink socket: %w", err)
	}
	return &nl.SocketHandle{Socket: s}, nil
}

// mixedDest sends cmd (ipvsCmdNewDest, SetDest or DelDest) for the real
// server b of another family than its virtual server k.
func (d *Dataplane) mixedDest(cmd uint8, k Key, b Backend) error {
	if d.genl == nil {
		return errors.New("no generic netlink socket")
	}
	fam, err := netlink.GenlFamilyGet(ipvsGenlFamily)
	if err != nil {
		return fmt.Errorf("generic netlink family %s: %w (is the ip_vs module loaded?)", ipvsGenlFamily, err)
	}
	vip, addr := k.VIP.Unmap(), b.Addr.Unmap()
	svc := nl.NewRtAttr(ipvsCmdAttrService, nil)
	svc.AddRtAttr(ipvsSvcAttrAF, nl.Uint16Attr(family(vip)))
	svc.AddRtAttr(ipvsSvcAttrProtocol, nl.Uint16Attr(uint16(k.Protocol)))
	svc.AddRtAttr(ipvsSvcAttrAddr, vip.AsSlice())
	svc.AddRtAttr(ipvsSvcAttrPort, binary.BigEndian.AppendUint16(nil, k.Port))
	dest := nl.NewRtAttr(ipvsCmdAttrDest, nil)
	dest.AddRtAttr(ipvsDestAttrAF, nl.Uint16Attr(family(addr)))
	dest.AddRtAttr(ipvsDestAttrAddr, addr.AsSlice())
	dest.AddRtAttr(ipvsDestAttrPort, binary.BigEndian.AppendUint16(nil, b.Port))
	if cmd != ipvsCmdDelDest {
		fwd := uint32(ipvsFwdTunnel)
		if !b.Tunnel {
			// Only tunnel mode crosses families: the kernel refuses
			// this, and says so.
			fwd = 0
		}
		dest.AddRtAttr(ipvsDestAttrFwdMethod, nl.Uint32Attr(fwd))
		dest.AddRtAttr(ipvsDestAttrWeight, nl.Uint32Attr(uint32(b.Weight))) //nolint:gosec // Validate: 0..65535
		dest.AddRtAttr(ipvsDestAttrUThresh, nl.Uint32Attr(0))
		dest.AddRtAttr(ipvsDestAttrLThresh, nl.Uint32Attr(0))
	}
	req := nl.NewNetlinkRequest(int(fam.ID), unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_GENERIC: d.genl}
	req.AddData(&nl.Genlmsg{Command: cmd, Version: ipvsGenlVersion})
	req.AddData(svc)
	req.AddData(dest)
	_, err = req.Execute(unix.NETLINK_GENERIC, 0)
	return err
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
	d.stale = true // the in-memory state no longer matches the kernel
	return errors.Join(errs...)
}
