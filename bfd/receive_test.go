package bfd

import (
	"crypto/sha1" //nolint:gosec // RFC 5880 section 6.7.4 specifies SHA1
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// sessionIn returns a session with local discriminator 1 in state st,
// whose peer's discriminator is 2 (from Init on).
func sessionIn(t *testing.T, st State) *Session {
	t.Helper()
	switch st {
	case Down:
		return NewSession(1, fast)
	case AdminDown:
		s := NewSession(1, fast)
		s.Shutdown()
		return s
	case Init:
		s := NewSession(1, fast)
		s.Receive(Control{State: Down, DetectMult: 3, MyDiscriminator: 2, DesiredMinTx: time.Second, RequiredMinRx: time.Second}, t0)
		if s.State() != Init {
			t.Fatalf("session in %v, want Init", s.State())
		}
		return s
	case Up:
		return upPair(t, fast, fast).a
	}
	t.Fatalf("no session in %v", st)
	return nil
}

// TestAcceptDiscriminators is RFC 5880 section 6.8.6's selection of the
// session by discriminator, per session state, with vipcast's rules for
// Your Discriminator 0 (FRR's: only a session that is Down or AdminDown
// hears it, except from the peer's own session saying Down) and for My
// Discriminator while Up.
func TestAcceptDiscriminators(t *testing.T) {
	all := func(err error) map[State]error {
		return map[State]error{AdminDown: err, Down: err, Init: err, Up: err}
	}
	cases := []struct {
		name      string
		state     State
		my, your  uint32
		wantState map[State]error
	}{
		{"your 0, State Down, unknown peer discriminator (forged with the peer's address)", Down, 77, 0,
			map[State]error{AdminDown: nil, Down: nil, Init: ErrSessionUp, Up: ErrSessionUp}},
		{"your 0, State AdminDown, unknown peer discriminator", AdminDown, 77, 0,
			map[State]error{AdminDown: nil, Down: nil, Init: ErrSessionUp, Up: ErrSessionUp}},
		{"your 0, State Down, the peer's discriminator (FRR deleting its session)", Down, 2, 0,
			map[State]error{AdminDown: nil, Down: nil, Init: nil, Up: nil}},
		{"your 0, State Init, the peer's discriminator", Init, 2, 0,
			map[State]error{AdminDown: nil, Down: nil, Init: ErrSessionUp, Up: ErrSessionUp}},
		{"your 0, State Up, the peer's discriminator", Up, 2, 0,
			map[State]error{AdminDown: nil, Down: nil, Init: ErrSessionUp, Up: ErrSessionUp}},
		{"another session's your discriminator", Down, 2, 9, all(ErrNoSession)},
		{"right your, wrong my (Up: the peer's does not change)", Down, 77, 1,
			map[State]error{AdminDown: nil, Down: nil, Init: nil, Up: ErrPeerDiscr}},
		{"right your, right my", Up, 2, 1, all(nil)},
	}
	for _, tc := range cases {
		for _, st := range []State{AdminDown, Down, Init, Up} {
			t.Run(tc.name+"/"+st.String(), func(t *testing.T) {
				s := sessionIn(t, st)
				p := Control{Version: Version, State: tc.state, DetectMult: 3, Length: controlLen, MyDiscriminator: tc.my, YourDiscriminator: tc.your,
					DesiredMinTx: time.Second, RequiredMinRx: time.Second}
				err := s.Accept(p, p.Marshal(nil), t0)
				if want := tc.wantState[st]; !errors.Is(err, want) {
					t.Fatalf("Accept in %v: %v, want %v", st, err, want)
				}
				if err != nil && Reason(err) == "other" {
					t.Fatalf("%v has no reason label", err)
				}
			})
		}
	}
}

// TestForgedDownLeavesUpSession: the attack of issue 29 in pure logic: a
// packet with the peer's address only (Your Discriminator 0, State Down,
// a guessed My Discriminator) is discarded and the Up session stays Up.
func TestForgedDownLeavesUpSession(t *testing.T) {
	p := upPair(t, fast, fast)
	forged := Control{Version: Version, State: Down, Diag: DiagDetectionTimeExpired, DetectMult: 3, Length: controlLen, MyDiscriminator: 0xdeadbeef}
	if err := p.a.Accept(forged, forged.Marshal(nil), p.now); !errors.Is(err, ErrSessionUp) {
		t.Fatalf("forged Down: %v, want ErrSessionUp", err)
	}
	p.exchange(t)
	if p.a.State() != Up {
		t.Fatalf("session %v after a forged Down, want Up", p.a.State())
	}
}

// sha1Auth is a Keyed SHA1 authentication for tests.
func sha1Auth(typ AuthType, id uint8, key string) *Auth {
	return &Auth{Type: typ, KeyID: id, Key: []byte(key)}
}

// TestSHA1Layout checks a signed packet against RFC 5880 sections 4.4 and
// 6.7.4 computed by hand: A bit, length 52, auth type 4, auth len 28, key
// ID, reserved 0, sequence number, and the SHA1 of the packet with the
// key padded to 20 bytes in place of the digest.
func TestSHA1Layout(t *testing.T) {
	s := NewSession(0x01020304, fast)
	s.SetAuth(sha1Auth(AuthKeyedSHA1, 5, "vipcast"), 99)
	b := s.AppendPacket(nil, false)
	if len(b) != 52 || b[1]&0x04 == 0 || b[3] != 52 || b[24] != 4 || b[25] != 28 || b[26] != 5 || b[27] != 0 || binary.BigEndian.Uint32(b[28:]) != 100 {
		t.Fatalf("signed packet % x: want A bit, length 52, type 4, len 28, key ID 5, sequence 100", b)
	}
	var in [52]byte
	copy(in[:], b)
	clear(in[32:])
	copy(in[32:], "vipcast")
	if want := sha1.Sum(in[:]); string(b[32:]) != string(want[:]) { //nolint:gosec // as above
		t.Fatalf("digest % x, want % x", b[32:], want)
	}
	c, err := Unmarshal(b)
	if err != nil || !c.AuthPresent || c.AuthType != AuthKeyedSHA1 || c.AuthKeyID != 5 || c.AuthSeq != 100 {
		t.Fatalf("Unmarshal: %+v, %v", c, err)
	}
}

// TestAuthenticatedHandshake: two sessions with the same key come Up;
// with different keys, key IDs or types, or authentication on one side
// only, every packet is discarded for its reason and neither leaves Down.
func TestAuthenticatedHandshake(t *testing.T) {
	key := sha1Auth(AuthMeticulousKeyedSHA1, 1, "0123456789abcdefghij")
	p := newPair(fast, fast)
	p.a.SetAuth(key, 1000)
	p.b.SetAuth(key, 1<<32-2) // wraps around
	for range 4 {
		p.exchange(t)
	}
	if p.a.State() != Up || p.b.State() != Up {
		t.Fatalf("authenticated pair %v/%v, want Up", p.a.State(), p.b.State())
	}
	for _, tc := range []struct {
		name string
		a, b *Auth
		want error
	}{
		{"other key", key, sha1Auth(AuthMeticulousKeyedSHA1, 1, "0123456789abcdefghiX"), ErrAuthDigest},
		{"other key ID", key, sha1Auth(AuthMeticulousKeyedSHA1, 2, "0123456789abcdefghij"), ErrAuthKey},
		{"other type", key, sha1Auth(AuthKeyedSHA1, 1, "0123456789abcdefghij"), ErrAuthKey},
		{"only a authenticates", key, nil, ErrAuthMissing},
		{"only b authenticates", nil, key, ErrAuthRequired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(fast, fast)
			p.a.SetAuth(tc.a, 1)
			p.b.SetAuth(tc.b, 1)
			for range 4 {
				if _, err := p.deliver(p.b, p.a, false); !errors.Is(err, tc.want) {
					t.Fatalf("b to a: %v, want %v", err, tc.want)
				}
			}
			if p.a.State() != Down {
				t.Fatalf("a is %v, want Down", p.a.State())
			}
		})
	}
}

