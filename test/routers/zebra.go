package routers

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/user"
	"strconv"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vipcast/vipcast/test/harness"
)

// frrRunDir makes a run directory owned by user frr, outside t.TempDir()
// (whose parents only root may enter), removed at t.Cleanup.
func frrRunDir(t harness.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vipcast-frr-")
	if err != nil {
		t.Fatalf("frr: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if u, err := user.Lookup("frr"); err == nil {
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatalf("frr: %v", err)
		}
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatalf("frr: %v", err)
	}
	return dir
}

// startZebra starts zebra for f inside f's namespace.
func (f *FRR) startZebra(t harness.T) {
	t.Helper()
	requireBinaries(t, FRRZebra)
	if err := os.WriteFile(f.Dir+"/zebra.conf", nil, 0o644); err != nil {
		t.Fatalf("zebra: %v", err)
	}
	f.zebra = startDaemon(t, "zebra "+f.Netns, f.Dir+"/zebra.log", func() bool {
		_, err := os.Stat(f.zserv())
		return err == nil
	}, f.inNetns(FRRZebra,
		"-f", f.Dir+"/zebra.conf", "-i", f.Dir+"/zebra.pid", "-z", f.zserv(), "--vty_socket", f.Dir, "-A", "127.0.0.1", "-P", "0")...)
}

func (f *FRR) zserv() string { return f.Dir + "/zserv.api" }

// inNetns prefixes argv with "ip netns exec NS" when f runs in a namespace.
func (f *FRR) inNetns(argv ...string) []string {
	if f.Netns == "" {
		return argv
	}
	return append([]string{"ip", "netns", "exec", f.Netns}, argv...)
}

// KernelRoutes returns the BGP routes zebra installed in the main table
// of the kernel of f's namespace, with their next hops (several for
// ECMP). It needs FRRConfig.Zebra. It reads them over netlink, in the
// namespace, without starting a process: an `ip -n` per read (tests poll
// every 10 ms) switched mount namespaces each time, and on a loaded host
// one such read took over 5 s, which made a route's removal look seconds
// late. A dump the kernel marks interrupted (the routes changed while it
// answered) is read again.
func (f *FRR) KernelRoutes(family Family) (map[netip.Prefix][]netip.Addr, error) {
	fam := unix.AF_INET
	if family == IPv6 {
		fam = unix.AF_INET6
	}
	h, err := f.netlinkHandle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	filter := &netlink.Route{Protocol: unix.RTPROT_BGP, Table: unix.RT_TABLE_MAIN}
	var routes []netlink.Route
	for attempt := 1; ; attempt++ {
		routes, err = h.RouteListFiltered(fam, filter, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err == nil {
			break
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) || attempt == 5 {
			return nil, fmt.Errorf("routes of %s: %w", f.namespaceName(), err)
		}
	}
	res := make(map[netip.Prefix][]netip.Addr, len(routes))
	for _, r := range routes {
		if r.Dst == nil {
			continue
		}
		a, ok := netip.AddrFromSlice(r.Dst.IP)
		if !ok {
			continue
		}
		bits, _ := r.Dst.Mask.Size()
		p := netip.PrefixFrom(a.Unmap(), bits)
		gws := []net.IP{r.Gw}
		if r.Gw == nil {
			gws = gws[:0]
			for _, nh := range r.MultiPath {
				gws = append(gws, nh.Gw)
			}
		}
		for _, g := range gws {
			if a, ok := netip.AddrFromSlice(g); ok {
				res[p] = append(res[p], a.Unmap())
			}
		}
	}
	return res, nil
}

// netlinkHandle opens a netlink handle in f's namespace (the caller's
// without one).
func (f *FRR) netlinkHandle() (*netlink.Handle, error) {
	if f.Netns == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("netlink: %w", err)
		}
		return h, nil
	}
	ns, err := netns.GetFromName(f.Netns)
	if err != nil {
		return nil, fmt.Errorf("namespace %s: %w", f.Netns, err)
	}
	defer func() { _ = ns.Close() }()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", f.Netns, err)
	}
	return h, nil
}

// namespaceName names f's namespace for errors.
func (f *FRR) namespaceName() string {
	if f.Netns == "" {
		return "the host namespace"
	}
	return "namespace " + f.Netns
}
