package routers

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vipcast/vipcast/test/proc"

	"github.com/vipcast/vipcast/test/harness"
)

// BIRD binaries, as installed by Debian's bird2 package.
const (
	BIRDBin  = "bird"
	BIRDCBin = "birdc"
)

// BIRDConfig configures a BIRD instance.
type BIRDConfig struct {
	// ASN is the router's ASN (65000 when 0).
	ASN uint32
	// RouterID is the router ID (ListenAddress when unset).
	RouterID netip.Addr
	// ListenAddress is the loopback address BIRD listens on (127.0.0.1
	// when unset).
	ListenAddress netip.Addr
	// Neighbors are the speakers that may connect; BIRD is passive.
	// Each gets a protocol named by BIRDNeighbor.Name.
	Neighbors []BIRDNeighbor
	// Export are prefixes BIRD originates (static blackhole routes
	// exported to every neighbor).
	Export []netip.Prefix
	// Leak is a number of IPv4 /24s, 20.0.0.0/24 and up, that BIRD sends
	// to every neighbor as well, like a router leaking a full table: the
	// static protocol LeakProtocol, which DisableProtocol withdraws. They
	// reach no kernel (bird.conf has no kernel protocol).
	Leak int
	// Netns, when set, runs bird in that network namespace (see NewNetns;
	// needs root); it then listens on Port (179 when 0) and ListenAddress
	// only names the address speakers connect to.
	Netns string
	// Port is the listening port in a namespace; outside one a free port
	// is always chosen.
	Port int
}

// LeakProtocol is the name of the static protocol holding
// BIRDConfig.Leak's routes.
const LeakProtocol = "leak"

// LeakPrefix returns the i-th prefix of BIRDConfig.Leak.
func LeakPrefix(i int) netip.Prefix {
	var a [4]byte
	binary.BigEndian.PutUint32(a[:], 20<<24+uint32(i)<<8) //nolint:gosec // i is a small count
	return netip.PrefixFrom(netip.AddrFrom4(a), 24)
}

// BIRDNeighbor is a BGP protocol of a BIRD router.
type BIRDNeighbor struct {
	// Name is the protocol name ("peer<index>" when empty).
	Name string
	// Address is the speaker's (source) address.
	Address netip.Addr
	// ASN is the speaker's ASN.
	ASN uint32
	// Password is the TCP MD5 password; empty for none.
	Password string
	// HoldTime is the hold time (BIRD's default 240 s when zero).
	HoldTime time.Duration
	// BFD, when set, runs BFD with the neighbor with these timers ("bfd
	// on"): multihop, as the BGP session is; BIRD drops the BGP session
	// when it goes down. It needs the port BFD uses (4784) free: run BIRD
	// in a namespace (Netns).
	BFD *BFD
}

// BIRD is a running bird daemon.
type BIRD struct {
	// Dir is the instance's directory (config, control socket, log).
	Dir string
	// Address and Port are where BIRD listens.
	Address netip.Addr
	Port    int
	// ASN is the router's ASN.
	ASN uint32

	ctl    string
	daemon *proc.Process
}

// StartBIRD starts bird on loopback with cfg, waits until birdc answers
// and registers its shutdown with t.Cleanup.
//
// Test next hops must be in 10.0.0.0/8 or fd00::/8: BIRD resolves BGP
// next hops recursively, through static routes for those prefixes.
func StartBIRD(t harness.T, cfg BIRDConfig) *BIRD {
	t.Helper()
	requireBinaries(t, BIRDBin, BIRDCBin)
	if cfg.ASN == 0 {
		cfg.ASN = 65000
	}
	if !cfg.ListenAddress.IsValid() {
		cfg.ListenAddress = netip.MustParseAddr("127.0.0.1")
	}
	if !cfg.RouterID.IsValid() {
		cfg.RouterID = cfg.ListenAddress
	}
	for i := range cfg.Neighbors {
		if cfg.Neighbors[i].Name == "" {
			cfg.Neighbors[i].Name = "peer" + itoa(i)
		}
	}
	dir := t.TempDir()
	port := cfg.Port
	if cfg.Netns == "" {
		var err error
		if port, err = freePort(cfg.ListenAddress.String()); err != nil {
			t.Fatalf("bird: %v", err)
		}
	} else if port == 0 {
		port = 179
	}
	b := &BIRD{Dir: dir, Address: cfg.ListenAddress, Port: port, ASN: cfg.ASN, ctl: filepath.Join(dir, "bird.ctl")}
	conf := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(conf, []byte(birdConfig(cfg, port)), 0o644); err != nil {
		t.Fatalf("bird: %v", err)
	}
	b.daemon = startDaemon(t, "bird "+cfg.ListenAddress.String(), filepath.Join(dir, "bird.log"), func() bool {
		_, err := b.Birdc("show status")
		return err == nil
	}, inNetns(cfg.Netns, BIRDBin, "-f", "-c", conf, "-s", b.ctl, "-P", filepath.Join(dir, "bird.pid"))...)
	return b
}

