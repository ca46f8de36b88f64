package routers

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vipcast/vipcast/test/proc"

	"github.com/vipcast/vipcast/test/harness"
)

// FRR binaries, as installed by Debian's frr package.
const (
	FRRBgpd  = "/usr/lib/frr/bgpd"
	FRRZebra = "/usr/lib/frr/zebra"
	Vtysh    = "vtysh"
)

// Family selects an address family in queries.
type Family string

const (
	// IPv4 is IPv4 unicast.
	IPv4 Family = "ipv4"
	// IPv6 is IPv6 unicast.
	IPv6 Family = "ipv6"
)

// FRRConfig configures a bgpd instance.
type FRRConfig struct {
	// ASN is the router's ASN (65000 when 0).
	ASN uint32
	// RouterID is the BGP identifier (ListenAddress when unset).
	RouterID netip.Addr
	// ListenAddress is the loopback address bgpd listens on (127.0.0.1
	// when unset). Give each router of a test its own address.
	ListenAddress netip.Addr
	// Neighbors are the speakers that may connect. bgpd only listens
	// (passive): speakers open the sessions.
	Neighbors []FRRNeighbor
	// GracefulRestart enables full graceful restart ("bgp
	// graceful-restart"); without it FRR is a graceful-restart helper,
	// its default.
	GracefulRestart bool
	// Networks are prefixes the router originates (network statements).
	Networks []netip.Prefix
	// Extra is appended to the "router bgp" block verbatim.
	Extra string

	// Netns, when set, runs the daemons in that network namespace (see
	// NewNetns; needs root). bgpd then listens on every address of the
	// namespace, on Port (179 when 0), and ListenAddress only names the
	// address speakers connect to.
	Netns string
	// Port is the listening port in a namespace; outside one a free port
	// is always chosen.
	Port int
	// Zebra also runs zebra, so that bgpd installs its best routes in the
	// namespace's kernel (see KernelRoutes). It requires Netns.
	Zebra bool
}

// FRRNeighbor is a neighbor of an FRR router.
type FRRNeighbor struct {
	// Address is the speaker's (source) address.
	Address netip.Addr
	// ASN is the speaker's ASN.
	ASN uint32
	// Password is the TCP MD5 password; empty for none.
	Password string
	// KeepaliveTime and HoldTime set "timers" when HoldTime is not zero.
	KeepaliveTime, HoldTime time.Duration
	// BFD, when set, runs a BFD session with the neighbor with these
	// timers (bfdd; requires FRRConfig.Netns and Zebra). bgpd drops the
	// BGP session when it goes down.
	BFD *BFD
	// EBGPMultiHop, when above 1, sets "ebgp-multihop" and "update-source"
	// (ListenAddress): the neighbor is not directly connected, and its
	// BFD session is multihop (RFC 5883).
	EBGPMultiHop int
}

// FRR is a running bgpd.
type FRR struct {
	// Dir is the instance's directory (config, pid, vty socket, log).
	Dir string
	// Address and Port are where bgpd listens.
	Address netip.Addr
	Port    int
	// ASN is the router's ASN.
	ASN uint32
	// Netns is the namespace the daemons run in ("" for the test's).
	Netns string

	daemon, zebra, bfdd *proc.Process
	neighbors           []FRRNeighbor
}

