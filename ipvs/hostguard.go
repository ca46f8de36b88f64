package ipvs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The host guard: vipcast's own listeners only for those who need them.
//
// The speaker listens on the node for BFD (UDP 3784 single hop, 4784
// multihop, on the addresses its sessions use) and for /metrics and
// /healthz (TCP, --metrics-bind-address). The connection sync and the
// tunnels have the tunnel guard (tunnelguard.go); these two have the chain
// "host-guard" of each of vipcast's tables (type filter, hook input,
// priority filter - 10) and a set "bfd-peers" of the routers the node runs
// BFD sessions with (from the speaker: SetBFDPeers):
//
//	udp dport { 3784, 4784 } ip saddr != @bfd-peers counter drop
//	ip daddr <metrics address> tcp dport <metrics port> fib saddr type local accept
//	ip daddr <metrics address> tcp dport <metrics port> ip saddr <each allowed prefix> accept
//	ip daddr <metrics address> tcp dport <metrics port> counter drop
//
// (ip6: ip6 saddr, ip6 daddr). The BFD rule is there while the set has
// elements: a node without BFD sessions does not listen on those ports,
// and what else may listen there is not vipcast's to filter. The metrics
// rules are there when the metrics address is not a loopback address and
// no allowed prefix is a /0 of its family. BFD still checks every packet
// in user space (RFC 5880 §6.8.6, the TTL, the authentication); the guard
// drops a stranger's before it costs a system call, and counts it.
const (
	hostGuardChain = "host-guard"
	bfdPeersSet    = "bfd-peers"
)

// BFD's UDP ports (RFC 5881, RFC 5883); the bfd package's SingleHopPort
// and MultihopPort.
const (
	bfdSingleHopPort = 3784
	bfdMultihopPort  = 4784
)

// The rules' user data: what each drop counts, for the metric of the
// guards' drops (guardmetrics.go).
const (
	dropTunnel        = "tunnel"
	dropRelay         = "relay"
	dropSyncMulticast = "sync-multicast"
	dropBFD           = "bfd"
	dropMetrics       = "metrics"
)

// HostGuard is what may reach the speaker's metrics listener on the node.
// The BFD peers come later, from the speaker (Dataplane.SetBFDPeers).
type HostGuard struct {
	// Metrics is the address and port of /metrics and /healthz (not
	// valid: no listener, no rule).
	Metrics netip.AddrPort
	// MetricsSources are the prefixes allowed to the metrics port beyond
	// the node's own addresses (a /0 leaves the port open).
	MetricsSources []netip.Prefix
}

// check refuses what the guard cannot express.
func (g HostGuard) check() error {
	for _, p := range g.MetricsSources {
		if !p.IsValid() || p != p.Masked() {
			return fmt.Errorf("host guard: metrics source %v is not a prefix with its host bits zero (such as %v)", p, p.Masked())
		}
	}
	return nil
}

// metricsRules are the metrics listener's accept and drop rules for the
// table of family i, none when it needs none.
func (g HostGuard) metricsRules(i int) [][]expr.Any {
	a := g.Metrics.Addr().Unmap()
	if !g.Metrics.IsValid() || a.IsLoopback() || a.IsUnspecified() || famIndex(a) != i {
		return nil
	}
	var prefixes []netip.Prefix
	for _, p := range g.MetricsSources {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmappedBits(p))
		if famIndex(p.Addr()) != i {
			continue
		}
		if p.Bits() == 0 {
			return nil
		}
		prefixes = append(prefixes, p)
	}
	saddrOff, daddrOff := uint32(12), uint32(16)
	if a.Is6() {
		saddrOff, daddrOff = 8, 24
	}
	addrLen := uint32(a.BitLen() / 8) //nolint:gosec // 32 or 128
	listener := []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: daddrOff, Len: addrLen},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, g.Metrics.Port())},
	}
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	rules := [][]expr.Any{append(slices.Clone(listener),
		// The node itself: the kubelet's probes, a scraper on the host.
		&expr.Fib{Register: 1, FlagSADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
		accept)}
	for _, p := range prefixes {
		rules = append(rules, concat(listener, prefixMatch(saddrOff, p), []expr.Any{accept}))
	}
	return append(rules, append(listener, &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop}))
}

