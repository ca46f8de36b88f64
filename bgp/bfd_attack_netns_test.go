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
// bridge in a "fabric" namespace, a veth from it to the test's namespace
// carrying the speaker's address, a router
// (FRR's zebra, bgpd and bfdd, or BIRD) in a "tor" namespace, and an
// "attacker" namespace that is neither a node nor the router, on the same
// segment. The bridge floods every frame (ageing time 0, a hub), so that
// the attacker sees the BFD session's packets as a sniffer on the fabric
// would; every forged packet leaves from the attacker's namespace.
type bfdSegment struct {
	host, tor, attacker netip.Prefix
	torNS, attackerNS   *netns.NS
	// frr or bird is the router.
	frr     *routers.FRR
	bird    *routers.BIRD
	speaker *bgp.GoBGP
	port    uint16
}

// newSegment builds the segment 10.254.<octet>.0/24 without a router.
// Namespaces and links go when the test ends, even when it fails.
func newSegment(t *testing.T, name string, octet int, multihop bool) *bfdSegment {
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
	// The bridge lives in a namespace of its own: an address on the
	// bridge itself would receive its frames without flooding them.
	fabric := netns.New(t, name+"-fab")
	netns.Bridge(t, fabric, "br0", "")
	fabric.IP(t, "link", "set", "br0", "type", "bridge", "ageing_time", "0")
	seg.torNS = netns.New(t, name+"-tor")
	seg.attackerNS = netns.New(t, name+"-atk")
	netns.Veth(t, nil, fmt.Sprintf("vcbfdh%d", octet%100), seg.host.String(), fabric, "host", "")
	netns.Veth(t, fabric, "tor", "", seg.torNS, "eth0", seg.tor.String())
	netns.Veth(t, fabric, "attacker", "", seg.attackerNS, "eth0", seg.attacker.String())
	for _, port := range []string{"host", "tor", "attacker"} {
		netns.Enslave(t, fabric, port, "br0")
	}
	return seg
}

