package main

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/vipcast/vipcast/ipvs"
)

// TestParseFlagsPasswordSecrets checks --bgp-password-secrets: a
// comma-separated list of namespace/name (blanks ignored), empty by
// default; a malformed entry or a duplicate is refused naming the flag,
// the entry and the fix, and the removed --bgp-password-namespaces is
// refused naming its replacement.
func TestParseFlagsPasswordSecrets(t *testing.T) {
	base := []string{"--node-name", "n1"}
	nn := func(ns, name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }
	for _, tc := range []struct {
		args    []string
		want    []types.NamespacedName
		wantErr string
	}{
		{args: nil, want: nil},
		{args: []string{"--bgp-password-secrets", "vipcast-bgp-passwords/tor-a-md5"}, want: []types.NamespacedName{nn("vipcast-bgp-passwords", "tor-a-md5")}},
		{args: []string{"--bgp-password-secrets", "a/x, b/y.z,,a/y"}, want: []types.NamespacedName{nn("a", "x"), nn("b", "y.z"), nn("a", "y")}},
		{args: []string{"--bgp-password-secrets", ""}, want: nil},
		{args: []string{"--bgp-password-secrets", "tor-a-md5"}, wantErr: `bgp-password-secrets: "tor-a-md5" is not namespace/name: name each Secret with its namespace, such as vipcast-bgp-passwords/tor-a-md5`},
		{args: []string{"--bgp-password-secrets", "a/b/c"}, wantErr: `"a/b/c" is not namespace/name`},
		{args: []string{"--bgp-password-secrets", "/tor"}, wantErr: `"/tor": "" is not a namespace name`},
		{args: []string{"--bgp-password-secrets", "Fabric/tor"}, wantErr: `bgp-password-secrets: "Fabric/tor": "Fabric" is not a namespace name`},
		{args: []string{"--bgp-password-secrets", "fabric.passwords/tor"}, wantErr: "use lowercase letters, digits and '-'"},
		{args: []string{"--bgp-password-secrets", "fabric/"}, wantErr: `"fabric/": "" is not a Secret name`},
		{args: []string{"--bgp-password-secrets", "fabric/Tor_A"}, wantErr: `"fabric/Tor_A": "Tor_A" is not a Secret name`},
		{args: []string{"--bgp-password-secrets", "a/x,b/y, a/x"}, wantErr: "bgp-password-secrets: a/x is named twice: name each Secret once"},
		{args: []string{"--bgp-password-namespaces", "vipcast-bgp-passwords"}, wantErr: "bgp-password-namespaces: this flag was removed: name each Secret instead with --bgp-password-secrets=<namespace>/<name>"},
		{args: []string{"--bgp-password-namespaces="}, wantErr: "(chart value speaker.bgpPasswordSecrets.secrets)"},
	} {
		f, ok := parseChecked(t, append(slices.Clone(base), tc.args...), tc.wantErr)
		switch {
		case !ok:
		case !slices.Equal(f.passwordSecrets, tc.want):
			t.Errorf("%q: Secrets %v, want %v", tc.args, f.passwordSecrets, tc.want)
		}
	}
}

// TestParseFlagsDataplaneProbe checks --dataplane-probe-period: 2s by
// default, and a period below 100ms refused naming the flag and the fix.
func TestParseFlagsDataplaneProbe(t *testing.T) {
	base := []string{"--node-name", "n1"}
	for _, tc := range []struct {
		args    []string
		want    time.Duration
		wantErr string
	}{
		{args: nil, want: 2 * time.Second},
		{args: []string{"--dataplane-probe-period", "500ms"}, want: 500 * time.Millisecond},
		{args: []string{"--dataplane-probe-period", "10ms"}, wantErr: "--dataplane-probe-period=10ms is too short: use 100ms or more"},
		{args: []string{"--dataplane-probe-period", "0s"}, wantErr: "--dataplane-probe-period=0s is too short"},
	} {
		f, ok := parseChecked(t, append(slices.Clone(base), tc.args...), tc.wantErr)
		if ok && f.dataplaneProbe != tc.want {
			t.Errorf("%q: probe period %v, want %v", tc.args, f.dataplaneProbe, tc.want)
		}
	}
}

