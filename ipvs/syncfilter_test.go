package ipvs

import (
	"encoding/binary"
	"maps"
	"net/netip"
	"testing"
	"time"
)

// syncConnSpec is one connection of a test sync message.
type syncConnSpec struct {
	proto               Protocol
	flags               uint32
	cport, vport, dport uint16
	timeout             uint32
	caddr, vaddr, daddr netip.Addr
	options             []byte // type, length, data...
}

// build writes c as the kernel's master does (ip_vs_sync_conn), without
// padding.
func (c syncConnSpec) build() []byte {
	alen, typ := 4, byte(0)
	if c.vaddr.Is6() {
		alen, typ = 16, 1
	}
	b := make([]byte, 24, 24+3*alen+len(c.options))
	b[0], b[1] = typ, byte(c.proto)
	binary.BigEndian.PutUint16(b[2:4], uint16(24+3*alen+len(c.options)))
	binary.BigEndian.PutUint32(b[4:8], c.flags)
	binary.BigEndian.PutUint16(b[8:10], 0) // state
	binary.BigEndian.PutUint16(b[10:12], c.cport)
	binary.BigEndian.PutUint16(b[12:14], c.vport)
	binary.BigEndian.PutUint16(b[14:16], c.dport)
	binary.BigEndian.PutUint32(b[20:24], c.timeout)
	for _, a := range []netip.Addr{c.caddr, c.vaddr, c.daddr} {
		b = append(b, a.AsSlice()...)
	}
	return append(b, c.options...)
}

// syncMessage builds a version 1 message of sync ID id with conns, each
// padded to 4 bytes but the last.
func syncMessage(id uint8, conns ...syncConnSpec) []byte {
	m := []byte{0, id, 0, 0, byte(len(conns)), 1, 0, 0}
	for i, c := range conns {
		b := c.build()
		m = append(m, b...)
		if i < len(conns)-1 {
			for len(m)%4 != 0 {
				m = append(m, 0)
			}
		}
	}
	binary.BigEndian.PutUint16(m[2:4], uint16(len(m)))
	return m
}

var (
	testVIP   = netip.MustParseAddr("10.100.0.2")
	testNode  = netip.MustParseAddr("10.0.0.11")
	testVIP6  = netip.MustParseAddr("fd00:100::2")
	testNode6 = netip.MustParseAddr("fd00::11")
)

// testTargets holds one tier-1 virtual server per family, tunnelling to
// the test node on port 80, and one with a masqueraded real server only.
func testTargets() *syncTargets {
	t := &syncTargets{}
	t.reset(State{Services: map[Key]Service{
		{VIP: testVIP, Port: 80, Protocol: TCP}: {VIP: testVIP, Port: 80, Protocol: TCP,
			Backends: []Backend{{Addr: testNode, Port: 80, Weight: 1, Tunnel: true}}},
		{VIP: testVIP6, Port: 80, Protocol: TCP}: {VIP: testVIP6, Port: 80, Protocol: TCP,
			Backends: []Backend{{Addr: testNode6, Port: 80, Weight: 1, Tunnel: true}}},
		{VIP: testVIP, Port: 53, Protocol: UDP}: {VIP: testVIP, Port: 53, Protocol: UDP,
			Backends: []Backend{{Addr: netip.MustParseAddr("10.244.0.5"), Port: 53, Weight: 1}}},
	}})
	return t
}