// newBFDSegment builds the segment 10.254.<octet>.0/24 and brings up BGP
// and BFD between the speaker and FRR: single hop, or multihop (eBGP
// multihop 2, RFC 5883) when multihop is set.
func newBFDSegment(t *testing.T, name string, octet int, multihop bool) *bfdSegment {
	t.Helper()
	seg := newSegment(t, name, octet, multihop)
	timers := routers.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3}
	nbr := routers.FRRNeighbor{Address: seg.host.Addr(), ASN: localASN, HoldTime: 9 * time.Second, KeepaliveTime: 3 * time.Second, BFD: &timers}
	peer := bgp.Peer{Name: "tor", Address: seg.tor.Addr(), ASN: routerASN, LocalASN: localASN, SourceAddress: seg.host.Addr(),
		HoldTime: 9 * time.Second, KeepaliveTime: 3 * time.Second,
		BFD: &bgp.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3, Multihop: multihop}}
	if multihop {
		nbr.EBGPMultiHop = 2
		peer.EBGPMultiHop = 2
	}
	seg.frr = routers.StartFRR(t, routers.FRRConfig{ASN: routerASN, ListenAddress: seg.tor.Addr(), Netns: seg.torNS.Name, Zebra: true,
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
	if s.frr != nil {
		if err := s.frr.WaitBFDUp(s.host.Addr(), timeout); err != nil {
			t.Fatal(err)
		}
		if err := s.frr.WaitEstablished(s.host.Addr(), timeout); err != nil {
			t.Fatal(err)
		}
	} else {
		if err := s.bird.WaitBFDUp(s.host.Addr(), timeout); err != nil {
			t.Fatal(err)
		}
		if err := s.bird.WaitEstablished("speaker", timeout); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, timeout, "the speaker's BFD session is Up and BGP Established", func() bool {
		ss := s.session(t)
		return ss.BFD == "Up" && ss.Established()
	})
}

// discriminators are a session's two discriminators, as the attacker
// reads them from the router's packets to the speaker.
type discriminators struct{ router, speaker uint32 }

// sniffPacket returns the discriminators of the Up session and the whole
// packet, read by the attacker from a packet the router sends to the
// speaker.
func (s *bfdSegment) sniffPacket(t *testing.T) (discriminators, []byte) {
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
	return d, p
}

// forge sends three copies of p from the attacker's namespace with the
// router's address as source, to the speaker's BFD port, with ttl.
func (s *bfdSegment) forge(t *testing.T, p bfd.Control, ttl uint8) {
	t.Helper()
	p.Version, p.Length = bfd.Version, 24
	s.forgeRaw(t, p.Marshal(nil), ttl)
}

// forgeRaw sends three copies of b as forge does.
func (s *bfdSegment) forgeRaw(t *testing.T, b []byte, ttl uint8) {
	t.Helper()
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
	// packet returns the forged packet, given the sniffed discriminators;
	// raw, when set instead, returns its bytes given a sniffed packet.
	packet func(d discriminators) bfd.Control
	raw    func(d discriminators, sniffed []byte) []byte
	ttl    uint8
	// reason is the label of vipcast_bfd_discarded_packets_total that
	// counts the discarded copies.
	reason string
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
			d, sniffed := s.sniffPacket(t)
			before := s.session(t)
			router := s.routerView(t)
			discards := s.speaker.BFDDiscards().Discarded(c.reason)
			if c.raw != nil {
				s.forgeRaw(t, c.raw(d, sniffed), c.ttl)
			} else {
				s.forge(t, c.packet(d), c.ttl)
			}
			// Ten detection times (100ms x 3) for the effect to show.
			time.Sleep(3 * time.Second)
			after := s.session(t)
			if after.BFD != "Up" || after.BFDDowns != before.BFDDowns || !after.Established() || strings.Contains(after.Reason, "BFD") && after.Reason != before.Reason {
				t.Errorf("forged packet (before the fix: %s) took effect: speaker's session %+v, before %+v", c.oldEffect, after, before)
			}
			if r := s.routerView(t); !r.same(router) {
				t.Errorf("forged packet reached the router's sessions: %s, before %s", r, router)
			}
			got := s.speaker.BFDDiscards().Discarded(c.reason) - discards
			t.Logf("vipcast_bfd_discarded_packets_total{reason=%q} +%d", c.reason, got)
			if got < 3 {
				t.Errorf("vipcast_bfd_discarded_packets_total{reason=%q} grew by %d, want the 3 forged copies", c.reason, got)
			}
		})
	}
}

// routerState is the router's side of a segment: FRR's counts of its BGP
// session's resets and its BFD session's downs, or BIRD's BFD state and
// when it was entered.
type routerState struct {
	view  string
	since time.Time // BIRD: when the BFD state was entered
}

func (r routerState) String() string {
	if r.since.IsZero() {
		return r.view
	}
	return r.view + " since " + r.since.Format("15:04:05.000")
}

// sinceJitter is how far BIRD's printed time of one state change moves
// between two reads (it derives the wall-clock time from its monotonic
// clock at each print: 1 ms seen); a session that went down and came
// back shows a time seconds later.
const sinceJitter = 50 * time.Millisecond

// same reports whether the router saw no change between o and r.
func (r routerState) same(o routerState) bool {
	d := r.since.Sub(o.since)
	return r.view == o.view && d < sinceJitter && d > -sinceJitter
}

