package ipvs

import (
	"errors"
	"fmt"
	"net/netip"

	libipvs "github.com/moby/ipvs"
	"github.com/vishvananda/netlink"
)

// Read returns the kernel's whole IPVS table (foreign virtual servers too)
// and the VIPs bound to the dummy link.
func (d *Dataplane) Read() (State, error) {
	k, err := d.readLocked()
	return k.st, err
}

// ReadTier2 returns the tier-2 map as the kernel has it (empty without
// Options.Tunnel).
func (d *Dataplane) ReadTier2() (Tier2, error) {
	k, err := d.readLocked()
	return k.tier2, err
}

// ReadInCluster returns the in-cluster map as the kernel has it (empty
// with Options.NoSNAT).
func (d *Dataplane) ReadInCluster() (Tier2, error) {
	k, err := d.readLocked()
	return k.cluster, err
}

// ReadFilter returns the VIP filter's content as the kernel has it (empty
// with Options.NoFilter).
func (d *Dataplane) ReadFilter() (Filter, error) {
	k, err := d.readLocked()
	return k.filter, err
}

// readLocked is read of everything, under the Dataplane's lock: what the
// Read methods each return a part of.
func (d *Dataplane) readLocked() (kernel, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.read(nil)
}

// kernel is what read finds.
type kernel struct {
	st State
	// orphans are source NAT entries without a virtual server.
	orphans []Key
	filter  Filter
	tier2   Tier2
	cluster Tier2
}

// read reads the kernel; the real servers of virtual servers that
// withBackends rejects are not read (Sync skips foreign ones). withBackends
// is given the key and the VIPs bound to the link.
func (d *Dataplane) read(withBackends func(Key, map[netip.Addr]struct{}) bool) (k kernel, err error) {
	k.st, k.filter, k.tier2, k.cluster = NewState(), NewFilter(), Tier2{}, Tier2{}
	if err := d.readVIPs(k.st.VIPs); err != nil {
		return k, err
	}
	if err := d.readServices(k.st, withBackends); err != nil {
		return k, err
	}
	if d.snat {
		if k.orphans, err = d.readSNAT(k.st); err != nil {
			return k, err
		}
	}
	if d.guard {
		if k.filter, err = d.nft.readFilter(); err != nil {
			return k, fmt.Errorf("VIP filter: %w", err)
		}
	}
	if k.tier2, err = d.tier2.read(d.nft); err != nil {
		return k, err
	}
	if k.cluster, err = d.cluster.read(d.nft); err != nil {
		return k, err
	}
	return k, nil
}

// readVIPs adds the addresses bound to the dummy link to vips.
func (d *Dataplane) readVIPs(vips map[netip.Addr]struct{}) error {
	addrs, err := dump("addresses of "+d.name, func() ([]netlink.Addr, error) {
		return d.nl.AddrList(d.link, netlink.FAMILY_ALL)
	})
	if err != nil {
		return err
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.IsLinkLocalUnicast() {
			continue // the kernel's own IPv6 link-local address
		}
		vips[ip.Unmap()] = struct{}{}
	}
	return nil
}

// readServices adds the kernel's virtual servers to st.Services, with their
// real servers when withBackends (nil: always) accepts them. st.VIPs must
// be read already.
func (d *Dataplane) readServices(st State, withBackends func(Key, map[netip.Addr]struct{}) bool) error {
	svcs, err := d.ipvs.GetServices()
	if err != nil {
		return fmt.Errorf("list IPVS services: %w", err)
	}
	return d.readListed(st, svcs, withBackends)
}

// readListed is readServices for the virtual servers svcs, as listed: one
// deleted since the list (by hand, while a Sync reads) is left out, not
// read as a virtual server without real servers.
func (d *Dataplane) readListed(st State, svcs []*libipvs.Service, withBackends func(Key, map[netip.Addr]struct{}) bool) error {
	for _, ks := range svcs {
		svc, ok := serviceFrom(ks)
		if !ok {
			continue
		}
		if withBackends == nil || withBackends(svc.Key(), st.VIPs) {
			var err error
			svc.Backends, err = d.readBackends(ks, svc.Key())
			if errors.Is(err, errGone) {
				continue
			}
			if err != nil {
				return err
			}
		}
		st.Services[svc.Key()] = svc.Normalize()
	}
	return nil
}

// errGone is readBackends' answer for a virtual server that no longer
// exists.
var errGone = errors.New("virtual server gone")

// serviceFrom converts a kernel virtual server, without its real servers.
// It reports false for those vipcast never owns: firewall-mark services and
// addresses it cannot parse.
func serviceFrom(ks *libipvs.Service) (Service, bool) {
	if ks.FWMark != 0 {
		return Service{}, false // firewall-mark services are never vipcast's
	}
	vip, ok := netip.AddrFromSlice(ks.Address)
	if !ok {
		return Service{}, false
	}
	svc := Service{
		VIP:       vip.Unmap(),
		Port:      ks.Port,
		Protocol:  Protocol(ks.Protocol),
		Scheduler: ks.SchedName,
		Flags:     ks.Flags & userFlags,
	}
	if ks.Flags&FlagPersistent != 0 {
		svc.Persistent = ks.Timeout
	}
	return svc, true
}

// readBackends reads the real servers of the kernel virtual server ks,
// whose key is k.
func (d *Dataplane) readBackends(ks *libipvs.Service, k Key) ([]Backend, error) {
	dests, err := d.ipvs.GetDestinations(ks)
	if err != nil {
		return nil, fmt.Errorf("list real servers of %s: %w", k, err)
	}
	if len(dests) == 0 {
		// The kernel dumps no real servers, without an error, for a
		// virtual server that does not exist: ask for it, or a Sync
		// would add real servers to nothing (ESRCH) and never call it
		// lost.
		if _, err := d.ipvs.GetService(ks); isNotFound(err) {
			return nil, errGone
		} else if err != nil {
			return nil, fmt.Errorf("read virtual server %s: %w", k, err)
		}
	}
	var bs []Backend
	for _, kd := range dests {
		a, ok := netip.AddrFromSlice(kd.Address)
		if !ok {
			continue
		}
		bs = append(bs, Backend{Addr: a.Unmap(), Port: kd.Port, Weight: kd.Weight,
			Tunnel: kd.ConnectionFlags&libipvs.ConnectionFlagFwdMask == libipvs.ConnectionFlagTunnel})
	}
	return bs, nil
}

// readSNAT marks the virtual servers of st whose connections are
// masqueraded and returns the source NAT entries without a virtual server.
func (d *Dataplane) readSNAT(st State) (orphans []Key, err error) {
	keys, err := d.nft.readKeys(d.nft.snat)
	if err != nil {
		return nil, err
	}
	for k := range keys {
		if svc, ok := st.Services[k]; ok {
			svc.SNAT = true
			st.Services[k] = svc
		} else {
			orphans = append(orphans, k)
		}
	}
	return orphans, nil
}
