package ipvs

import (
	"errors"
	"net"
	"net/netip"
	"syscall"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func isNotFound(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH)
}

// vipAddr is a host address: /32 or /128; IPv6 without duplicate address
// detection (a VIP is announced by many nodes at once, and DAD would keep
// it tentative and unusable for a second or more).
func vipAddr(a netip.Addr) *netlink.Addr {
	bits := a.BitLen()
	na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
	if a.Is6() {
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}

func family(a netip.Addr) uint16 {
	if a.Is4() {
		return syscall.AF_INET
	}
	return syscall.AF_INET6
}

func keyService(k Key) *libipvs.Service {
	return &libipvs.Service{
		Address:       k.VIP.AsSlice(),
		Port:          k.Port,
		Protocol:      uint16(k.Protocol),
		AddressFamily: family(k.VIP),
		Netmask:       netmask(k.VIP),
	}
}

func netmask(a netip.Addr) uint32 {
	if a.Is4() {
		return 0xffffffff
	}
	return 128
}

func kernelService(s Service) *libipvs.Service {
	ks := keyService(s.Key())
	ks.SchedName = s.Scheduler
	ks.Flags = s.Flags & userFlags
	if s.Persistent > 0 {
		ks.Flags |= FlagPersistent
		ks.Timeout = s.Persistent
	}
	return ks
}

func kernelDest(b Backend) *libipvs.Destination {
	fwd := uint32(libipvs.ConnectionFlagMasq)
	if b.Tunnel {
		fwd = libipvs.ConnectionFlagTunnel
	}
	return &libipvs.Destination{
		Address:         b.Addr.AsSlice(),
		Port:            b.Port,
		Weight:          b.Weight,
		ConnectionFlags: fwd,
		AddressFamily:   family(b.Addr),
	}
}
