package bfd

import (
	"encoding/hex"
	"errors"
	"testing"
	"time"
)

// TestMarshalLayout checks the wire layout against a packet written out by
// hand from RFC 5880 section 4.1: version 1, diag 3, state Up, P and C
// bits, multiplier 3, length 24, discriminators 0x11223344 and 0x55667788,
// intervals 300 ms, 100 ms and 0.
func TestMarshalLayout(t *testing.T) {
	c := Control{Diag: DiagNeighborDown, State: Up, Poll: true, ControlPlaneIndependent: true, DetectMult: 3,
		MyDiscriminator: 0x11223344, YourDiscriminator: 0x55667788,
		DesiredMinTx: 300 * time.Millisecond, RequiredMinRx: 100 * time.Millisecond}
	got := hex.EncodeToString(c.Marshal(nil))
	const want = "23" + "e8" + "03" + "18" + "11223344" + "55667788" + "000493e0" + "000186a0" + "00000000"
	if got != want {
		t.Fatalf("Marshal = %s, want %s", got, want)
	}
	back, err := Unmarshal(c.Marshal(nil))
	if err != nil {
		t.Fatal(err)
	}
	c.Version, c.Length = Version, controlLen
	if back != c {
		t.Fatalf("Unmarshal(Marshal(c)) = %+v, want %+v", back, c)
	}
}

// TestUnmarshalDiscards checks each reason RFC 5880 section 6.8.6 gives to
// discard a packet before a session is looked up.
func TestUnmarshalDiscards(t *testing.T) {
	good := Control{State: Down, DetectMult: 3, MyDiscriminator: 7, DesiredMinTx: time.Second, RequiredMinRx: time.Second}
	cases := []struct {
		name string
		edit func(b []byte) []byte
		want error
	}{
		{"short", func(b []byte) []byte { return b[:23] }, ErrShort},
		{"version 0", func(b []byte) []byte { b[0] &^= 0xe0; return b }, ErrVersion},
		{"version 2", func(b []byte) []byte { b[0] = b[0]&0x1f | 2<<5; return b }, ErrVersion},
		{"length below 24", func(b []byte) []byte { b[3] = 20; return b }, ErrLength},
		{"length beyond the packet", func(b []byte) []byte { b[3] = 26; return b }, ErrLength},
		{"authentication, length 24", func(b []byte) []byte { b[1] |= 0x04; return append(b, 1, 2) }, ErrLength},
		{"authentication section beyond the length", func(b []byte) []byte { b[1] |= 0x04; b[3] = 26; return append(b, 1, 3, 0) }, ErrAuthLength},
		{"keyed SHA1 section of 24 bytes", func(b []byte) []byte {
			b[1] |= 0x04
			b[3] = 48
			return append(append(b, byte(AuthKeyedSHA1), 24), make([]byte, 22)...)
		}, ErrAuthLength},
		{"simple password (the session decides)", func(b []byte) []byte { b[1] |= 0x04; b[3] = 28; return append(b, 1, 4, 1, 'x') }, nil},
		{"multiplier 0", func(b []byte) []byte { b[2] = 0; return b }, ErrDetectMult},
		{"multipoint", func(b []byte) []byte { b[1] |= 0x01; return b }, ErrMultipoint},
		{"my discriminator 0", func(b []byte) []byte { copy(b[4:8], []byte{0, 0, 0, 0}); return b }, ErrMyDiscr},
		{"your discriminator 0 in Up", func(b []byte) []byte { b[1] = b[1]&0x3f | byte(Up)<<6; return b }, ErrYourDiscr},
		{"your discriminator 0 in Init", func(b []byte) []byte { b[1] = b[1]&0x3f | byte(Init)<<6; return b }, ErrYourDiscr},
		{"longer packet, length 24", func(b []byte) []byte { return append(b, 0, 0, 0, 0) }, nil},
		{"your discriminator 0 in AdminDown", func(b []byte) []byte { b[1] &= 0x3f; return b }, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Unmarshal(tc.edit(good.Marshal(nil)))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Unmarshal: %v, want %v", err, tc.want)
			}
		})
	}
}

// TestMicrosSaturate checks the interval fields' edges.
func TestMicrosSaturate(t *testing.T) {
	for d, want := range map[time.Duration]uint32{-time.Second: 0, 0: 0, time.Microsecond: 1, 2 * time.Hour: 1<<32 - 1} {
		if got := micros(d); got != want {
			t.Errorf("micros(%v) = %d, want %d", d, got, want)
		}
	}
}

// FuzzUnmarshal checks that no input crashes Unmarshal and that every
// accepted packet survives a round trip.
func FuzzUnmarshal(f *testing.F) {
	c := Control{State: Up, DetectMult: 3, MyDiscriminator: 1, YourDiscriminator: 2, DesiredMinTx: time.Second}
	f.Add(c.Marshal(nil))
	f.Add([]byte{})
	c.AuthPresent, c.AuthType, c.AuthKeyID, c.AuthSeq = true, AuthKeyedSHA1, 7, 42
	signed := c.Marshal(nil)
	Sign(signed, []byte("secret"))
	f.Add(signed)
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Unmarshal(b)
		if err != nil {
			return
		}
		if p.AuthPresent && !p.AuthType.sha1() {
			return // Marshal sends no other type
		}
		back, err := Unmarshal(p.Marshal(nil))
		if err != nil {
			t.Fatalf("re-encoded packet refused: %v", err)
		}
		p.Length = controlLen
		if p.AuthPresent {
			p.Length = sha1Len
		}
		if back != p {
			t.Fatalf("round trip changed %+v to %+v", p, back)
		}
	})
}