// TestParseFlagsOutageSettle checks --outage-settle: 2m by default, 0s
// (off) accepted, a negative value refused naming the flag and the fix.
func TestParseFlagsOutageSettle(t *testing.T) {
	base := []string{"--node-name", "n1"}
	for _, tc := range []struct {
		args    []string
		want    time.Duration
		wantErr string
	}{
		{args: nil, want: 2 * time.Minute},
		{args: []string{"--outage-settle", "0s"}, want: 0},
		{args: []string{"--outage-settle", "90s"}, want: 90 * time.Second},
		{args: []string{"--outage-settle", "-1s"}, wantErr: "--outage-settle=-1s is negative: use 0s (off) or more, such as 2m"},
	} {
		f, ok := parseChecked(t, append(slices.Clone(base), tc.args...), tc.wantErr)
		if ok && f.outageSettle != tc.want {
			t.Errorf("%q: outage settle %v, want %v", tc.args, f.outageSettle, tc.want)
		}
	}
}

// TestParseFlagsTunnel checks --tunnel-prefix and --tunnel-mtu: off by
// default, an IPv4 prefix of /8 to /30 (masked) and optionally an IPv6
// prefix of /32 to /124 after a comma, and each bad value refused naming
// the flag and the fix; and the dataplane options they give a node.
func TestParseFlagsTunnel(t *testing.T) {
	base := []string{"--node-name", "n1"}
	for _, tc := range []struct {
		args    []string
		want    string // the prefix; "" off
		want6   string // the IPv6 prefix; "" none
		wantErr string
	}{
		{args: []string{"--tunnel-prefix", "100.127.0.0/16,fd00:7f::9/64"}, want: "100.127.0.0/16", want6: "fd00:7f::/64"},
		{args: []string{"--tunnel-prefix", "100.127.0.0/16, fd00:7f::/64"}, want: "100.127.0.0/16", want6: "fd00:7f::/64"},
		{args: []string{"--tunnel-prefix", "100.127.0.0/16,10.0.0.0/8"}, wantErr: `"10.0.0.0/8" is not an IPv6 prefix: after the comma give the IPv6 tunnel prefix`},
		{args: []string{"--tunnel-prefix", "100.127.0.0/16,"}, wantErr: `"" is not an IPv6 prefix`},
		{args: []string{"--tunnel-prefix", "100.127.0.0/16,fd00:7f::/127"}, wantErr: "IPv6 prefix fd00:7f::/127: use a length of 32 to 124"},
		{args: []string{"--tunnel-prefix", "fd00:7f::/64,100.127.0.0/16"}, wantErr: `"fd00:7f::/64" is not an IPv4 prefix`},
		{args: nil, want: ""},
		{args: []string{"--tunnel-prefix", "100.127.0.0/16"}, want: "100.127.0.0/16"},
		{args: []string{"--tunnel-prefix", "100.127.9.9/16"}, want: "100.127.0.0/16"},
		{args: []string{"--tunnel-prefix", "100.127.0.0"}, wantErr: `--tunnel-prefix="100.127.0.0": "100.127.0.0" is not an IPv4 prefix`},
		{args: []string{"--tunnel-prefix", "fd00::/64"}, wantErr: "is not an IPv4 prefix"},
		{args: []string{"--tunnel-prefix", "100.127.0.0/31"}, wantErr: "use a length of 8 to 30"},
		{args: []string{"--tunnel-prefix", "100.127.0.0/16", "--ipvs=false"}, wantErr: "--tunnel-prefix needs the IPVS dataplane"},
		{args: []string{"--tunnel-mtu", "100"}, wantErr: "--tunnel-mtu=100 is out of 576..65535"},
		{args: []string{"--conn-sync-id", "256"}, wantErr: "--conn-sync-id=256 is out of 0..255"},
		{args: []string{"--conn-sync-id", "-1"}, wantErr: "--conn-sync-id=-1 is out of 0..255"},
		{args: []string{"--conn-sync-interface", ""}, wantErr: `--conn-sync-interface="" is not a link name: use "auto", "none"`},
		{args: []string{"--conn-sync-interface", "a-very-long-link-name"}, wantErr: "is not a link name"},
		{args: []string{"--conn-sync-interface", "eth0/1"}, wantErr: "is not a link name"},
		{args: []string{"--conn-sync-transport", "unicast"}, wantErr: `--conn-sync-transport="unicast": use "multicast" (one L2 segment) or "relay"`},
		{args: []string{"--conn-sync-transport", "relay", "--conn-sync-interface", "eth0"}, wantErr: "--conn-sync-interface=eth0 with --conn-sync-transport=relay: the relay's daemons run on their own veth pair"},
		{args: []string{"--speaker-service", "vipcast-system/vipcast-speaker"}, wantErr: "--speaker-service=vipcast-system/vipcast-speaker without --tunnel-prefix"},
		{args: []string{"--speaker-service", "vipcast-speaker", "--tunnel-prefix", "100.127.0.0/16"}, wantErr: `--speaker-service="vipcast-speaker" is not namespace/name`},
		{args: []string{"--speaker-service", "ns/a/b", "--tunnel-prefix", "100.127.0.0/16"}, wantErr: "is not namespace/name"},
		{args: []string{"--conn-sync-key-dir", "/keys"}, wantErr: "--conn-sync-key-dir=/keys without the relay: the keys sign the relay's datagrams"},
		{args: []string{"--conn-sync-key-dir", "/keys", "--conn-sync-transport", "relay", "--conn-sync-interface", "none"}, wantErr: "--conn-sync-key-dir=/keys without the relay"},
		{args: []string{"--conn-sync-relay-port", "0"}, wantErr: "--conn-sync-relay-port=0 is out of 1..65535"},
		{args: []string{"--conn-sync-relay-port", "65536"}, wantErr: "--conn-sync-relay-port=65536 is out of 1..65535"},
	} {
		f, ok := parseChecked(t, append(slices.Clone(base), tc.args...), tc.wantErr)
		switch {
		case !ok:
		case tc.want == "" && f.tunnelPrefix.IsValid():
			t.Errorf("%q: prefix %v, want none", tc.args, f.tunnelPrefix)
		case tc.want != "" && f.tunnelPrefix != netip.MustParsePrefix(tc.want):
			t.Errorf("%q: prefix %v, want %s", tc.args, f.tunnelPrefix, tc.want)
		case tc.want6 == "" && f.tunnelPrefix6.IsValid():
			t.Errorf("%q: IPv6 prefix %v, want none", tc.args, f.tunnelPrefix6)
		case tc.want6 != "" && f.tunnelPrefix6 != netip.MustParsePrefix(tc.want6):
			t.Errorf("%q: IPv6 prefix %v, want %s", tc.args, f.tunnelPrefix6, tc.want6)
		}
	}

	f, err := parseFlags(append(slices.Clone(base), "--tunnel-prefix", "100.127.0.0/16", "--tunnel-mtu", "9000"))
	if err != nil {
		t.Fatal(err)
	}
	opts, err := dataplaneOptions(f, netip.MustParseAddr("10.0.0.11"), netip.MustParseAddr("fd00:10::11"))
	if err != nil || opts.Tunnel == nil || opts.Tunnel.Self != netip.MustParseAddr("100.127.0.11") || opts.Tunnel.MTU != 9000 ||
		opts.Tunnel.Self6.IsValid() || opts.Tunnel.OneTier6 != "" {
		t.Errorf("dataplane options for node 10.0.0.11: %+v, %v; want tunnel address 100.127.0.11, MTU 9000, no IPv6 tunnel address", opts.Tunnel, err)
	}
	if _, err := dataplaneOptions(f, netip.Addr{}, netip.Addr{}); err == nil || !strings.Contains(err.Error(), "IPv4 InternalIP") {
		t.Errorf("dataplane options for a node without IPv4 address: %v, want an error naming its InternalIP", err)
	}
	// With an IPv6 tunnel prefix: the node's IPv6 tunnel address, or, for
	// a node without IPv6 address, IPv6 VIPs on one tier, saying why.
	f6, err := parseFlags(append(slices.Clone(base), "--tunnel-prefix", "100.127.0.0/16,fd00:7f::/64"))
	if err != nil {
		t.Fatal(err)
	}
	opts, err = dataplaneOptions(f6, netip.MustParseAddr("10.0.0.11"), netip.MustParseAddr("fd00:10::11"))
	if err != nil || opts.Tunnel == nil || opts.Tunnel.Self6 != netip.MustParseAddr("fd00:7f::11") || opts.Tunnel.OneTier6 != "" {
		t.Errorf("dataplane options for node 10.0.0.11, fd00:10::11 with an IPv6 tunnel prefix: %+v, %v; want IPv6 tunnel address fd00:7f::11", opts.Tunnel, err)
	}
	opts, err = dataplaneOptions(f6, netip.MustParseAddr("10.0.0.11"), netip.Addr{})
	if err != nil || opts.Tunnel == nil || opts.Tunnel.Self6.IsValid() || !strings.Contains(opts.Tunnel.OneTier6, "no IPv6 tunnel address (from its IPv6 InternalIP)") {
		t.Errorf("dataplane options for an IPv4-only node with an IPv6 tunnel prefix: %+v, %v; want no IPv6 tunnel address and OneTier6 saying why", opts.Tunnel, err)
	}

	// Connection sync: on by default with two tiers, on the link of the
	// node's address, with ID 96; a named link; the relay from the node's
	// address, on the default port or another; off, stopping the daemons
	// of its ID (also with the relay asked for); and off with one tier.
	node := netip.MustParseAddr("10.0.0.11")
	twoTiers := []string{"--tunnel-prefix", "100.127.0.0/16"}
	for _, tc := range []struct {
		args []string
		want ipvs.ConnSync
	}{
		{args: twoTiers, want: ipvs.ConnSync{Address: node, ID: 96}},
		{args: append(slices.Clone(twoTiers), "--conn-sync-interface", "eth1", "--conn-sync-id", "7"), want: ipvs.ConnSync{Interface: "eth1", ID: 7}},
		{args: append(slices.Clone(twoTiers), "--conn-sync-interface", "none"), want: ipvs.ConnSync{Off: true, ID: 96}},
		{args: append(slices.Clone(twoTiers), "--conn-sync-transport", "relay"), want: ipvs.ConnSync{ID: 96, Relay: &ipvs.SyncRelay{Address: node, Port: 8849}}},
		{args: append(slices.Clone(twoTiers), "--conn-sync-transport", "relay", "--conn-sync-relay-port", "9000", "--conn-sync-id", "7"), want: ipvs.ConnSync{ID: 7, Relay: &ipvs.SyncRelay{Address: node, Port: 9000}}},
		{args: append(slices.Clone(twoTiers), "--conn-sync-transport", "relay", "--conn-sync-interface", "none"), want: ipvs.ConnSync{Off: true, ID: 96}},
		{args: []string{"--conn-sync-id", "7"}, want: ipvs.ConnSync{Off: true, ID: 7}},
	} {
		f, err := parseFlags(append(slices.Clone(base), tc.args...))
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		opts, err := dataplaneOptions(f, node, netip.Addr{})
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if got := opts.ConnSync; got == nil || !reflect.DeepEqual(*got, tc.want) {
			t.Errorf("%q: connection sync %+v, want %+v", tc.args, got, tc.want)
		}
	}
}