// TestFilterSyncMessage: a relay passes on only the connections its own
// tier 1 could have written, timeouts cut to syncMaxTimeout, and drops a
// message that does not parse as the kernel would walk it.
func TestFilterSyncMessage(t *testing.T) {
	client := netip.MustParseAddr("192.0.2.7")
	client6 := netip.MustParseAddr("2001:db8::7")
	attacker := netip.MustParseAddr("203.0.113.66")
	good := syncConnSpec{proto: TCP, flags: syncFwdTunnel, cport: 40000, vport: 80, dport: 80, timeout: 900, caddr: client, vaddr: testVIP, daddr: testNode}
	good6 := syncConnSpec{proto: TCP, flags: syncFwdTunnel, cport: 40000, vport: 80, dport: 80, timeout: 900, caddr: client6, vaddr: testVIP6, daddr: testNode6}
	with := func(c syncConnSpec, f func(*syncConnSpec)) syncConnSpec { f(&c); return c }
	seq := append([]byte{1, 24}, make([]byte, 24)...) // IPVS_OPT_SEQ_DATA
	for _, tc := range []struct {
		name        string
		msg         []byte
		kept        int
		clamped     int
		dropped     map[string]int
		wantTimeout uint32 // of the first kept connection
	}{
		{"one good IPv4 connection", syncMessage(96, good), 1, 0, map[string]int{}, 900},
		{"one good IPv6 connection", syncMessage(96, good6), 1, 0, map[string]int{}, 900},
		{"with a sequence option", syncMessage(96, with(good, func(c *syncConnSpec) { c.options = seq })), 1, 0, map[string]int{}, 900},
		{"a template (persistence)", syncMessage(96, with(good, func(c *syncConnSpec) { c.flags |= 0x1000; c.cport = 0 })), 1, 0, map[string]int{}, 900},
		{"tunnelled to an attacker (a man in the middle)", syncMessage(96, with(good, func(c *syncConnSpec) { c.daddr = attacker })), 0, 0, map[string]int{SyncDropUnknownTarget: 1}, 0},
		{"masqueraded (forwarding method 0)", syncMessage(96, with(good, func(c *syncConnSpec) { c.flags = 0 })), 0, 0, map[string]int{SyncDropNotTunnel: 1}, 0},
		{"direct routing", syncMessage(96, with(good, func(c *syncConnSpec) { c.flags = 3 })), 0, 0, map[string]int{SyncDropNotTunnel: 1}, 0},
		{"a virtual address that is no VIP", syncMessage(96, with(good, func(c *syncConnSpec) { c.vaddr = netip.MustParseAddr("10.96.0.1") })), 0, 0, map[string]int{SyncDropUnknownTarget: 1}, 0},
		{"another port of the VIP", syncMessage(96, with(good, func(c *syncConnSpec) { c.vport = 443 })), 0, 0, map[string]int{SyncDropUnknownTarget: 1}, 0},
		{"another protocol", syncMessage(96, with(good, func(c *syncConnSpec) { c.proto = UDP })), 0, 0, map[string]int{SyncDropUnknownTarget: 1}, 0},
		{"the node on another port", syncMessage(96, with(good, func(c *syncConnSpec) { c.dport = 22 })), 0, 0, map[string]int{SyncDropUnknownTarget: 1}, 0},
		{"a tier-2 (masqueraded) virtual server tunnelled", syncMessage(96, with(good, func(c *syncConnSpec) {
			c.proto, c.vport, c.dport, c.daddr = UDP, 53, 53, netip.MustParseAddr("10.244.0.5")
		})), 0, 0, map[string]int{SyncDropUnknownTarget: 1}, 0},
		{"pinned for 136 years", syncMessage(96, with(good, func(c *syncConnSpec) { c.timeout = 0xffffffff })), 1, 1, map[string]int{}, syncMaxTimeout},
		{"one good, one forged", syncMessage(96, good, with(good, func(c *syncConnSpec) { c.daddr = attacker }), good6), 2, 0, map[string]int{SyncDropUnknownTarget: 1}, 900},
		{"a count past the end", func() []byte { m := syncMessage(96, good); m[4] = 2; return m }(), 0, 0, map[string]int{SyncDropMalformed: 1}, 0},
		{"bytes after the last connection", func() []byte {
			m := append(syncMessage(96, good), 0, 0, 0, 0)
			binary.BigEndian.PutUint16(m[2:4], uint16(len(m)))
			return m
		}(), 0, 0, map[string]int{SyncDropMalformed: 1}, 0},
		{"a connection version 1", func() []byte { m := syncMessage(96, good); m[8+2] |= 0x10; return m }(), 0, 0, map[string]int{SyncDropMalformed: 1}, 0},
		{"type 2", func() []byte { m := syncMessage(96, good); m[8] = 2; return m }(), 0, 0, map[string]int{SyncDropMalformed: 1}, 0},
		{"IPv6 type on an IPv4 size", func() []byte { m := syncMessage(96, good); m[8] = 1; return m }(), 0, 0, map[string]int{SyncDropMalformed: 1}, 0},
		{"an option of length 0", syncMessage(96, with(good, func(c *syncConnSpec) { c.options = []byte{1, 0} })), 0, 0, map[string]int{SyncDropMalformed: 1}, 0},
		{"an option past the connection", syncMessage(96, with(good, func(c *syncConnSpec) { c.options = []byte{1, 24, 0} })), 0, 0, map[string]int{SyncDropMalformed: 1}, 0},
		{"spare bytes set", func() []byte { m := syncMessage(96, good); m[7] = 1; return m }(), 0, 0, map[string]int{SyncDropMalformed: 1}, 0},
		{"no connection", syncMessage(96), 0, 0, map[string]int{}, 0},
	} {
		if err := checkSyncMessage(tc.msg, 96); err != nil {
			t.Fatalf("%s: the test message is not a sync message: %v", tc.name, err)
		}
		out, res := filterSyncMessage(append([]byte(nil), tc.msg...), testTargets().allows)
		if res.Kept != tc.kept || res.Clamped != tc.clamped || !maps.Equal(res.Dropped, tc.dropped) {
			t.Errorf("%s: %+v, want kept %d clamped %d dropped %v", tc.name, res, tc.kept, tc.clamped, tc.dropped)
			continue
		}
		if tc.kept == 0 {
			if out != nil {
				t.Errorf("%s: passed on %x, want nothing", tc.name, out)
			}
			continue
		}
		// What goes on is itself a message the backup walks whole.
		if err := checkSyncMessage(out, 96); err != nil {
			t.Errorf("%s: output %x: %v", tc.name, out, err)
			continue
		}
		conns, err := splitSyncMessage(out)
		if err != nil || len(conns) != tc.kept || int(out[4]) != tc.kept {
			t.Errorf("%s: output %x: %d connections (header %d), %v; want %d", tc.name, out, len(conns), out[4], err, tc.kept)
			continue
		}
		if got := binary.BigEndian.Uint32(conns[0].fixed[20:24]); got != tc.wantTimeout {
			t.Errorf("%s: first connection's timeout %d, want %d", tc.name, got, tc.wantTimeout)
		}
	}
}

