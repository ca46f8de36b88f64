package main

import (
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vipcast/vipcast/ipvs"
)

// TestMetricsBindAddress: the metrics endpoints are never served on every
// address of the node (the VIPs included): the default is loopback, and an
// address without host or with an unspecified one is refused at flag
// parsing with a message naming the flag and the fix.
func TestMetricsBindAddress(t *testing.T) {
	tests := []struct {
		arg     string // "" : flag not given
		want    string // the address kept
		wantErr bool
	}{
		{arg: "", want: "127.0.0.1:7473"},
		{arg: "0", want: "0"},
		{arg: "10.0.0.5:7473", want: "10.0.0.5:7473"},
		{arg: "[fd00::5]:7473", want: "[fd00::5]:7473"},
		{arg: "[10.0.0.5]:7473", want: "[10.0.0.5]:7473"}, // the chart's form for either family
		{arg: "localhost:7473", want: "localhost:7473"},
		{arg: ":7473", wantErr: true},
		{arg: "0.0.0.0:7473", wantErr: true},
		{arg: "[::]:7473", wantErr: true},
		{arg: "[::ffff:0.0.0.0]:7473", wantErr: true},
		{arg: "7473", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.arg, func(t *testing.T) {
			args := []string{"--node-name=n1"}
			if tt.arg != "" {
				args = append(args, "--metrics-bind-address="+tt.arg)
			}
			f, err := parseFlags(args)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("parseFlags(%q) = %q, want an error", tt.arg, f.metricsAddr)
				}
				if msg := err.Error(); !strings.Contains(msg, "--metrics-bind-address") || !strings.Contains(msg, "NODE_IP") {
					t.Errorf("error %q: want the flag's name and the fix", msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseFlags(%q): %v", tt.arg, err)
			}
			if f.metricsAddr != tt.want {
				t.Errorf("metrics address %q, want %q", f.metricsAddr, tt.want)
			}
		})
	}
}

// TestMetricsAllowedSources checks --metrics-allowed-sources and the host
// guard the dataplane gets from it and --metrics-bind-address: prefixes
// (blanks ignored), a malformed one or one with host bits refused naming
// the flag and the fix; the listener's address and port passed on, none
// when metrics are off.
func TestMetricsAllowedSources(t *testing.T) {
	base := []string{"--node-name", "n1", "--metrics-bind-address", "[10.0.0.11]:7473"}
	for _, tc := range []struct {
		args    []string
		want    ipvs.HostGuard
		wantErr string
	}{
		{args: nil, want: ipvs.HostGuard{Metrics: netip.MustParseAddrPort("10.0.0.11:7473")}},
		{args: []string{"--metrics-allowed-sources", "10.244.0.0/16, fd00::/56,,"}, want: ipvs.HostGuard{
			Metrics:        netip.MustParseAddrPort("10.0.0.11:7473"),
			MetricsSources: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00::/56")}}},
		{args: []string{"--metrics-bind-address", "0"}, want: ipvs.HostGuard{}},
		{args: []string{"--metrics-allowed-sources", "10.244.0.0"}, wantErr: `metrics-allowed-sources: "10.244.0.0" is not a prefix: write it as address/length`},
		{args: []string{"--metrics-allowed-sources", "10.244.1.7/16"}, wantErr: `metrics-allowed-sources: "10.244.1.7/16" has host bits set: write 10.244.0.0/16`},
	} {
		f, ok := parseChecked(t, append(slices.Clone(base), tc.args...), tc.wantErr)
		if !ok {
			continue
		}
		if got := f.hostGuard(); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: host guard %+v, want %+v", tc.args, got, tc.want)
		}
	}
}