// routerView reads the router's side: its BGP session's resets and its
// BFD session's downs (FRR), or its BFD session's state and since (BIRD).
func (s *bfdSegment) routerView(t *testing.T) routerState {
	t.Helper()
	if s.frr != nil {
		n, err := s.frr.Neighbor(s.host.Addr())
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.frr.BFDPeer(s.host.Addr())
		if err != nil {
			t.Fatal(err)
		}
		return routerState{view: fmt.Sprintf("BGP established %d dropped %d, BFD downs %d", n.EstablishedCount, n.DroppedCount, b.SessionDownEvents)}
	}
	sessions, err := s.bird.BFDSessions()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range sessions {
		if b.Address != s.host.Addr() {
			continue
		}
		f := strings.Fields(b.Since)
		if len(f) == 0 {
			t.Fatalf("BIRD's BFD session with %s has no since: %+v", s.host.Addr(), b)
		}
		since, err := time.Parse("15:04:05.000", f[len(f)-1])
		if err != nil {
			t.Fatalf("BIRD's BFD session with %s: since %q: %v", s.host.Addr(), b.Since, err)
		}
		return routerState{view: "BFD " + b.State, since: since}
	}
	t.Fatalf("BIRD has no BFD session with %s: %+v", s.host.Addr(), sessions)
	return routerState{}
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
		{name: "your-discriminator-0", ttl: 255, reason: "your_discriminator_zero_session_up", oldEffect: "matched by source address, it took the session Down and reset BGP",
			packet: func(d discriminators) bfd.Control { return down(random32(d.router), 0) }},
		{name: "unknown-your-discriminator", ttl: 255, reason: "no_session", oldEffect: "no session has that discriminator",
			packet: func(d discriminators) bfd.Control { return down(random32(d.router), random32(d.speaker)) }},
		{name: "wrong-my-discriminator", ttl: 255, reason: "my_discriminator_mismatch", oldEffect: "the right Your Discriminator sufficed",
			packet: func(d discriminators) bfd.Control { return down(random32(d.router), d.speaker) }},
		{name: "single-hop-ttl-254", ttl: 254, reason: "kernel", oldEffect: "single hop accepts TTL 255 only",
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
		{name: "multihop-ttl-1", ttl: 1, reason: "kernel", oldEffect: "multihop accepted any TTL", packet: down},
		{name: "multihop-ttl-253", ttl: 253, reason: "kernel", oldEffect: "multihop accepted any TTL", packet: down},
	})
}