// inNetns prefixes argv with "ip netns exec NS" when ns is set.
func inNetns(ns string, argv ...string) []string {
	if ns == "" {
		return argv
	}
	return append([]string{"ip", "netns", "exec", ns}, argv...)
}

// Freeze stops bird (SIGSTOP), as a hung router; Thaw resumes it.
func (b *BIRD) Freeze() { b.daemon.Signal(syscall.SIGSTOP) }

// Thaw resumes a frozen bird.
func (b *BIRD) Thaw() { b.daemon.Signal(syscall.SIGCONT) }

// birdConfig renders bird.conf.
func birdConfig(cfg BIRDConfig, port int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "router id %s;\nlog stderr all;\nprotocol device {}\n", cfg.RouterID)
	// Static routes that make test next hops resolvable.
	b.WriteString("protocol static nh4 { ipv4; route 10.0.0.0/8 via \"lo\"; }\n")
	b.WriteString("protocol static nh6 { ipv6; route fd00::/8 via \"lo\"; }\n")
	var exp4, exp6 []string
	for _, p := range cfg.Export {
		if p.Addr().Is4() {
			exp4 = append(exp4, p.String())
		} else {
			exp6 = append(exp6, p.String())
		}
	}
	export := func(af string, l []string) string {
		if len(l) == 0 {
			return "none"
		}
		fmt.Fprintf(&b, "protocol static export%s { %s; ", af, af)
		for _, p := range l {
			fmt.Fprintf(&b, "route %s blackhole; ", p)
		}
		b.WriteString("}\n")
		return fmt.Sprintf("where proto = \"export%s\"", af)
	}
	e4, e6 := export("ipv4", exp4), export("ipv6", exp6)
	if cfg.Leak > 0 {
		fmt.Fprintf(&b, "protocol static %s { ipv4;\n", LeakProtocol)
		for i := range cfg.Leak {
			fmt.Fprintf(&b, "route %s blackhole;\n", LeakPrefix(i))
		}
		b.WriteString("}\n")
		if e4 == "none" {
			e4 = fmt.Sprintf("where proto = %q", LeakProtocol)
		} else {
			e4 += fmt.Sprintf(" || proto = %q", LeakProtocol)
		}
	}
	b.WriteString(birdBFDProtocol(cfg.Neighbors))
	for _, n := range cfg.Neighbors {
		fmt.Fprintf(&b, "protocol bgp %s {\n", n.Name)
		fmt.Fprintf(&b, "  local %s port %d as %d;\n", cfg.ListenAddress, port, cfg.ASN)
		fmt.Fprintf(&b, "  neighbor %s as %d;\n", n.Address, n.ASN)
		b.WriteString("  multihop;\n  passive on;\n  error wait time 1, 5;\n  connect delay time 1;\n")
		if n.HoldTime > 0 {
			fmt.Fprintf(&b, "  hold time %d;\n", int(n.HoldTime.Seconds()))
		}
		if n.Password != "" {
			fmt.Fprintf(&b, "  password %q;\n", n.Password)
		}
		if n.BFD != nil {
			b.WriteString("  bfd on;\n")
		}
		fmt.Fprintf(&b, "  ipv4 { import all; export %s; gateway recursive; };\n", e4)
		fmt.Fprintf(&b, "  ipv6 { import all; export %s; gateway recursive; };\n", e6)
		b.WriteString("}\n")
	}
	return b.String()
}

