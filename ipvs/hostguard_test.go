package ipvs

import (
	"net/netip"
	"testing"
)

// TestHostGuardMetricsRules: the metrics rules go to the table of the
// listener's family only, with one accept for the node itself, one per
// allowed prefix of that family and the drop; none for a loopback or
// missing listener, or when a /0 of the family opens the port; a prefix
// with host bits is refused.
func TestHostGuardMetricsRules(t *testing.T) {
	p := netip.MustParsePrefix
	node := netip.MustParseAddrPort("10.0.0.11:7473")
	for _, tc := range []struct {
		name   string
		g      HostGuard
		v4, v6 int // rules per table
	}{
		{"no listener", HostGuard{}, 0, 0},
		{"loopback", HostGuard{Metrics: netip.MustParseAddrPort("127.0.0.1:7473")}, 0, 0},
		{"the node only", HostGuard{Metrics: node}, 2, 0},
		{"two prefixes of the family, one of the other", HostGuard{Metrics: node, MetricsSources: []netip.Prefix{p("10.244.0.0/16"), p("192.0.2.7/32"), p("fd00::/56")}}, 4, 0},
		{"IPv4-mapped prefix counts as IPv4", HostGuard{Metrics: node, MetricsSources: []netip.Prefix{p("::ffff:10.244.0.0/112")}}, 3, 0},
		{"open to every IPv4 source", HostGuard{Metrics: node, MetricsSources: []netip.Prefix{p("10.244.0.0/16"), p("0.0.0.0/0")}}, 0, 0},
		{"::/0 does not open an IPv4 listener", HostGuard{Metrics: node, MetricsSources: []netip.Prefix{p("::/0")}}, 2, 0},
		{"IPv6 listener", HostGuard{Metrics: netip.MustParseAddrPort("[fd00::11]:7473"), MetricsSources: []netip.Prefix{p("fd00:10:244::/56")}}, 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.g.check(); err != nil {
				t.Fatal(err)
			}
			if v4, v6 := len(tc.g.metricsRules(0)), len(tc.g.metricsRules(1)); v4 != tc.v4 || v6 != tc.v6 {
				t.Errorf("rules ip %d, ip6 %d; want %d, %d", v4, v6, tc.v4, tc.v6)
			}
		})
	}
	if err := (HostGuard{Metrics: node, MetricsSources: []netip.Prefix{p("10.244.1.7/16")}}).check(); err == nil {
		t.Errorf("a prefix with host bits was accepted")
	}
}
