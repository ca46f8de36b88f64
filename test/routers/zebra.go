package routers

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/user"
	"strconv"
	"time"

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

// KernelRoutes returns the BGP routes zebra installed in the kernel of
// f's namespace, with their next hops (several for ECMP). It needs
// FRRConfig.Zebra.
func (f *FRR) KernelRoutes(family Family) (map[netip.Prefix][]netip.Addr, error) {
	flag := "-4"
	if family == IPv6 {
		flag = "-6"
	}
	argv := []string{"ip", "-j", flag}
	if f.Netns != "" {
		argv = append(argv, "-n", f.Netns)
	}
	out, err := run(5*time.Second, append(argv, "route", "show", "proto", "bgp")...)
	if err != nil {
		return nil, err
	}
	var routes []struct {
		Dst      string `json:"dst"`
		Gateway  string `json:"gateway"`
		Nexthops []struct {
			Gateway string `json:"gateway"`
		} `json:"nexthops"`
	}
	if err := json.Unmarshal(out, &routes); err != nil {
		return nil, fmt.Errorf("ip route: %w", err)
	}
	res := make(map[netip.Prefix][]netip.Addr, len(routes))
	for _, r := range routes {
		p, err := netip.ParsePrefix(r.Dst)
		if err != nil {
			a, aerr := netip.ParseAddr(r.Dst)
			if aerr != nil {
				return nil, fmt.Errorf("ip route dst %q: %w", r.Dst, err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		gws := []string{r.Gateway}
		if r.Gateway == "" {
			gws = gws[:0]
			for _, nh := range r.Nexthops {
				gws = append(gws, nh.Gateway)
			}
		}
		for _, g := range gws {
			if a, err := netip.ParseAddr(g); err == nil {
				res[p] = append(res[p], a)
			}
		}
	}
	return res, nil
}
