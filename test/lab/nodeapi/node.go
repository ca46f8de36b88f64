package nodeapi

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"

	"github.com/vipcast/vipcast/ipvs"
)

// The node side: what both lab node agents (test/lab/node and
// test/lab/kubenode) run inside their VMs.

// Uplink configures eth0 with n.Addr, a default route via n.Gateway, and
// n.Routes to the other nodes' pod ranges.
func Uplink(nl *netlink.Handle, n NetFlags) error {
	addr, gateway, routes := n.Addr, n.Gateway, n.Routes
	eth0, err := nl.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0 (is the VM's NIC there?): %w", err)
	}
	if err := nl.AddrAdd(eth0, &netlink.Addr{IPNet: IPNet(addr)}); err != nil {
		return fmt.Errorf("eth0 address: %w", err)
	}
	if err := nl.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	if err := nl.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gateway.AsSlice()}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	for p, via := range routes {
		if err := nl.RouteAdd(&netlink.Route{Dst: IPNet(p), Gw: via.AsSlice()}); err != nil {
			return fmt.Errorf("route %s via %s: %w", p, via, err)
		}
	}
	return nil
}

// IPNet converts a prefix for netlink.
func IPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// StateHandler serves GET /state: the node's IPVS table and VIPs (read with
// vipcast's own ipvs package), its nftables tables, its links and its IPVS
// sync daemons.
func StateHandler(w http.ResponseWriter, _ *http.Request) {
	st, err := ReadState()
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(st)
}

// ReadState reads the node's State.
func ReadState() (State, error) {
	var out State
	// Read only: ipvs.New would create the link an uninstall removed.
	st, err := ipvs.ReadNode(ipvs.DefaultLinkName)
	if err != nil {
		return out, err
	}
	for _, s := range st.Services {
		svc := Service{Key: s.Key().String(), Scheduler: s.Scheduler}
		for _, b := range s.Backends {
			svc.Backends = append(svc.Backends, b.String())
		}
		slices.Sort(svc.Backends)
		out.Services = append(out.Services, svc)
	}
	slices.SortFunc(out.Services, func(a, b Service) int { return strings.Compare(a.Key, b.Key) })
	for v := range st.VIPs {
		out.VIPs = append(out.VIPs, v.String())
	}
	slices.Sort(out.VIPs)
	conn, err := nftables.New()
	if err != nil {
		return out, fmt.Errorf("nftables: %w", err)
	}
	tables, err := conn.ListTables()
	if err != nil {
		return out, fmt.Errorf("nftables tables: %w", err)
	}
	for _, t := range tables {
		out.Tables = append(out.Tables, fmt.Sprintf("%s %s", familyName(t.Family), t.Name))
	}
	slices.Sort(out.Tables)
	out.GuardDrops = guardDrops(conn, tables)
	links, err := netlink.LinkList()
	if err != nil {
		return out, fmt.Errorf("links: %w", err)
	}
	for _, l := range links {
		out.Links = append(out.Links, l.Attrs().Name)
	}
	slices.Sort(out.Links)
	daemons, err := ipvs.ReadSyncDaemons()
	if err != nil {
		return out, err
	}
	for _, d := range daemons {
		out.SyncDaemons = append(out.SyncDaemons, d.String())
	}
	slices.Sort(out.SyncDaemons)
	return out, nil
}

// guardDrops sums the packet counters of the rules of chain tunnel-guard
// in table ip vipcast that look a set up (the drop rules); -1 when there
// is none.
func guardDrops(conn *nftables.Conn, tables []*nftables.Table) int64 {
	for _, t := range tables {
		if t.Family != nftables.TableFamilyIPv4 || t.Name != "vipcast" {
			continue
		}
		rules, err := conn.GetRules(t, &nftables.Chain{Name: "tunnel-guard", Table: t})
		if err != nil {
			return -1
		}
		var sum int64 = -1
		for _, r := range rules {
			var lookup bool
			var packets int64 = -1
			for _, e := range r.Exprs {
				switch e := e.(type) {
				case *expr.Lookup:
					lookup = true
				case *expr.Counter:
					packets = int64(e.Packets) //nolint:gosec // a packet count
				}
			}
			if lookup && packets >= 0 {
				sum = max(sum, 0) + packets
			}
		}
		return sum
	}
	return -1
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyNetdev:
		return "netdev"
	default:
		return fmt.Sprintf("family-%d", f)
	}
}

// NetFlags are the flags of a node's network that both node agents take:
// -addr (eth0's address with its prefix), -gateway (the ToR), -pod-cidr
// and -routes (prefix=via,... to the other nodes' pod ranges).
type NetFlags struct {
	Addr    netip.Prefix
	Gateway netip.Addr
	PodCIDR netip.Prefix
	Routes  map[netip.Prefix]netip.Addr

	addr, gateway, podCIDR, routes string
}

// Register defines the flags on fs; podCIDR describes -pod-cidr.
func (n *NetFlags) Register(fs *flag.FlagSet, podCIDR string) {
	fs.StringVar(&n.addr, "addr", "", "address of eth0 (CIDR)")
	fs.StringVar(&n.gateway, "gateway", "", "default gateway (the ToR)")
	fs.StringVar(&n.podCIDR, "pod-cidr", "", podCIDR)
	fs.StringVar(&n.routes, "routes", "", "prefix=via,... routes to other nodes' pod ranges")
}

// Parse checks the flags' values once the FlagSet is parsed.
func (n *NetFlags) Parse() error {
	var err error
	if n.Addr, err = netip.ParsePrefix(n.addr); err != nil {
		return fmt.Errorf("-addr: %w", err)
	}
	if n.Gateway, err = netip.ParseAddr(n.gateway); err != nil {
		return fmt.Errorf("-gateway: %w", err)
	}
	if n.PodCIDR, err = netip.ParsePrefix(n.podCIDR); err != nil {
		return fmt.Errorf("-pod-cidr: %w", err)
	}
	n.Routes = map[netip.Prefix]netip.Addr{}
	for _, kv := range strings.Split(n.routes, ",") {
		if kv == "" {
			continue
		}
		p, v, ok := strings.Cut(kv, "=")
		pfx, err1 := netip.ParsePrefix(p)
		via, err2 := netip.ParseAddr(v)
		if !ok || err1 != nil || err2 != nil {
			return fmt.Errorf("-routes: %q is not prefix=address", kv)
		}
		n.Routes[pfx] = via
	}
	return nil
}
