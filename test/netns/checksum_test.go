package netns

import (
	"encoding/hex"
	"testing"
)

// TestIPv4HeaderChecksum checks the inner header's checksum SpoofIPIP
// computes against a header with a known checksum (0xb861).
func TestIPv4HeaderChecksum(t *testing.T) {
	h, err := hex.DecodeString("450000730000400040110000c0a80001c0a800c7")
	if err != nil {
		t.Fatal(err)
	}
	if got := ipv4HeaderChecksum(h); got != 0xb861 {
		t.Errorf("checksum %#04x, want 0xb861", got)
	}
}
