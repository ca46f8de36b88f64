package main

import (
	"slices"
	"strings"
	"testing"
)

// TestParseFlagsPasswordNamespaces checks --bgp-password-namespaces: a
// comma-separated list of namespace names (blanks ignored), empty by
// default, and a malformed name refused naming the flag and the fix.
func TestParseFlagsPasswordNamespaces(t *testing.T) {
	base := []string{"--node-name", "n1"}
	for _, tc := range []struct {
		args    []string
		want    []string
		wantErr string
	}{
		{args: nil, want: nil},
		{args: []string{"--bgp-password-namespaces", "vipcast-bgp-passwords"}, want: []string{"vipcast-bgp-passwords"}},
		{args: []string{"--bgp-password-namespaces", "a, b,,c"}, want: []string{"a", "b", "c"}},
		{args: []string{"--bgp-password-namespaces", ""}, want: nil},
		{args: []string{"--bgp-password-namespaces", "Fabric"}, wantErr: `bgp-password-namespaces: "Fabric" is not a namespace name`},
		{args: []string{"--bgp-password-namespaces", "a/b"}, wantErr: "use lowercase letters, digits and '-'"},
	} {
		f, err := parseFlags(append(slices.Clone(base), tc.args...))
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: err = %v, want one containing %q", tc.args, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case !slices.Equal(f.passwordNS, tc.want):
			t.Errorf("%q: namespaces %q, want %q", tc.args, f.passwordNS, tc.want)
		}
	}
}
