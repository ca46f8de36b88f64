package bgp_test

import (
	"strings"
	"testing"
	"time"

	"github.com/vipcast/vipcast/bgp"
)

// TestValidation checks the errors of SetPeers and Apply on bad input;
// it needs no router.
func TestValidation(t *testing.T) {
	s, _ := newSpeaker(t, "127.0.11.2")
	ok := bgp.Peer{Name: "a", Address: ip("127.0.11.1"), ASN: 65000, LocalASN: 64512}
	for name, tc := range map[string]struct {
		peers []bgp.Peer
		want  string
	}{
		"no name":            {[]bgp.Peer{{Address: ip("127.0.11.1"), ASN: 1, LocalASN: 2}}, "no name"},
		"no address":         {[]bgp.Peer{{Name: "a", ASN: 1, LocalASN: 2}}, "no address"},
		"no ASN":             {[]bgp.Peer{{Name: "a", Address: ip("127.0.11.1")}}, "ASN"},
		"duplicate name":     {[]bgp.Peer{ok, ok}, "twice"},
		"same address":       {[]bgp.Peer{ok, {Name: "b", Address: ok.Address, ASN: 1, LocalASN: 2}}, "same address"},
		"short hold":         {[]bgp.Peer{{Name: "a", Address: ip("127.0.11.1"), ASN: 1, LocalASN: 2, HoldTime: time.Second}}, "below 3s"},
		"negative keepalive": {[]bgp.Peer{{Name: "a", Address: ip("127.0.11.1"), ASN: 1, LocalASN: 2, KeepaliveTime: -time.Second}}, "keepalive"},
		"negative restart":   {[]bgp.Peer{{Name: "a", Address: ip("127.0.11.1"), ASN: 1, LocalASN: 2, GracefulRestart: true, RestartTime: -time.Second}}, "restart time"},
		"family mix":         {[]bgp.Peer{{Name: "a", Address: ip("127.0.11.1"), ASN: 1, LocalASN: 2, SourceAddress: ip("::1")}}, "family"},
	} {
		err := s.SetPeers(ctxT(), tc.peers)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: SetPeers error = %v, want one containing %q", name, err, tc.want)
		}
	}
	for name, r := range map[string]bgp.Route{
		"no prefix":        {NextHop: ip("10.0.0.2")},
		"no next hop":      {Prefix: pfx("10.11.0.1/32")},
		"family mismatch":  {Prefix: pfx("10.11.0.1/32"), NextHop: ip("fd00::2")},
		"family mismatch6": {Prefix: pfx("fd00:11::1/128"), NextHop: ip("10.0.0.2")},
	} {
		if err := s.Apply(ctxT(), []bgp.Route{r}, nil); err == nil {
			t.Errorf("%s: Apply accepted %+v", name, r)
		}
	}
	if _, err := bgp.New(bgp.Config{RouterID: ip("fd00::1")}); err == nil {
		t.Error("New accepted an IPv6 router ID")
	}
	// No peers: announcing and withdrawing still works.
	if err := s.Apply(ctxT(), []bgp.Route{{Prefix: pfx("10.11.0.1/32"), NextHop: ip("10.0.0.2"), Peers: []string{"x"}}}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.SetPeers(ctxT(), []bgp.Peer{ok}); err != nil {
		t.Fatal(err)
	}
	ss, err := s.Sessions(ctxT())
	if err != nil || len(ss) != 1 || ss[0].Established() || ss[0].Announced != 0 {
		t.Errorf("Sessions = %+v, %v", ss, err)
	}
	if err := s.SetPeers(ctxT(), nil); err != nil {
		t.Fatal(err)
	}
	if ss, err := s.Sessions(ctxT()); err != nil || len(ss) != 0 {
		t.Errorf("Sessions after removing every peer = %+v, %v", ss, err)
	}
}