// unmappedBits is how many of p's bits the IPv4-mapped IPv6 prefix adds
// (96 for ::ffff:a.b.c.d/n, else 0).
func unmappedBits(p netip.Prefix) int {
	if p.Addr().Is4In6() {
		return 96
	}
	return 0
}

// prefixMatch matches a packet whose address at offset off of the network
// header (source or destination) is in p.
func prefixMatch(off uint32, p netip.Prefix) []expr.Any {
	n := uint32(p.Addr().BitLen() / 8) //nolint:gosec // 4 or 16
	mask := make([]byte, n)
	for b := range p.Bits() {
		mask[b/8] |= 0x80 >> (b % 8)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

// setupHostGuard queues, in table t (family i), the set of BFD peers (kept
// with its elements when it exists) and the guard chain with its rules. It
// returns the set and the peers it holds.
func (n *nftTables) setupHostGuard(i int, t *nftables.Table, g HostGuard) (*nftables.Set, map[netip.Addr]struct{}, error) {
	set, have, err := n.addrSet(i, t, bfdPeersSet)
	if err != nil {
		return nil, nil, err
	}
	n.queueHostGuardRules(i, t, g, set, len(have) > 0)
	return set, have, nil
}

// queueHostGuardRules queues the host guard chain of table t (family i)
// with its rules afresh: the BFD rule only with bfd.
func (n *nftTables) queueHostGuardRules(i int, t *nftables.Table, g HostGuard, set *nftables.Set, bfd bool) {
	accept := nftables.ChainPolicyAccept
	ch := n.conn.AddChain(&nftables.Chain{
		Name: hostGuardChain, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityRef(-10), Policy: &accept,
	})
	n.conn.FlushChain(ch)
	if bfd {
		saddrOff := uint32(12)
		if tier2Families[i].addrLen == 16 {
			saddrOff = 8
		}
		for _, port := range []uint16{bfdSingleHopPort, bfdMultihopPort} {
			n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: []byte(dropBFD), Exprs: []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: saddrOff, Len: tier2Families[i].addrLen},
				&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: true},
				&expr.Counter{},
				&expr.Verdict{Kind: expr.VerdictDrop},
			}})
		}
	}
	for _, r := range g.metricsRules(i) {
		n.conn.AddRule(&nftables.Rule{Table: t, Chain: ch, UserData: []byte(dropMetrics), Exprs: r})
	}
}

// setupHostGuards sets up both tables' host guards in one transaction.
func (n *nftTables) setupHostGuards(g HostGuard) error {
	if err := g.check(); err != nil {
		return err
	}
	var sets [2]*nftables.Set
	var have [2]map[netip.Addr]struct{}
	for i, t := range n.tables {
		var err error
		if sets[i], have[i], err = n.setupHostGuard(i, t, g); err != nil {
			return err
		}
	}
	if err := n.conn.Flush(); err != nil {
		if errors.Is(err, unix.ENOENT) {
			err = fmt.Errorf("%w (the kernel lacks an nftables expression the rules use: fib is module nft_fib_inet, loaded on first use unless module autoloading is off; then load nft_fib_ipv4 and nft_fib_ipv6 at boot, /etc/modules-load.d)", err)
		}
		return fmt.Errorf("nftables tables %s, host guard: %w", snatTable, err)
	}
	n.hostGuard, n.bfdSet, n.bfdHave = g, sets, have
	return nil
}

// setBFDPeers makes each family's set of BFD peers exactly the addresses
// of that family in peers, with the BFD rule in force whenever the set is
// not empty, in one transaction.
func (n *nftTables) setBFDPeers(peers []netip.Addr) error {
	return n.syncGuardSets("BFD peers", n.bfdSet, &n.bfdHave, peers, func(i int, set *nftables.Set, on bool) {
		n.queueHostGuardRules(i, n.tables[i], n.hostGuard, set, on)
	})
}

// SetBFDPeers makes the addresses the node takes BFD packets from (UDP
// 3784 and 4784; hostguard.go) exactly peers: the routers it runs BFD
// sessions with. While peers is empty the guard leaves those ports alone.
func (d *Dataplane) SetBFDPeers(peers []netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.nft == nil {
		return nil // no nftables (NoSNAT and NoFilter): no guard
	}
	return d.nft.setBFDPeers(peers)
}
