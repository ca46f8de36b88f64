package ipvs

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// Authentication between relays (SyncKeys). Every datagram a relay sends
// carries a trailer after the sync message:
//
//	"VC" | key ID (1 byte) | 0 | send time (Unix milliseconds, 8 bytes)
//	HMAC-SHA256 of the message and the 12 bytes before, its first 16 bytes
//
// A relay with keys signs with the highest key ID and takes a datagram
// only if its trailer verifies with the key of that ID and its send time
// is within syncMaxSkew of the relay's clock; the trailer is removed
// before the message goes on. Rotation: add a key of a higher ID to the
// Secret, then, once every node has it, remove the old one. While some
// nodes have the new key and others not yet (the kubelet updates a mounted
// Secret within about a minute), the messages of the first to the second
// are dropped and counted: connection sync is lost for that while, not
// the connections.

const (
	syncTrailerLen = 28
	syncMACLen     = 16
	// syncMaxSkew is how far a datagram's send time may be from the
	// receiver's clock: it bounds replays of a recorded datagram to that
	// window. Nodes keep their clocks within it with NTP.
	syncMaxSkew = 30 * time.Second
	// syncMinKeyLen is the shortest key taken.
	syncMinKeyLen = 32
)

// Why a relay with keys drops a datagram.
const (
	SyncDropUnsigned   = "unsigned"
	SyncDropUnknownKey = "unknown-key"
	SyncDropBadMAC     = "bad-mac"
	SyncDropStale      = "stale"
)

// SyncKeys are the keys relays authenticate each other with, by key ID
// (1 to 255). The zero value has none: datagrams go unsigned, and the relay
// takes them from the other nodes' addresses alone.
type SyncKeys struct {
	keys map[uint8][]byte
	send uint8
}

// Len returns how many keys k holds.
func (k SyncKeys) Len() int { return len(k.keys) }

// SendID returns the ID of the key k signs with (0: none).
func (k SyncKeys) SendID() uint8 { return k.send }

// Equal reports whether k and o hold the same keys.
func (k SyncKeys) Equal(o SyncKeys) bool {
	if len(k.keys) != len(o.keys) {
		return false
	}
	for id, b := range k.keys {
		if !hmac.Equal(b, o.keys[id]) {
			return false
		}
	}
	return true
}

// NewSyncKeys builds SyncKeys from keys by ID; each ID is 1 to 255 and
// each key at least syncMinKeyLen bytes.
func NewSyncKeys(keys map[int][]byte) (SyncKeys, error) {
	out := SyncKeys{keys: map[uint8][]byte{}}
	for id, b := range keys {
		if id < 1 || id > 255 {
			return SyncKeys{}, fmt.Errorf("connection sync key ID %d: want 1 to 255", id)
		}
		if len(b) < syncMinKeyLen {
			return SyncKeys{}, fmt.Errorf("connection sync key %d: %d bytes, want at least %d (64 random characters, say)", id, len(b), syncMinKeyLen)
		}
		out.keys[uint8(id)] = slices.Clone(b) //nolint:gosec // checked: 1..255
		out.send = max(out.send, uint8(id))   //nolint:gosec // checked: 1..255
	}
	return out, nil
}

// LoadSyncKeys reads the keys in dir, a mounted Secret: one file per key,
// named by its ID (1 to 255), holding the key. Other entries (the
// kubelet's ..data links and dot files) are skipped; a file named like a
// number out of range, or a key too short, is an error.
func LoadSyncKeys(dir string) (SyncKeys, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return SyncKeys{}, fmt.Errorf("connection sync keys: %w", err)
	}
	keys := map[int][]byte{}
	for _, e := range ents {
		id, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name())) //nolint:gosec // G304: a key file of the directory the operator named
		if err != nil {
			return SyncKeys{}, fmt.Errorf("connection sync key %s: %w", e.Name(), err)
		}
		keys[id] = b
	}
	k, err := NewSyncKeys(keys)
	if err != nil {
		return SyncKeys{}, fmt.Errorf("%s: %w", dir, err)
	}
	if k.Len() == 0 {
		return SyncKeys{}, fmt.Errorf("connection sync keys: no key in %s: want files named 1 to 255", dir)
	}
	return k, nil
}

// seal returns msg with k's trailer for send time now, or msg itself when
// k has no key.
func (k SyncKeys) seal(msg []byte, now time.Time) []byte {
	key := k.keys[k.send]
	if key == nil {
		return msg
	}
	out := make([]byte, len(msg), len(msg)+syncTrailerLen)
	copy(out, msg)
	out = append(out, 'V', 'C', k.send, 0)
	out = binary.BigEndian.AppendUint64(out, uint64(now.UnixMilli())) //nolint:gosec // after 1970
	return append(out, syncMAC(key, out)...)
}

// open returns the message of datagram b, checked and without its
// trailer, or the reason (SyncDrop*) it is refused. With no key, b is
// taken as it is.
func (k SyncKeys) open(b []byte, now time.Time) ([]byte, error) {
	if len(k.keys) == 0 {
		return b, nil
	}
	if len(b) < syncHeaderLen+syncTrailerLen {
		return nil, errors.New(SyncDropUnsigned)
	}
	t := b[len(b)-syncTrailerLen:]
	if t[0] != 'V' || t[1] != 'C' || t[3] != 0 {
		return nil, errors.New(SyncDropUnsigned)
	}
	key := k.keys[t[2]]
	if key == nil {
		return nil, errors.New(SyncDropUnknownKey)
	}
	signed := b[:len(b)-syncMACLen]
	if !hmac.Equal(syncMAC(key, signed), b[len(b)-syncMACLen:]) {
		return nil, errors.New(SyncDropBadMAC)
	}
	sent := time.UnixMilli(int64(binary.BigEndian.Uint64(t[4:12]))) //nolint:gosec // a time, any value is safe
	if d := now.Sub(sent); d > syncMaxSkew || d < -syncMaxSkew {
		return nil, errors.New(SyncDropStale)
	}
	return b[:len(b)-syncTrailerLen], nil
}

// syncMAC is the truncated HMAC-SHA256 of b under key.
func syncMAC(key, b []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(b)
	return m.Sum(nil)[:syncMACLen]
}
