package speaker

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vipcast/vipcast/bgp"
)

func TestTunnelAddress(t *testing.T) {
	for _, tc := range []struct {
		prefix, node, want, err string
	}{
		{"100.127.0.0/16", "10.0.0.11", "100.127.0.11", ""},
		{"100.127.0.0/16", "10.0.3.250", "100.127.3.250", ""},
		{"100.127.0.0/20", "10.0.19.5", "100.127.3.5", ""},
		{"100.127.0.0/12", "10.0.19.5", "100.112.19.5", ""},
		{"100.127.0.0/16", "::ffff:10.0.0.11", "100.127.0.11", ""},
		{"100.127.0.0/16", "10.0.0.0", "", "all zero"},
		{"100.127.0.0/16", "2001:db8::1", "", "want IPv4"},
		{"2001:db8::/64", "10.0.0.1", "", "want IPv6"},
		{"fd00:7f::/64", "fd00:10::11", "fd00:7f::11", ""},
		{"fd00:7f::/64", "2001:db8:1:2:a:b:c:d", "fd00:7f::a:b:c:d", ""},
		{"fd00:7f::/100", "2001:db8::1234:5678", "fd00:7f::0234:5678", ""},
		{"fd00:7f::/64", "2001:db8:1:2::", "", "all zero"},
	} {
		got, err := TunnelAddress(netip.MustParsePrefix(tc.prefix), netip.MustParseAddr(tc.node))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("TunnelAddress(%s, %s) = %v, %v; want an error containing %q", tc.prefix, tc.node, got, err, tc.err)
		case tc.err == "" && (err != nil || got != netip.MustParseAddr(tc.want)):
			t.Errorf("TunnelAddress(%s, %s) = %v, %v; want %s", tc.prefix, tc.node, got, err, tc.want)
		}
	}
}

// TestTunnels: every node's tunnel address of the prefix's family; nodes
// without an address of that family, or that would share one, get none.
func TestTunnels(t *testing.T) {
	a := netip.MustParseAddr
	for _, tc := range []struct {
		prefix       string
		nodes, want  map[string]netip.Addr
		wantProblems []string
	}{
		{
			prefix: "100.127.0.0/16",
			nodes: map[string]netip.Addr{"n1": a("10.0.0.11"), "n2": a("10.0.0.12"),
				"x1": a("10.1.0.20"), "x2": a("10.2.0.20"), // same low 16 bits
				"v6": a("2001:db8::1"), "none": {}},
			want:         map[string]netip.Addr{"n1": a("100.127.0.11"), "n2": a("100.127.0.12")},
			wantProblems: []string{"node none has no tunnel address", "node v6 has no tunnel address", "nodes [x1 x2] would share tunnel address 100.127.0.20"},
		},
		{
			prefix: "fd00:7f::/64",
			nodes: map[string]netip.Addr{"n1": a("fd00:10::11"), "n2": a("fd00:10::12"),
				"x1": a("fd00:11::20"), "x2": a("fd00:12::20"), // same low 64 bits
				"v4": a("10.0.0.1"), "none": {}},
			want:         map[string]netip.Addr{"n1": a("fd00:7f::11"), "n2": a("fd00:7f::12")},
			wantProblems: []string{"node none has no tunnel address", "node v4 has no tunnel address: node address 10.0.0.1: want IPv6", "nodes [x1 x2] would share tunnel address fd00:7f::20"},
		},
	} {
		got, problems := Tunnels(netip.MustParsePrefix(tc.prefix), tc.nodes)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: Tunnels = %v, want %v", tc.prefix, got, tc.want)
		}
		if len(problems) != len(tc.wantProblems) {
			t.Errorf("%s: problems %q, want %d", tc.prefix, problems, len(tc.wantProblems))
			continue
		}
		for i, w := range tc.wantProblems {
			if !strings.Contains(problems[i], w) {
				t.Errorf("%s: problem %d = %q, want it to contain %q", tc.prefix, i, problems[i], w)
			}
		}
	}
}

// TestBFDPeers: the host guard's BFD peers are the addresses of the peers
// with BFD, both families, sorted, each once; peers without BFD are left
// out (their routers get no BFD packets through).
func TestBFDPeers(t *testing.T) {
	a := netip.MustParseAddr
	peers := []bgp.Peer{
		{Name: "tor-b", Address: a("10.0.0.2"), BFD: &bgp.BFD{}},
		{Name: "tor-a", Address: a("10.0.0.1"), BFD: &bgp.BFD{}},
		{Name: "tor-a-again", Address: a("10.0.0.1"), BFD: &bgp.BFD{}},
		{Name: "tor-v6", Address: a("fd00::1"), BFD: &bgp.BFD{}},
		{Name: "route-server", Address: a("10.0.9.9")},
	}
	got := bfdPeers(peers)
	want := []netip.Addr{a("10.0.0.1"), a("10.0.0.2"), a("fd00::1")}
	if !slices.Equal(got, want) {
		t.Errorf("bfdPeers = %v, want %v", got, want)
	}
	if got := bfdPeers(peers[4:]); len(got) != 0 {
		t.Errorf("no peer with BFD: %v, want none", got)
	}
}