// TestAuthSequence checks the receive window of RFC 5880 section 6.7.4:
// Keyed SHA1 accepts the last number again and up to 3 x DetectMult
// ahead; Meticulous Keyed SHA1 requires a greater one, so a replayed
// packet is discarded; after two detection times without a packet any
// number is accepted again.
func TestAuthSequence(t *testing.T) {
	for _, typ := range []AuthType{AuthKeyedSHA1, AuthMeticulousKeyedSHA1} {
		t.Run(typ.String(), func(t *testing.T) {
			key := sha1Auth(typ, 3, "k")
			p := newPair(fast, fast)
			p.a.SetAuth(key, 500)
			p.b.SetAuth(key, 7)
			for range 4 {
				p.exchange(t)
			}
			if p.a.State() != Up {
				t.Fatalf("a %v, want Up", p.a.State())
			}
			at := func(seq uint32) error {
				c := p.b.packet(false)
				c.AuthPresent, c.AuthType, c.AuthKeyID, c.AuthSeq = true, typ, 3, seq
				b := c.Marshal(nil)
				Sign(b, key.Key)
				parsed, err := Unmarshal(b)
				if err != nil {
					t.Fatal(err)
				}
				return p.a.Accept(parsed, b, p.now)
			}
			last := p.a.rcvSeq
			replay := at(last)
			if typ == AuthKeyedSHA1 && replay != nil || typ == AuthMeticulousKeyedSHA1 && !errors.Is(replay, ErrAuthSeq) {
				t.Fatalf("the last number again: %v", replay)
			}
			if err := at(last - 1); !errors.Is(err, ErrAuthSeq) {
				t.Fatalf("an older number: %v, want ErrAuthSeq", err)
			}
			if err := at(last + 3*3 + 1); !errors.Is(err, ErrAuthSeq) {
				t.Fatalf("beyond 3 x DetectMult: %v, want ErrAuthSeq", err)
			}
			if err := at(last + 3*3); err != nil {
				t.Fatalf("3 x DetectMult ahead: %v", err)
			}
			// A valid number with a tampered packet fails the digest.
			c := p.b.Packet(false)
			c.AuthSeq = p.a.rcvSeq + 1
			b := c.Marshal(nil)
			Sign(b, key.Key)
			b[2] = 9 // detect multiplier
			parsed, _ := Unmarshal(b)
			if err := p.a.Accept(parsed, b, p.now); !errors.Is(err, ErrAuthDigest) {
				t.Fatalf("tampered packet: %v, want ErrAuthDigest", err)
			}
			p.now = p.now.Add(time.Minute)
			if err := at(last + 1<<31); err != nil {
				t.Fatalf("after a long silence any number: %v", err)
			}
		})
	}
}

