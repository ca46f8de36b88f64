package bgptest

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
)

var target = Target{ASN: 65010, NextHop: netip.MustParseAddr("192.0.2.1"), Prefix: netip.MustParsePrefix("10.99.1.0/24")}

// TestAdvisoryPayloads checks that the messages built for the reports that
// published their bytes are those bytes.
func TestAdvisoryPayloads(t *testing.T) {
	published := map[string]string{
		// osrg/gobgp#3308 (GHSA-8rxh-r2p6-7f2q).
		"AS4_PATH with a bad flag": "ffffffffffffffffffffffffffffffff002202" + "0000" + "000b" + "40110102" + "400204ffffdead",
		// osrg/gobgp#3305 (GHSA-4p9m-8gc4-rw2h), as in gobgp's own regression test.
		"NEXT_HOP of length 2": "ffffffffffffffffffffffffffffffff002802" + "0000" + "000d" + "40010102" + "400200" + "4003020102" + "0118c0a801",
	}
	found := 0
	for _, a := range target.Advisories() {
		for prefix, want := range published {
			if !strings.HasPrefix(a.Name, prefix) {
				continue
			}
			found++
			if got := hex.EncodeToString(a.Msg); got != want {
				t.Errorf("%s:\n got %s\nwant %s", a.Name, got, want)
			}
		}
	}
	if found != len(published) {
		t.Errorf("found %d of the %d published payloads", found, len(published))
	}
}

// TestAdvisoryFirst checks the message of the issue: ORIGIN, AS4_PATH,
// NEXT_HOP and AS_PATH last, each well formed, with the NLRI.
func TestAdvisoryFirst(t *testing.T) {
	a := target.Advisories()[0]
	want := "ffffffffffffffffffffffffffffffff" + "0038" + "02" + "0000" + "001d" +
		"40010100" + // ORIGIN IGP
		"c011060201" + "0000fdf2" + // AS4_PATH, optional transitive: AS_SEQUENCE 65010
		"400304c0000201" + // NEXT_HOP 192.0.2.1
		"400206" + "0201" + "0000fdf2" + // AS_PATH: AS_SEQUENCE 65010
		"180a6301" // 10.99.1.0/24
	if got := hex.EncodeToString(a.Msg); got != want {
		t.Errorf("%s:\n got %s\nwant %s", a.Name, got, want)
	}
}

// TestFuzzedDeterministic checks that a seed always gives the same corpus,
// that another seed gives another, and that every message fits a BGP
// message with a header length that is its own.
func TestFuzzedDeterministic(t *testing.T) {
	a, b, c := target.Fuzzed(29, 300), target.Fuzzed(29, 300), target.Fuzzed(30, 300)
	same, differ := true, false
	for i := range a {
		same = same && bytes.Equal(a[i].Msg, b[i].Msg) && a[i].Name == b[i].Name
		differ = differ || !bytes.Equal(a[i].Msg, c[i].Msg)
		m := a[i].Msg
		if len(m) > 4096 || int(m[16])<<8|int(m[17]) != len(m) || m[18] != MsgUpdate {
			t.Errorf("%s: %d octets, header %x", a[i].Name, len(m), m[16:19])
		}
	}
	if !same || !differ {
		t.Errorf("seed 29 twice the same: %v; seed 30 different: %v", same, differ)
	}
}
