package routers

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestFRRRoutes checks that Routes reads locally originated routes.
func TestFRRRoutes(t *testing.T) {
	nets := []netip.Prefix{netip.MustParsePrefix("10.7.0.0/24"), netip.MustParsePrefix("10.7.1.0/24"), netip.MustParsePrefix("fd00:7::/64")}
	f := StartFRR(t, FRRConfig{ListenAddress: netip.MustParseAddr("127.0.7.1"), Networks: nets})
	// bgpd selects the best paths after it announced itself started:
	// right after the start they may be there without it.
	var r map[netip.Prefix][]Path
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if r, err = f.Routes(IPv4); err != nil {
			t.Fatal(err)
		}
		if len(r) == 2 && len(r[nets[1]]) == 1 && r[nets[1]][0].Best || time.Now().After(deadline) {
			break
		}
	}
	if len(r) != 2 || len(r[nets[0]]) != 1 || !r[nets[1]][0].Best {
		out, _ := f.Vtysh("show bgp ipv4 unicast 10.7.0.0/24 json", "show bgp ipv4 unicast 10.7.1.0/24 json")
		t.Fatalf("Routes(IPv4) = %+v\n%s", r, out)
	}
	r, err = f.Routes(IPv6)
	if err != nil || len(r) != 1 {
		t.Fatalf("Routes(IPv6) = %+v, %v", r, err)
	}
}

// TestParseBIRDRoutes checks the parser on BIRD 2.0.12 output.
func TestParseBIRDRoutes(t *testing.T) {
	const out = `BIRD 2.0.12 ready.
Table master4:
10.1.0.1/32          unicast [spk 08:24:15.691 from 127.0.0.6] * (100/?) [AS64512i]
	dev lo
	Type: BGP univ
	BGP.origin: IGP
	BGP.as_path: 64512
	BGP.next_hop: 10.0.0.2
	BGP.local_pref: 100
	BGP.community: (64512,100) (65535,65281)
	BGP.large_community: (64512, 1, 2)
                     unicast [spk2 08:24:15.700 from 127.0.0.7] (100/?) [AS64513i]
	dev lo
	Type: BGP univ
	BGP.origin: IGP
	BGP.as_path: 64513
	BGP.next_hop: 10.0.0.3
	BGP.local_pref: 100
10.0.0.0/8           unicast [nh4 08:24:13.692] * (200)
	dev lo
	Type: static univ

Table master6:
fd00:1::1/128        unicast [spk 08:24:15.692 from 127.0.0.6] * (100/?) [AS64512i]
	dev lo
	Type: BGP univ
	BGP.origin: IGP
	BGP.as_path: 64512
	BGP.next_hop: fd00::2 fe80::1
	BGP.local_pref: 100
`
	r, err := parseBIRDRoutes(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(r) != 2 {
		t.Fatalf("routes = %+v, want 2 prefixes", r)
	}
	p := r[netip.MustParsePrefix("10.1.0.1/32")]
	if len(p) != 2 || !p[0].Best || p[1].Best || p[0].NextHop != netip.MustParseAddr("10.0.0.2") ||
		p[1].Peer != netip.MustParseAddr("127.0.0.7") || p[0].ASPath != "64512" ||
		strings.Join(p[0].Communities, " ") != "64512:100 65535:65281" ||
		strings.Join(p[0].LargeCommunities, " ") != "64512:1:2" || *p[0].LocalPref != 100 {
		t.Errorf("10.1.0.1/32 = %+v", p)
	}
	if p := r[netip.MustParsePrefix("fd00:1::1/128")]; len(p) != 1 || p[0].NextHop != netip.MustParseAddr("fd00::2") {
		t.Errorf("fd00:1::1/128 = %+v", p)
	}
}

// TestLeakPrefix checks the prefixes BIRDConfig.Leak sends.
func TestLeakPrefix(t *testing.T) {
	for i, want := range map[int]string{0: "20.0.0.0/24", 1: "20.0.1.0/24", 256: "20.1.0.0/24", 99_999: "21.134.159.0/24"} {
		if got := LeakPrefix(i).String(); got != want {
			t.Errorf("LeakPrefix(%d) = %s, want %s", i, got, want)
		}
	}
}