// StartFRR starts bgpd on loopback with cfg, waits until it answers vtysh
// and registers its shutdown with t.Cleanup.
func StartFRR(t harness.T, cfg FRRConfig) *FRR {
	t.Helper()
	requireBinaries(t, FRRBgpd, Vtysh)
	if cfg.ASN == 0 {
		cfg.ASN = 65000
	}
	if !cfg.ListenAddress.IsValid() {
		cfg.ListenAddress = netip.MustParseAddr("127.0.0.1")
	}
	if !cfg.RouterID.IsValid() {
		cfg.RouterID = cfg.ListenAddress
	}
	if cfg.Zebra && cfg.Netns == "" {
		t.Fatal("frr: Zebra requires Netns: zebra would change the test machine's routes")
	}
	cfg.checkBFD(t)
	var dir string
	var port int
	var err error
	if cfg.Netns == "" {
		// bgpd runs with -S (no switch to user frr), so root's private
		// temporary directory will do.
		dir = t.TempDir()
		if port, err = freePort(cfg.ListenAddress.String()); err != nil {
			t.Fatalf("frr: %v", err)
		}
	} else {
		dir = frrRunDir(t)
		port = cfg.Port
		if port == 0 {
			port = 179
		}
	}
	f := &FRR{Dir: dir, Address: cfg.ListenAddress, Port: port, ASN: cfg.ASN, Netns: cfg.Netns, neighbors: cfg.Neighbors}
	conf := filepath.Join(dir, "bgpd.conf")
	if err := os.WriteFile(conf, []byte(frrConfig(cfg)), 0o644); err != nil {
		t.Fatalf("frr: %v", err)
	}
	// vtysh reads vtysh.conf from --config_dir; an empty one silences it.
	if err := os.WriteFile(filepath.Join(dir, "vtysh.conf"), nil, 0o644); err != nil {
		t.Fatalf("frr: %v", err)
	}
	args := []string{"-S", "-p", itoa(port), "-P", "0", "-f", conf, "-i", filepath.Join(dir, "bgpd.pid"), "--vty_socket", dir}
	switch {
	case cfg.Zebra:
		f.startZebra(t)
		if cfg.hasBFD() {
			f.startBfdd(t, cfg)
		}
		args = append(args, "-z", f.zserv())
	case cfg.Netns != "":
		args = append(args, "-Z", "-n")
	default:
		// -l implies -n: no kernel routes.
		args = append(args, "-Z", "-l", cfg.ListenAddress.String())
	}
	f.daemon = startDaemon(t, "bgpd "+cfg.ListenAddress.String(), filepath.Join(dir, "bgpd.log"), func() bool {
		_, err := f.Vtysh("show bgp summary json")
		return err == nil
	}, f.inNetns(append([]string{FRRBgpd}, args...)...)...)
	return f
}

// frrConfig renders bgpd.conf.
func frrConfig(cfg FRRConfig) string {
	var b strings.Builder
	fmt.Fprintf(&b, "frr defaults datacenter\nhostname frr-%s\nlog stdout informational\n!\n", cfg.ListenAddress)
	fmt.Fprintf(&b, "router bgp %d\n", cfg.ASN)
	fmt.Fprintf(&b, " bgp router-id %s\n", cfg.RouterID)
	b.WriteString(" no bgp ebgp-requires-policy\n no bgp network import-check\n bgp bestpath as-path multipath-relax\n")
	if cfg.GracefulRestart {
		b.WriteString(" bgp graceful-restart\n")
	}
	for _, n := range cfg.Neighbors {
		fmt.Fprintf(&b, " neighbor %s remote-as %d\n neighbor %s passive\n", n.Address, n.ASN, n.Address)
		if n.Password != "" {
			fmt.Fprintf(&b, " neighbor %s password %s\n", n.Address, n.Password)
		}
		if n.HoldTime > 0 {
			fmt.Fprintf(&b, " neighbor %s timers %d %d\n", n.Address, int(n.KeepaliveTime.Seconds()), int(n.HoldTime.Seconds()))
		}
		if n.EBGPMultiHop > 1 {
			fmt.Fprintf(&b, " neighbor %s ebgp-multihop %d\n neighbor %s update-source %s\n", n.Address, n.EBGPMultiHop, n.Address, cfg.ListenAddress)
		}
	}
	for i, n := range cfg.Neighbors {
		if n.BFD != nil {
			fmt.Fprintf(&b, " neighbor %s bfd\n neighbor %s bfd profile %s\n", n.Address, n.Address, bfdProfile(i))
		}
	}
	for _, af := range []Family{IPv4, IPv6} {
		fmt.Fprintf(&b, " address-family %s unicast\n  maximum-paths 8\n  maximum-paths ibgp 8\n", af)
		for _, n := range cfg.Neighbors {
			fmt.Fprintf(&b, "  neighbor %s activate\n", n.Address)
		}
		for _, p := range cfg.Networks {
			if p.Addr().Is4() == (af == IPv4) {
				fmt.Fprintf(&b, "  network %s\n", p)
			}
		}
		b.WriteString(" exit-address-family\n")
	}
	b.WriteString(cfg.Extra)
	b.WriteString("!\n")
	return b.String()
}