// FuzzFilterSyncMessage: no input makes it panic; what it passes on is a
// message the kernel walks whole, of no more connections than it read,
// each naming a target and with a bounded timeout.
func FuzzFilterSyncMessage(f *testing.F) {
	good := syncConnSpec{proto: TCP, flags: syncFwdTunnel, cport: 40000, vport: 80, dport: 80, timeout: 900,
		caddr: netip.MustParseAddr("192.0.2.7"), vaddr: testVIP, daddr: testNode}
	f.Add(syncMessage(96, good))
	f.Add(syncMessage(96, good, good))
	f.Add(syncMessage(96))
	targets := testTargets()
	f.Fuzz(func(t *testing.T, msg []byte) {
		if checkSyncMessage(msg, 0) != nil {
			return
		}
		out, res := filterSyncMessage(append([]byte(nil), msg...), targets.allows)
		if out == nil {
			return
		}
		if err := checkSyncMessage(out, 0); err != nil {
			t.Fatalf("passed on %x: %v", out, err)
		}
		conns, err := splitSyncMessage(out)
		if err != nil || len(conns) != res.Kept || res.Kept > int(msg[4]) {
			t.Fatalf("passed on %x: %d connections, %v; kept %d of %d", out, len(conns), err, res.Kept, msg[4])
		}
		for _, c := range conns {
			if reason, clamped := checkSyncConn(c.fixed, targets.allows); reason != "" || clamped {
				t.Fatalf("passed on a connection %x: %q, clamped %v", c.fixed, reason, clamped)
			}
		}
	})
}