// birdBFDProtocol renders the bfd protocol with the timers of the first
// neighbor with BFD ("" when none): BIRD has one set of timers per kind of
// session, and the tests give every BFD neighbor the same.
func birdBFDProtocol(neighbors []BIRDNeighbor) string {
	for _, n := range neighbors {
		if n.BFD != nil {
			opts := fmt.Sprintf("min rx interval %d ms; min tx interval %d ms; multiplier %d;", n.BFD.MinRx.Milliseconds(), n.BFD.MinTx.Milliseconds(), n.BFD.Multiplier) +
				n.BFD.Auth.birdAuth()
			return fmt.Sprintf("protocol bfd {\n  multihop { %s };\n  interface \"*\" { %s };\n}\n", opts, opts)
		}
	}
	return ""
}

// DisableProtocol stops protocol name (its routes are withdrawn).
func (b *BIRD) DisableProtocol(name string) error {
	_, err := b.Birdc("disable", name)
	return err
}

// EnableProtocol starts protocol name again.
func (b *BIRD) EnableProtocol(name string) error {
	_, err := b.Birdc("enable", name)
	return err
}

// Kill kills bird at once (SIGKILL).
func (b *BIRD) Kill() { b.daemon.Kill() }

// Birdc runs one birdc command and returns its output.
func (b *BIRD) Birdc(cmd ...string) (string, error) {
	out, err := run(10*time.Second, append([]string{BIRDCBin, "-s", b.ctl}, cmd...)...)
	return string(out), err
}

// Routes returns BIRD's routes learned over BGP ("show route all"), both
// families, with their BGP attributes.
func (b *BIRD) Routes() (map[netip.Prefix][]Path, error) {
	out, err := b.Birdc("show", "route", "all")
	if err != nil {
		return nil, err
	}
	return parseBIRDRoutes(out)
}

// parseBIRDRoutes parses "show route all": a route line starts with the
// prefix (or with blanks for another route of the same prefix), followed
// by indented attribute lines.
func parseBIRDRoutes(out string) (map[netip.Prefix][]Path, error) {
	routes := map[netip.Prefix][]Path{}
	var cur netip.Prefix
	var path *Path
	var bgp bool
	flush := func() {
		if path != nil && bgp {
			routes[cur] = append(routes[cur], *path)
		}
		path, bgp = nil, false
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case trimmed == "" || strings.HasPrefix(line, "BIRD ") || strings.HasPrefix(line, "Table "):
			continue
		case !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "\t"):
			// "PREFIX  unicast [proto time from ADDR] * (100) [AS64512i]"
			flush()
			f := strings.Fields(line)
			p, err := netip.ParsePrefix(f[0])
			if err != nil {
				return nil, fmt.Errorf("bird route line %q: %w", line, err)
			}
			cur = p
			path = newBIRDPath(line)
		case strings.HasPrefix(line, " ") && strings.Contains(line, "[") && !strings.HasPrefix(trimmed, "BGP.") && !strings.HasPrefix(trimmed, "via"):
			// Another route of the same prefix.
			flush()
			path = newBIRDPath(line)
		case path != nil:
			key, val, _ := strings.Cut(trimmed, ":")
			val = strings.TrimSpace(val)
			switch key {
			case "Type":
				bgp = strings.HasPrefix(val, "BGP")
			case "BGP.next_hop":
				// IPv6 may list a link-local address after the global one.
				if a, err := netip.ParseAddr(strings.Fields(val)[0]); err == nil {
					path.NextHop = a
				}
			case "BGP.as_path":
				path.ASPath = val
			case "BGP.local_pref":
				if v, err := strconv.ParseUint(val, 10, 32); err == nil {
					lp := uint32(v)
					path.LocalPref = &lp
				}
			case "BGP.community":
				path.Communities = birdTuples(val)
			case "BGP.large_community":
				path.LargeCommunities = birdTuples(val)
			}
		}
	}
	flush()
	return routes, sc.Err()
}

// newBIRDPath reads the peer address and best flag of a route line.
func newBIRDPath(line string) *Path {
	p := &Path{Best: strings.Contains(line, "] *")}
	if _, after, ok := strings.Cut(line, " from "); ok {
		addr, _, _ := strings.Cut(after, "]")
		p.Peer, _ = netip.ParseAddr(strings.TrimSpace(addr))
	}
	return p
}

