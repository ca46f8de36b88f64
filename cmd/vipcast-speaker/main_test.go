package main

import (
	"strings"
	"testing"
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