// parseChecked parses args and checks the error against wantErr (""
// none; else a substring of the error); it returns the flags and whether
// parsing succeeded as wanted with no error.
func parseChecked(t *testing.T, args []string, wantErr string) (*flags, bool) {
	t.Helper()
	f, err := parseFlags(args)
	switch {
	case wantErr != "":
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%q: err = %v, want one containing %q", args, err, wantErr)
		}
		return nil, false
	case err != nil:
		t.Errorf("%q: %v", args, err)
		return nil, false
	}
	return f, true
}

// TestParseFlagsClusterCIDR checks --cluster-cidr: empty by default,
// prefixes of both families reach the dataplane's PodCIDRs, and a prefix
// that does not parse or has host bits set is refused naming the flag and
// the fix.
func TestParseFlagsClusterCIDR(t *testing.T) {
	base := []string{"--node-name", "n1"}
	for _, tc := range []struct {
		args    []string
		want    []netip.Prefix
		wantErr string
	}{
		{args: nil, want: nil},
		{args: []string{"--cluster-cidr", "10.244.0.0/16, fd00:10:244::/56"}, want: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}},
		{args: []string{"--cluster-cidr", "10.244.0.0"}, wantErr: `flag -cluster-cidr: "10.244.0.0" is not a prefix: write it as address/length`},
		{args: []string{"--cluster-cidr", "10.244.1.0/16"}, wantErr: `flag -cluster-cidr: "10.244.1.0/16" has host bits set: write 10.244.0.0/16`},
	} {
		f, ok := parseChecked(t, append(slices.Clone(base), tc.args...), tc.wantErr)
		if !ok {
			continue
		}
		opts, err := dataplaneOptions(f, netip.MustParseAddr("192.0.2.1"), netip.Addr{})
		if err != nil {
			t.Fatalf("%q: dataplaneOptions: %v", tc.args, err)
		}
		if !slices.Equal(opts.PodCIDRs, tc.want) {
			t.Errorf("%q: PodCIDRs %v, want %v", tc.args, opts.PodCIDRs, tc.want)
		}
	}
}