// birdTuples turns "(64512,100) (65535,65281)" into
// ["64512:100", "65535:65281"] and "(64512, 1, 2)" into ["64512:1:2"].
func birdTuples(s string) []string {
	var out []string
	for _, part := range strings.Split(s, "(")[1:] {
		body, _, _ := strings.Cut(part, ")")
		fields := strings.Split(body, ",")
		for i := range fields {
			fields[i] = strings.TrimSpace(fields[i])
		}
		out = append(out, strings.Join(fields, ":"))
	}
	return out
}

// ProtocolState is a BGP protocol's state as BIRD shows it.
type ProtocolState struct {
	// State is the protocol state (up, start, down).
	State string
	// Info is the BGP state or last error (Established, Active,
	// "Error: Hold timer expired", ...).
	Info string
}

// Established reports whether the BGP session is up.
func (s ProtocolState) Established() bool { return s.Info == "Established" }

// Protocol returns the state of the protocol called name.
func (b *BIRD) Protocol(name string) (ProtocolState, error) {
	out, err := b.Birdc("show", "protocols", name)
	if err != nil {
		return ProtocolState{}, err
	}
	// Name Proto Table State Since Info...; Since is a time (and maybe a
	// date), Info the rest.
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != name {
			continue
		}
		s := ProtocolState{State: f[3]}
		if len(f) > 5 {
			rest := f[5:]
			if len(rest) > 0 && strings.Contains(rest[0], ":") && len(rest[0]) >= 8 {
				rest = rest[1:] // the time after a date
			}
			s.Info = strings.Join(rest, " ")
		}
		return s, nil
	}
	return ProtocolState{}, fmt.Errorf("bird has no protocol %s:\n%s", name, out)
}

// WaitEstablished waits until protocol name is Established.
func (b *BIRD) WaitEstablished(name string, timeout time.Duration) error {
	var last ProtocolState
	var err error
	if waitFor(timeout, func() bool {
		last, err = b.Protocol(name)
		return err == nil && last.Established()
	}) {
		return nil
	}
	// err is nil when the protocol exists but is not Established: %v, not %w.
	return fmt.Errorf("bird: protocol %s not established after %s (%+v, err %v)", name, timeout, last, err) //nolint:errorlint // see above
}

// BIRDBFDSession is one BFD session as "show bfd sessions" prints it.
type BIRDBFDSession struct {
	Address netip.Addr
	// Interface is "---" for a multihop session.
	Interface string
	// State is Up, Down, Init or AdminDown.
	State string
	// Since is when State was entered, as BIRD prints it: a session that
	// went down and came back shows a later time.
	Since string
	// Interval is the transmit interval, Timeout the detection time.
	Interval, Timeout time.Duration
}

// BFDSessions returns BIRD's BFD sessions.
func (b *BIRD) BFDSessions() ([]BIRDBFDSession, error) {
	out, err := b.Birdc("show", "bfd", "sessions")
	if err != nil {
		return nil, err
	}
	return parseBIRDBFD(out), nil
}

// parseBIRDBFD parses "show bfd sessions": under each protocol's name, a
// header and a line per session: address, interface, state, since (a time,
// maybe after a date), interval and timeout in seconds.
func parseBIRDBFD(out string) []BIRDBFDSession {
	var sessions []BIRDBFDSession
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		addr, err := netip.ParseAddr(f[0])
		if err != nil {
			continue
		}
		secs := func(v string) time.Duration {
			x, _ := strconv.ParseFloat(v, 64)
			return time.Duration(x * float64(time.Second))
		}
		sessions = append(sessions, BIRDBFDSession{Address: addr, Interface: f[1], State: f[2], Since: strings.Join(f[3:len(f)-2], " "),
			Interval: secs(f[len(f)-2]).Round(time.Millisecond), Timeout: secs(f[len(f)-1]).Round(time.Millisecond)})
	}
	return sessions
}

// WaitBFDUp waits until BIRD's BFD session with addr is Up.
func (b *BIRD) WaitBFDUp(addr netip.Addr, timeout time.Duration) error {
	var last []BIRDBFDSession
	var err error
	if waitFor(timeout, func() bool {
		last, err = b.BFDSessions()
		for _, s := range last {
			if s.Address == addr && s.State == "Up" {
				return true
			}
		}
		return false
	}) {
		return nil
	}
	return fmt.Errorf("bird: BFD session with %s not Up after %s (%+v, err %v)", addr, timeout, last, err) //nolint:errorlint // err may be nil
}