// TestSyncKeys: a datagram signed with a key the receiver holds, sent
// within syncMaxSkew, opens to the message; anything else is refused with
// its reason, and without keys datagrams pass as they are.
func TestSyncKeys(t *testing.T) {
	key := func(c byte) []byte {
		b := make([]byte, 32)
		for i := range b {
			b[i] = c
		}
		return b
	}
	old, err := NewSyncKeys(map[int][]byte{1: key('a')})
	if err != nil {
		t.Fatal(err)
	}
	both, err := NewSyncKeys(map[int][]byte{1: key('a'), 2: key('b')})
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewSyncKeys(map[int][]byte{1: key('x')})
	if err != nil {
		t.Fatal(err)
	}
	if both.SendID() != 2 || old.SendID() != 1 {
		t.Fatalf("send IDs %d and %d, want 2 and 1", both.SendID(), old.SendID())
	}
	now := time.Unix(1_800_000_000, 0)
	msg := syncMessage(96)
	tamper := func(b []byte, i int) []byte { b = append([]byte(nil), b...); b[i] ^= 1; return b }
	for _, tc := range []struct {
		name     string
		datagram []byte
		recv     SyncKeys
		at       time.Time
		want     string // "" for the message
	}{
		{"signed, same key", old.seal(msg, now), old, now, ""},
		{"signed with the new key, receiver has both", both.seal(msg, now), both, now, ""},
		{"signed with the old key, receiver has both (rotation)", old.seal(msg, now), both, now, ""},
		{"signed with the new key, receiver has the old only", both.seal(msg, now), old, now, SyncDropUnknownKey},
		{"another cluster's key", other.seal(msg, now), old, now, SyncDropBadMAC},
		{"unsigned", msg, old, now, SyncDropUnsigned},
		{"a byte of the message changed", tamper(old.seal(msg, now), 1), old, now, SyncDropBadMAC},
		{"the send time changed", tamper(old.seal(msg, now), len(msg)+11), old, now, SyncDropBadMAC},
		{"the MAC changed", tamper(old.seal(msg, now), len(msg)+syncTrailerLen-1), old, now, SyncDropBadMAC},
		{"replayed 31 s later", old.seal(msg, now), old, now.Add(31 * time.Second), SyncDropStale},
		{"29 s ahead of the receiver", old.seal(msg, now.Add(29*time.Second)), old, now, ""},
		{"no keys: unsigned passes", msg, SyncKeys{}, now, ""},
	} {
		got, err := tc.recv.open(tc.datagram, tc.at)
		switch {
		case tc.want == "" && (err != nil || string(got) != string(msg)):
			t.Errorf("%s: %x, %v; want the message", tc.name, got, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("%s: %x, %v; want %s", tc.name, got, err, tc.want)
		}
	}
	if (SyncKeys{}).seal(msg, now) == nil || string((SyncKeys{}).seal(msg, now)) != string(msg) {
		t.Error("no keys: seal changed the message")
	}
	for _, bad := range []map[int][]byte{{0: key('a')}, {256: key('a')}, {1: key('a')[:31]}} {
		if _, err := NewSyncKeys(bad); err == nil {
			t.Errorf("NewSyncKeys(%v) took it", bad)
		}
	}
	if _, err := LoadSyncKeys(t.TempDir()); err == nil {
		t.Error("LoadSyncKeys of an empty directory: no error")
	}
}

// TestRelayCheck is the relay's decision on a datagram from the fabric:
// only a peer's address, signed with a current key, a sync message of the
// relay's ID, and only the connections of its own tier 1 go on.
func TestRelayCheck(t *testing.T) {
	peer := netip.MustParseAddr("10.0.0.12")
	r := newRelay(96, DefaultSyncRelayPort, testTargets())
	r.setPeers([]netip.Addr{peer})
	keys, err := NewSyncKeys(map[int][]byte{1: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	r.keys.Store(&keys)
	now := time.Unix(1_800_000_000, 0)
	r.now = func() time.Time { return now }
	good := syncConnSpec{proto: TCP, flags: syncFwdTunnel, cport: 40000, vport: 80, dport: 80, timeout: 900,
		caddr: netip.MustParseAddr("192.0.2.7"), vaddr: testVIP, daddr: testNode}
	forged := good
	forged.daddr = netip.MustParseAddr("203.0.113.66")
	from := netip.AddrPortFrom(peer, DefaultSyncRelayPort)
	for _, tc := range []struct {
		name     string
		datagram []byte
		from     netip.AddrPort
		want     string
		kept     int
	}{
		{"a peer's signed message", keys.seal(syncMessage(96, good), now), from, "", 1},
		{"a stranger's", keys.seal(syncMessage(96, good), now), netip.AddrPortFrom(netip.MustParseAddr("10.0.0.99"), DefaultSyncRelayPort), SyncDropUnknownSource, 0},
		{"a peer's address, unsigned (forged source)", syncMessage(96, good), from, SyncDropUnsigned, 0},
		{"signed, another sync ID", keys.seal(syncMessage(7, good), now), from, SyncDropMalformed, 0},
		{"signed, a forged connection beside a good one", keys.seal(syncMessage(96, good, forged), now), from, "", 1},
		{"signed, only forged connections", keys.seal(syncMessage(96, forged), now), from, SyncDropEmpty, 0},
	} {
		out, reason := r.check(tc.datagram, tc.from)
		if reason != tc.want {
			t.Errorf("%s: dropped as %q, want %q", tc.name, reason, tc.want)
			continue
		}
		if tc.kept > 0 && (out == nil || int(out[4]) != tc.kept) {
			t.Errorf("%s: passed on %x, want %d connections", tc.name, out, tc.kept)
		}
	}
	st := r.stats()
	if st.DroppedConns[SyncDropUnknownTarget] != 2 {
		t.Errorf("connections dropped: %v, want 2 %s", st.DroppedConns, SyncDropUnknownTarget)
	}
}

// BenchmarkRelayCheck is what the relay does to a full datagram of 40
// IPv4 connections (a 1500-byte MTU's worth) from another node: sign it
// (the sending relay), check the source, the HMAC and the time, and filter
// its connections against 1,000 tier-1 virtual servers; the same without
// keys for the cost of authentication alone.
func BenchmarkRelayCheck(b *testing.B) {
	peer := netip.MustParseAddr("10.0.0.12")
	st := State{Services: map[Key]Service{}}
	for i := range 1000 {
		vip := netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)})
		st.Services[Key{VIP: vip, Port: 80, Protocol: TCP}] = Service{VIP: vip, Port: 80, Protocol: TCP,
			Backends: []Backend{{Addr: testNode, Port: 80, Weight: 1, Tunnel: true}, {Addr: peer, Port: 80, Weight: 1, Tunnel: true}}}
	}
	targets := &syncTargets{}
	targets.reset(st)
	conns := make([]syncConnSpec, 40)
	for i := range conns {
		conns[i] = syncConnSpec{proto: TCP, flags: syncFwdTunnel, cport: uint16(40000 + i), vport: 80, dport: 80, timeout: 900,
			caddr: netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), vaddr: netip.AddrFrom4([4]byte{10, 100, 0, byte(i)}), daddr: testNode}
	}
	msg := syncMessage(96, conns...)
	keys, err := NewSyncKeys(map[int][]byte{1: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		b.Fatal(err)
	}
	from := netip.AddrPortFrom(peer, DefaultSyncRelayPort)
	for _, bc := range []struct {
		name string
		keys SyncKeys
	}{{"signed", keys}, {"unsigned", SyncKeys{}}} {
		b.Run(bc.name, func(b *testing.B) {
			r := newRelay(96, DefaultSyncRelayPort, targets)
			r.setPeers([]netip.Addr{peer})
			r.keys.Store(&bc.keys)
			b.SetBytes(int64(len(msg)))
			for b.Loop() {
				d := bc.keys.seal(msg, time.Now())
				if out, reason := r.check(d, from); out == nil {
					b.Fatalf("dropped: %s", reason)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(conns)), "ns/conn")
		})
	}
}