// TestAuthValidate refuses what the package cannot run.
func TestAuthValidate(t *testing.T) {
	for _, a := range []*Auth{
		{Type: AuthKeyedMD5, Key: []byte("k")},
		{Type: AuthSimplePassword, Key: []byte("k")},
		{Type: AuthKeyedSHA1},
		{Type: AuthKeyedSHA1, Key: make([]byte, 21)},
	} {
		if a.Validate() == nil {
			t.Errorf("%v with a %d-byte key accepted", a, len(a.Key))
		}
	}
	if err := sha1Auth(AuthMeticulousKeyedSHA1, 0, "12345678901234567890").Validate(); err != nil {
		t.Error(err)
	}
	if s := sha1Auth(AuthKeyedSHA1, 1, "hunter2").String(); s != "keyed SHA1 key ID 1" {
		t.Errorf("String() = %q: it must name the type and ID and never the key", s)
	}
}

// FuzzReceive feeds arbitrary bytes through Unmarshal, Accept and Receive
// to sessions in every state, with and without authentication: nothing
// panics, and an Up session accepts nothing from another discriminator
// than its peer's, nor unauthenticated packets when it authenticates.
func FuzzReceive(f *testing.F) {
	c := Control{State: Down, DetectMult: 3, MyDiscriminator: 2, YourDiscriminator: 0, DesiredMinTx: time.Second}
	f.Add(c.Marshal(nil), uint8(0), false)
	c.State, c.YourDiscriminator = Up, 1
	f.Add(c.Marshal(nil), uint8(3), false)
	c.AuthPresent, c.AuthType, c.AuthKeyID, c.AuthSeq = true, AuthKeyedSHA1, 1, 9
	signed := c.Marshal(nil)
	Sign(signed, []byte("k"))
	f.Add(signed, uint8(3), true)
	f.Fuzz(func(t *testing.T, b []byte, state uint8, auth bool) {
		p, err := Unmarshal(b)
		if err != nil {
			if Reason(err) == "other" {
				t.Fatalf("%v has no reason label", err)
			}
			return
		}
		s := sessionIn(t, State(state%4))
		if auth {
			s.SetAuth(sha1Auth(AuthKeyedSHA1, 1, "k"), 0)
		}
		before, peer := s.State(), s.RemoteDiscriminator()
		if err := s.Accept(p, b, t0); err != nil {
			if Reason(err) == "other" {
				t.Fatalf("%v has no reason label", err)
			}
			return
		}
		if before == Up && p.MyDiscriminator != peer {
			t.Fatalf("Up session accepted My Discriminator %d, its peer is %d", p.MyDiscriminator, peer)
		}
		if auth && !p.AuthPresent {
			t.Fatal("authenticating session accepted an unauthenticated packet")
		}
		s.Receive(p, t0)
	})
}