// TestBFDSpoofedBIRDAuth runs the speaker's multihop BFD with BIRD, which
// sends multihop packets with TTL 64 (so the BGPPeer's minimumTTL is 64),
// authenticated with Meticulous Keyed SHA1 (RFC 5880 section 6.7.4;
// FRR's bfdd has no authentication): the session comes Up, BIRD's frozen
// BFD still resets BGP through it, and an attacker on the fabric who
// sniffs the session's packets cannot take it down:
//
//   - multihop-ttl-63: the session's own discriminators, TTL 63: dropped
//     by the socket's kernel filter (below 64);
//   - unauthenticated: the session's own discriminators, TTL 64, no
//     authentication section;
//   - wrong-key: signed with a guessed key and the next sequence number;
//   - replay: a packet BIRD sent earlier, sent again: Meticulous Keyed
//     SHA1 requires a greater sequence number.
func TestBFDSpoofedBIRDAuth(t *testing.T) {
	seg := newSegment(t, "bfdauth", 82, true)
	key := "vipcast-bfd-key"
	timers := routers.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3,
		Auth: &routers.BFDAuth{Meticulous: true, KeyID: 7, Key: key}}
	seg.bird = routers.StartBIRD(t, routers.BIRDConfig{ASN: routerASN, ListenAddress: seg.tor.Addr(), Netns: seg.torNS.Name,
		Neighbors: []routers.BIRDNeighbor{{Name: "speaker", Address: seg.host.Addr(), ASN: localASN, HoldTime: 9 * time.Second, BFD: &timers}}})
	seg.speaker, _ = newSpeaker(t, seg.host.Addr().String())
	peer := bgp.Peer{Name: "bird", Address: seg.tor.Addr(), Port: uint16(seg.bird.Port), ASN: routerASN, LocalASN: localASN, SourceAddress: seg.host.Addr(), //nolint:gosec // a listening port
		HoldTime: 9 * time.Second, KeepaliveTime: 3 * time.Second, EBGPMultiHop: 2,
		BFD: &bgp.BFD{MinTx: 100 * time.Millisecond, MinRx: 100 * time.Millisecond, Multiplier: 3, Multihop: true, MinTTL: 64,
			Auth: &bfd.Auth{Type: bfd.AuthMeticulousKeyedSHA1, KeyID: 7, Key: bfd.Key(key)}}}

	// A wrong key first: BIRD's packets fail the digest, nothing comes Up.
	wrong := peer
	wb := *peer.BFD
	wb.Auth = &bfd.Auth{Type: bfd.AuthMeticulousKeyedSHA1, KeyID: 7, Key: bfd.Key("not-the-key")}
	wrong.BFD = &wb
	digest := seg.speaker.BFDDiscards().Discarded("auth_digest")
	if err := seg.speaker.SetPeers(ctxT(), []bgp.Peer{wrong}); err != nil {
		t.Fatal(err)
	}
	if err := seg.bird.WaitEstablished("speaker", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if ss := seg.session(t); ss.BFD == "Up" || seg.speaker.BFDDiscards().Discarded("auth_digest") == digest {
		t.Fatalf("with the wrong key: session %+v, %d digest discards; want BFD not Up and BIRD's packets discarded", ss, seg.speaker.BFDDiscards().Discarded("auth_digest")-digest)
	}
	t.Logf("wrong key: BFD %s, %d of BIRD's packets discarded (auth_digest)", seg.session(t).BFD, seg.speaker.BFDDiscards().Discarded("auth_digest")-digest)

	if err := seg.speaker.SetPeers(ctxT(), []bgp.Peer{peer}); err != nil {
		t.Fatal(err)
	}
	seg.waitHealthy(t, 30*time.Second)
	sessions, err := seg.bird.BFDSessions()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("BIRD's view: %+v", sessions)

	down := func(d discriminators) bfd.Control {
		return bfd.Control{Version: bfd.Version, Length: 24, State: bfd.Down, Diag: bfd.DiagDetectionTimeExpired, DetectMult: 3,
			MyDiscriminator: d.router, YourDiscriminator: d.speaker, DesiredMinTx: time.Second, RequiredMinRx: time.Second}
	}
	seg.runAttacks(t, []attackCase{
		{name: "multihop-ttl-63", ttl: 63, reason: "kernel", oldEffect: "multihop accepted any TTL", packet: down},
		{name: "unauthenticated", ttl: 64, reason: "auth_missing", oldEffect: "the sniffed discriminators sufficed", packet: down},
		{name: "wrong-key", ttl: 64, reason: "auth_digest", oldEffect: "the sniffed discriminators sufficed",
			raw: func(d discriminators, sniffed []byte) []byte {
				c := down(d)
				c.AuthPresent, c.AuthType, c.AuthKeyID = true, bfd.AuthMeticulousKeyedSHA1, 7
				// Ahead of what the speaker has accepted, within its window.
				c.AuthSeq = binary.BigEndian.Uint32(sniffed[28:]) + 5
				b := c.Marshal(nil)
				bfd.Sign(b, []byte("guessed"))
				return b
			}},
		{name: "replay", ttl: 64, reason: "auth_sequence", oldEffect: "no authentication",
			raw: func(_ discriminators, sniffed []byte) []byte {
				// Wait until BIRD has sent newer packets.
				time.Sleep(500 * time.Millisecond)
				return sniffed
			}},
	})

	// BFD still does its job: BIRD frozen, BGP reset long before the
	// hold time.
	seg.bird.Freeze()
	frozen := time.Now()
	eventually(t, 5*time.Second, "the BGP session is reset", func() bool { return seg.session(t).State != "Established" })
	took := time.Since(frozen)
	seg.bird.Thaw()
	t.Logf("BIRD frozen: the speaker reset BGP after %v (authenticated BFD, detection time 300ms, hold time 9s)", took.Round(time.Millisecond))
	if took >= 3*time.Second {
		t.Fatalf("BGP reset %v after BIRD froze: the hold timer, not BFD, ended it", took)
	}
	seg.waitHealthy(t, 30*time.Second)
}
