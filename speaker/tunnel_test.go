package speaker

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
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
		{"2001:db8::/64", "10.0.0.1", "", "want an IPv4 prefix"},
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

func TestTunnels(t *testing.T) {
	a := netip.MustParseAddr
	got, problems := Tunnels(netip.MustParsePrefix("100.127.0.0/16"), map[string]netip.Addr{
		"n1": a("10.0.0.11"), "n2": a("10.0.0.12"),
		"x1": a("10.1.0.20"), "x2": a("10.2.0.20"), // same low 16 bits
		"v6": a("2001:db8::1"), "none": {},
	})
	want := map[string]netip.Addr{"n1": a("100.127.0.11"), "n2": a("100.127.0.12")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Tunnels = %v, want %v", got, want)
	}
	wantProblems := []string{"node none has no tunnel address", "node v6 has no tunnel address", "nodes [x1 x2] would share tunnel address 100.127.0.20"}
	if len(problems) != len(wantProblems) {
		t.Fatalf("problems %q, want %d", problems, len(wantProblems))
	}
	for i, w := range wantProblems {
		if !strings.Contains(problems[i], w) {
			t.Errorf("problem %d = %q, want it to contain %q", i, problems[i], w)
		}
	}
}