// Kill kills bgpd at once (SIGKILL), as a crash would.
func (f *FRR) Kill() { f.daemon.Kill() }

// Vtysh runs vtysh commands against this instance and returns the output.
func (f *FRR) Vtysh(cmds ...string) (string, error) {
	argv := []string{Vtysh, "--vty_socket", f.Dir, "--config_dir", f.Dir}
	for _, c := range cmds {
		argv = append(argv, "-c", c)
	}
	out, err := run(10*time.Second, argv...)
	return string(out), err
}

// VtyshJSON runs one vtysh command (ending in "json") and decodes its
// output into v.
func (f *FRR) VtyshJSON(cmd string, v any) error {
	out, err := f.Vtysh(cmd)
	if err != nil {
		return err
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		return fmt.Errorf("vtysh %q: %w: %s", cmd, err, tail([]byte(out), 5))
	}
	return nil
}

// Path is one path of a prefix in a router's table.
type Path struct {
	// NextHop is the path's next hop (the global one for IPv6).
	NextHop netip.Addr
	// Peer is the address of the neighbor the path came from (unset for
	// local paths).
	Peer netip.Addr
	// ASPath is the AS path as the router prints it ("" when empty).
	ASPath string
	// Communities are RFC 1997 communities as printed ("64512:100",
	// "no-export").
	Communities []string
	// LargeCommunities are RFC 8092 communities ("64512:1:2").
	LargeCommunities []string
	// LocalPref is the LOCAL_PREF attribute, when received.
	LocalPref *uint32
	// Best marks the best path.
	Best bool
}

// frrPath is a path in FRR's "show bgp AFI unicast PREFIX json" output.
type frrPath struct {
	ASPath struct {
		String string `json:"string"`
	} `json:"aspath"`
	Community *struct {
		String string `json:"string"`
	} `json:"community"`
	LargeCommunity *struct {
		String string `json:"string"`
	} `json:"largeCommunity"`
	LocPrf   *uint32 `json:"locPrf"`
	BestPath *struct {
		Overall bool `json:"overall"`
	} `json:"bestpath"`
	Nexthops []struct {
		IP    string `json:"ip"`
		Scope string `json:"scope"`
	} `json:"nexthops"`
	Peer struct {
		PeerID string `json:"peerId"`
	} `json:"peer"`
}

func (p frrPath) toPath() Path {
	out := Path{ASPath: p.ASPath.String, LocalPref: p.LocPrf, Best: p.BestPath != nil && p.BestPath.Overall}
	for _, nh := range p.Nexthops {
		if a, err := netip.ParseAddr(nh.IP); err == nil && (nh.Scope == "" || nh.Scope == "global") {
			out.NextHop = a
			break
		}
	}
	out.Peer, _ = netip.ParseAddr(p.Peer.PeerID)
	if p.Community != nil {
		out.Communities = strings.Fields(p.Community.String)
	}
	if p.LargeCommunity != nil {
		out.LargeCommunities = strings.Fields(p.LargeCommunity.String)
	}
	return out
}

