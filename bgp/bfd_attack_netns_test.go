//go:build routing

package bgp_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vipcast/vipcast/bfd"
	"github.com/vipcast/vipcast/bgp"
	"github.com/vipcast/vipcast/test/netns"
	"github.com/vipcast/vipcast/test/routers"
)

// bfdSegment is a fabric segment for BFD attack tests (root only): a
// bridge in the test's namespace carrying the speaker's address, FRR
// (zebra, bgpd, bfdd) in a "tor" namespace, and an "attacker" namespace
// that is neither a node nor the router, on the same segment. The bridge
// floods every frame (ageing time 0, a hub), so that the attacker sees the
// BFD session's packets as a sniffer on the fabric would; every forged
// packet leaves from the attacker's namespace.
type bfdSegment struct {
	host, tor, attacker netip.Prefix
	attackerNS          *netns.NS
	frr                 *routers.FRR
	speaker             *bgp.GoBGP
	port                uint16
}

// newBFDSegment builds the segment 10.254.<octet>.0/24 and brings up BGP
// and BFD between the speaker and FRR: single hop, or multihop (eBGP
// multihop 2, RFC 5883) when multihop is set. Namespaces and links go when
// the test ends, even when it fails.
func newBFDSegment(t *testing.T, name string, octet int, multihop bool) *bfdSegment {
	t.Helper()
	netns.Require(t)
	seg := &bfdSegment{
		host:     pfx(fmt.Sprintf("10.254.%d.1/24", octet)),
		tor:      pfx(fmt.Sprintf("10.254.%d.2/24", octet)),
		attacker: pfx(fmt.Sprintf("10.254.%d.3/24", octet)),
		port:     bfd.SingleHopPort,
	}
	if multihop {
		seg.port = bfd.MultihopPort
	}
	br := fmt.Sprintf("vcbfdbr%d", octet%100)
	netns.Bridge(t, nil, br, seg.host.String())
	netns.IP(t, "link", "set", br, "type", "bridge", "ageing_time", "0")
	torNS := netns.New(t, name+"-tor")
	seg.attackerNS = netns.New(t, name+"-atk")
	torLink, atkLink := fmt.Sprintf("vcbfdt%d", octet%100), fmt.Sprintf("vcbfda%d", octet%100)
	netns.Veth(t, nil, torLink, "", torNS, "eth0", seg.tor.String())
	netns.Enslave(t, nil, torLink, br)
	netns.Veth(t, nil, atkLink, "", seg.attackerNS, "eth0", seg.attacker.String())
	netns.Enslave(t, nil, atkLink, br)

	timers := routers.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3}
	nbr := routers.FRRNeighbor{Address: seg.host.Addr(), ASN: localASN, HoldTime: 9 * time.Second, KeepaliveTime: 3 * time.Second, BFD: &timers}
	peer := bgp.Peer{Name: "tor", Address: seg.tor.Addr(), ASN: routerASN, LocalASN: localASN, SourceAddress: seg.host.Addr(),
		HoldTime: 9 * time.Second, KeepaliveTime: 3 * time.Second,
		BFD: &bgp.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3, Multihop: multihop}}
	if multihop {
		nbr.EBGPMultiHop = 2
		peer.EBGPMultiHop = 2
	}
	seg.frr = routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: seg.tor.Addr(), Netns: torNS.Name, Zebra: true,
		Neighbors: []routers.FRRNeighbor{nbr}})
	peer.Port = uint16(seg.frr.Port) //nolint:gosec // a listening port
	seg.speaker, _ = newSpeaker(t, seg.host.Addr().String())
	if err := seg.speaker.SetPeers(ctxT(), []bgp.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	if err := seg.frr.WaitEstablished(seg.host.Addr(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := seg.frr.WaitBFDUp(seg.host.Addr(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	// FRR 8.4 replaces its BFD session once BGP is up (TestBFDWithFRR):
	// let that settle before any attack.
	time.Sleep(3 * time.Second)
	seg.waitHealthy(t, 30*time.Second)
	return seg
}

// session returns the speaker's only session.
func (s *bfdSegment) session(t *testing.T) bgp.SessionState { return onlySession(t, s.speaker) }

// waitHealthy waits until BFD is Up and BGP Established on both sides.
func (s *bfdSegment) waitHealthy(t *testing.T, timeout time.Duration) {
	t.Helper()
	if err := s.frr.WaitBFDUp(s.host.Addr(), timeout); err != nil {
		t.Fatal(err)
	}
	if err := s.frr.WaitEstablished(s.host.Addr(), timeout); err != nil {
		t.Fatal(err)
	}
	eventually(t, timeout, "the speaker's BFD session is Up and BGP Established", func() bool {
		ss := s.session(t)
		return ss.BFD == "Up" && ss.Established()
	})
}

// discriminators are a session's two discriminators, as the attacker
// reads them from the router's packets to the speaker.
type discriminators struct{ router, speaker uint32 }

// sniff returns the discriminators of the Up session, read by the attacker
// from a packet the router sends to the speaker.
func (s *bfdSegment) sniff(t *testing.T) discriminators {
	t.Helper()
	want := netip.AddrPortFrom(s.host.Addr(), s.port)
	p, err := s.attackerNS.CaptureUDP("eth0", 5*time.Second, func(src, dst netip.AddrPort, _ uint8, b []byte) bool {
		return src.Addr() == s.tor.Addr() && dst == want && len(b) >= 24 && bfd.State(b[1]>>6) == bfd.Up && binary.BigEndian.Uint32(b[8:]) != 0
	})
	if err != nil {
		t.Fatalf("the attacker saw no Up packet from the router: %v", err)
	}
	d := discriminators{router: binary.BigEndian.Uint32(p[4:]), speaker: binary.BigEndian.Uint32(p[8:])}
	t.Logf("sniffed discriminators: router %#x, speaker %#x", d.router, d.speaker)
	return d
}

// forge sends three copies of p from the attacker's namespace with the
// router's address as source, to the speaker's BFD port, with ttl.
func (s *bfdSegment) forge(t *testing.T, p bfd.Control, ttl uint8) {
	t.Helper()
	p.Version, p.Length = bfd.Version, 24
	b := p.Marshal(nil)
	src := netip.AddrPortFrom(s.tor.Addr(), uint16(49152+rand.IntN(16384))) //nolint:gosec // a test's source port
	for range 3 {
		if err := s.attackerNS.SpoofUDP(src, netip.AddrPortFrom(s.host.Addr(), s.port), ttl, b); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// attackCase is one forged packet and the knowledge it needs.
type attackCase struct {
	name string
	// packet returns the forged packet, given the sniffed discriminators.
	packet func(d discriminators) bfd.Control
	ttl    uint8
	// oldEffect says what the packet did before the RFC 5880 section
	// 6.8.6 reception rules (for the failure message).
	oldEffect string
}

// runAttacks sends each case's packet while the session is Up and checks
// that it changes nothing: the speaker's BFD session stays Up with no new
// down transition, BGP stays Established on both sides (no reset by the
// speaker, none by FRR), and FRR's BFD session stays up. A case that
// fails is reported and the session is let recover before the next.
func (s *bfdSegment) runAttacks(t *testing.T, cases []attackCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s.waitHealthy(t, 30*time.Second)
			d := s.sniff(t)
			before := s.session(t)
			nbefore, err := s.frr.Neighbor(s.host.Addr())
			if err != nil {
				t.Fatal(err)
			}
			bbefore, err := s.frr.BFDPeer(s.host.Addr())
			if err != nil {
				t.Fatal(err)
			}
			s.forge(t, c.packet(d), c.ttl)
			// Ten detection times (100ms x 3) for the effect to show.
			time.Sleep(3 * time.Second)
			after := s.session(t)
			nafter, err := s.frr.Neighbor(s.host.Addr())
			if err != nil {
				t.Fatal(err)
			}
			bafter, err := s.frr.BFDPeer(s.host.Addr())
			if err != nil {
				t.Fatal(err)
			}
			if after.BFD != "Up" || after.BFDDowns != before.BFDDowns || !after.Established() || strings.Contains(after.Reason, "BFD") && after.Reason != before.Reason {
				t.Errorf("forged packet (%s) took effect: speaker's session %+v, before %+v", c.oldEffect, after, before)
			}
			if nafter.DroppedCount != nbefore.DroppedCount || nafter.EstablishedCount != nbefore.EstablishedCount {
				t.Errorf("forged packet reset BGP: FRR's neighbor %+v, before %+v", nafter, nbefore)
			}
			if bafter.SessionDownEvents != bbefore.SessionDownEvents {
				t.Errorf("forged packet took FRR's BFD session down: %+v, before %+v", bafter, bbefore)
			}
		})
	}
}

// random32 returns a random discriminator other than the excluded ones.
func random32(not ...uint32) uint32 {
	for {
		v := rand.Uint32() //nolint:gosec // a forged discriminator
		if v != 0 && !contains(not, v) {
			return v
		}
	}
}

func contains(s []uint32, v uint32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestBFDSpoofedSingleHop forges BFD packets from a namespace on the
// fabric that is neither a node nor the router, with the router's
// address, against the speaker's single-hop session with FRR's bfdd
// (IPv4): none may take the Up session down or reset BGP.
//
//   - your-discriminator-0: State Down, diagnostic "control detection
//     time expired", Your Discriminator 0 (the attacker needs only the
//     router's address). RFC 5880 section 6.8.6 with FRR's rule: a packet
//     with Your Discriminator 0 belongs to no session that is not Down.
//   - unknown-your-discriminator: State Down with a random Your
//     Discriminator: no session has it.
//   - wrong-my-discriminator: State Down with the speaker's own
//     discriminator (sniffed) but a My Discriminator that is not the
//     router's: while Up, the peer's discriminator does not change.
//   - single-hop-ttl-254: the session's own discriminators (sniffed) with
//     TTL 254: single hop accepts only 255 (RFC 5881 section 5).
func TestBFDSpoofedSingleHop(t *testing.T) {
	seg := newBFDSegment(t, "bfdspoof", 80, false)
	down := func(my, your uint32) bfd.Control {
		return bfd.Control{State: bfd.Down, Diag: bfd.DiagDetectionTimeExpired, DetectMult: 3, MyDiscriminator: my, YourDiscriminator: your,
			DesiredMinTx: time.Second, RequiredMinRx: time.Second}
	}
	seg.runAttacks(t, []attackCase{
		{name: "your-discriminator-0", ttl: 255, oldEffect: "matched by source address, it took the session Down and reset BGP",
			packet: func(d discriminators) bfd.Control { return down(random32(d.router), 0) }},
		{name: "unknown-your-discriminator", ttl: 255, oldEffect: "no session has that discriminator",
			packet: func(d discriminators) bfd.Control { return down(random32(d.router), random32(d.speaker)) }},
		{name: "wrong-my-discriminator", ttl: 255, oldEffect: "the right Your Discriminator sufficed",
			packet: func(d discriminators) bfd.Control { return down(random32(d.router), d.speaker) }},
		{name: "single-hop-ttl-254", ttl: 254, oldEffect: "single hop accepts TTL 255 only",
			packet: func(d discriminators) bfd.Control { return down(d.router, d.speaker) }},
	})
}

// TestBFDSpoofedMultihop forges multihop BFD packets (RFC 5883, UDP port
// 4784) with the session's own discriminators, sniffed on the fabric, and
// a TTL below the minimum: a packet from farther than the peer (TTL 1,
// TTL 253) must not take the session down. FRR's bfdd sends multihop
// packets with TTL 255, so the default minimum, 254, accepts it.
func TestBFDSpoofedMultihop(t *testing.T) {
	seg := newBFDSegment(t, "bfdspoofmh", 81, true)
	down := func(d discriminators) bfd.Control {
		return bfd.Control{State: bfd.Down, Diag: bfd.DiagDetectionTimeExpired, DetectMult: 3, MyDiscriminator: d.router, YourDiscriminator: d.speaker,
			DesiredMinTx: time.Second, RequiredMinRx: time.Second}
	}
	seg.runAttacks(t, []attackCase{
		{name: "multihop-ttl-1", ttl: 1, oldEffect: "multihop accepted any TTL", packet: down},
		{name: "multihop-ttl-253", ttl: 253, oldEffect: "multihop accepted any TTL", packet: down},
	})
}