// TestKeyNeverPrinted: an Auth printed with fmt in every usual way, or
// marshalled to JSON (klog's JSON format), does not show its key.
func TestKeyNeverPrinted(t *testing.T) {
	a := Auth{Type: AuthKeyedSHA1, KeyID: 1, Key: Key("hunter2")}
	type peer struct{ Auth *Auth }
	js, err := json.Marshal(peer{&a})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{fmt.Sprint(a), fmt.Sprintf("%+v", a), fmt.Sprintf("%#v", a), fmt.Sprintf("%v", &a), fmt.Sprintf("%+v", peer{&a}), fmt.Sprint(a.Key), string(js)} {
		if strings.Contains(s, "hunter2") || strings.Contains(s, "68756e74657232") {
			t.Errorf("printed key: %s", s)
		}
	}
}

// BenchmarkReceive measures what the reception rules and authentication
// cost per received packet on an Up session (Unmarshal, Accept and
// Receive; make bench prints it): none, Keyed SHA1 and Meticulous Keyed
// SHA1 (a SHA1 over 52 bytes per packet).
func BenchmarkReceive(b *testing.B) {
	for _, tc := range []struct {
		name string
		auth *Auth
	}{
		{"none", nil},
		{"keyed-sha1", sha1Auth(AuthKeyedSHA1, 1, "a shared key")},
		{"meticulous-keyed-sha1", sha1Auth(AuthMeticulousKeyedSHA1, 1, "a shared key")},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p := newPair(fast, fast)
			p.a.SetAuth(tc.auth, 1)
			p.b.SetAuth(tc.auth, 1)
			for range 4 {
				if _, err := p.deliver(p.a, p.b, false); err != nil {
					b.Fatal(err)
				}
				if _, err := p.deliver(p.b, p.a, false); err != nil {
					b.Fatal(err)
				}
			}
			if p.a.State() != Up {
				b.Fatalf("a is %v, want Up", p.a.State())
			}
			pkts := make([][]byte, 1024)
			for i := range pkts {
				pkts[i] = p.b.AppendPacket(nil, false)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				raw := pkts[i%len(pkts)]
				if i%len(pkts) == 0 && i > 0 {
					// Sequence numbers must keep growing: re-sign.
					b.StopTimer()
					for j := range pkts {
						pkts[j] = p.b.AppendPacket(pkts[j][:0], false)
					}
					b.StartTimer()
				}
				c, err := Unmarshal(raw)
				if err != nil {
					b.Fatal(err)
				}
				if err := p.a.Accept(c, raw, p.now); err != nil {
					b.Fatal(err)
				}
				p.a.Receive(c, p.now)
			}
		})
	}
}