// Routes returns the router's BGP table for family, with every path's
// attributes. It runs one vtysh command per prefix (FRR 8.4 has no table
// view with communities), so keep it for small tables; use PrefixCount to
// follow large ones.
func (f *FRR) Routes(family Family) (map[netip.Prefix][]Path, error) {
	var table struct {
		Routes map[string]json.RawMessage `json:"routes"`
	}
	if err := f.VtyshJSON(fmt.Sprintf("show bgp %s unicast json", family), &table); err != nil {
		return nil, err
	}
	out := make(map[netip.Prefix][]Path, len(table.Routes))
	var cmds []string
	for k := range table.Routes {
		cmds = append(cmds, fmt.Sprintf("show bgp %s unicast %s json", family, k))
	}
	for len(cmds) > 0 {
		n := min(len(cmds), 100)
		text, err := f.Vtysh(cmds[:n]...)
		if err != nil {
			return nil, err
		}
		cmds = cmds[n:]
		dec := json.NewDecoder(strings.NewReader(text))
		for dec.More() {
			var d struct {
				Prefix string    `json:"prefix"`
				Paths  []frrPath `json:"paths"`
			}
			if err := dec.Decode(&d); err != nil {
				return nil, fmt.Errorf("frr route details: %w", err)
			}
			p, err := netip.ParsePrefix(d.Prefix)
			if err != nil {
				return nil, fmt.Errorf("frr route %q: %w", d.Prefix, err)
			}
			for _, fp := range d.Paths {
				out[p] = append(out[p], fp.toPath())
			}
		}
	}
	return out, nil
}

// NeighborState is a neighbor's session as FRR sees it.
type NeighborState struct {
	// State is FRR's BGP state (Idle, Connect, Active, OpenSent,
	// OpenConfirm, Established).
	State string
	// PfxRcd is the number of prefixes accepted from the neighbor over
	// both families.
	PfxRcd int
	// EstablishedCount is how many times the session was established,
	// DroppedCount how many times it dropped.
	EstablishedCount, DroppedCount int
	// UptimeMsec is the time since the session was established.
	UptimeMsec int64
	// UpdatesRecv counts the UPDATE messages received from the neighbor
	// (FRR's messageStats.updatesRecv).
	UpdatesRecv int
}

// Neighbor returns the state of the session with the neighbor at addr.
func (f *FRR) Neighbor(addr netip.Addr) (NeighborState, error) {
	var m map[string]struct {
		State       string `json:"bgpState"`
		Established int    `json:"connectionsEstablished"`
		Dropped     int    `json:"connectionsDropped"`
		UptimeMsec  int64  `json:"bgpTimerUpMsec"`
		Stats       struct {
			UpdatesRecv int `json:"updatesRecv"`
		} `json:"messageStats"`
		AFI map[string]struct {
			Accepted int `json:"acceptedPrefixCounter"`
		} `json:"addressFamilyInfo"`
	}
	if err := f.VtyshJSON(fmt.Sprintf("show bgp neighbors %s json", addr), &m); err != nil {
		return NeighborState{}, err
	}
	n, ok := m[addr.String()]
	if !ok {
		return NeighborState{}, fmt.Errorf("frr has no neighbor %s", addr)
	}
	s := NeighborState{State: n.State, EstablishedCount: n.Established, DroppedCount: n.Dropped, UptimeMsec: n.UptimeMsec, UpdatesRecv: n.Stats.UpdatesRecv}
	for _, af := range n.AFI {
		s.PfxRcd += af.Accepted
	}
	return s, nil
}

// PrefixCount returns the number of prefixes accepted from the neighbor at
// addr in both families; it is cheap enough to poll.
func (f *FRR) PrefixCount(addr netip.Addr) (int, error) {
	var sum map[string]struct {
		Peers map[string]struct {
			PfxRcd int `json:"pfxRcd"`
		} `json:"peers"`
	}
	if err := f.VtyshJSON("show bgp summary json", &sum); err != nil {
		return 0, err
	}
	n := 0
	for _, af := range sum {
		n += af.Peers[addr.String()].PfxRcd
	}
	return n, nil
}

// WaitEstablished waits until the session with addr is Established.
func (f *FRR) WaitEstablished(addr netip.Addr, timeout time.Duration) error {
	var last NeighborState
	var err error
	if waitFor(timeout, func() bool {
		last, err = f.Neighbor(addr)
		return err == nil && last.State == "Established"
	}) {
		return nil
	}
	// err is nil when the neighbor exists but is not Established: %v, not %w.
	return fmt.Errorf("frr %s: session with %s not established after %s (state %q, err %v)", f.Address, addr, timeout, last.State, err) //nolint:errorlint // see above
}

func tail(b []byte, lines int) string {
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
