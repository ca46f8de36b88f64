package ipvs

import (
	"strings"
	"testing"
)

// TestCheckSyncMessage: the relay passes on only what the kernel's master
// writes: a version 1 message of its sync ID whose header gives its length.
func TestCheckSyncMessage(t *testing.T) {
	msg := func(b ...byte) []byte { return b }
	for _, tc := range []struct {
		name string
		b    []byte
		id   uint8
		want string // "" for none; else a part of the error
	}{
		{"header only", msg(0, 96, 0, 8, 0, 1, 0, 0), 96, ""},
		{"with a connection's bytes", msg(0, 96, 0, 10, 1, 1, 0, 0, 0xaa, 0xbb), 96, ""},
		{"any sync ID", msg(0, 7, 0, 8, 0, 1, 0, 0), 0, ""},
		{"empty", nil, 96, "shorter than a sync message's header"},
		{"short", msg(0, 96, 0, 7, 0, 1, 0), 96, "shorter"},
		{"version 0 (its first byte is the count)", msg(3, 96, 0, 8, 0, 1, 0, 0), 96, "protocol version 1"},
		{"version 2", msg(0, 96, 0, 8, 0, 2, 0, 0), 96, "protocol version 1"},
		{"length too long", msg(0, 96, 0, 9, 0, 1, 0, 0), 96, "header says 9 bytes, the datagram has 8"},
		{"length too short", msg(0, 96, 0, 8, 0, 1, 0, 0, 0), 96, "header says 8 bytes, the datagram has 9"},
		{"another sync ID", msg(0, 7, 0, 8, 0, 1, 0, 0), 96, "sync ID 7, not 96"},
	} {
		err := checkSyncMessage(tc.b, tc.id)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want none", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// FuzzCheckSyncMessage: no input makes it panic, and whatever it accepts
// is at least a header long and says its own length.
func FuzzCheckSyncMessage(f *testing.F) {
	f.Add([]byte{0, 96, 0, 8, 0, 1, 0, 0}, uint8(96))
	f.Add([]byte{0, 96, 0, 9, 0, 1, 0, 0, 1}, uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, id uint8) {
		if checkSyncMessage(b, id) == nil && (len(b) < syncHeaderLen || int(b[2])<<8|int(b[3]) != len(b)) {
			t.Fatalf("accepted %x", b)
		}
	})
}
