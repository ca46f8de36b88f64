package main

import (
	"strings"
	"testing"
)

// TestImportMetalLBFromFiles runs `kubectl vipcast import metallb -f` on
// MetalLB's own samples: a directory and a file print the translation; a
// configuration it refuses prints nothing and fails, naming the part.
func TestImportMetalLBFromFiles(t *testing.T) {
	const samples = "../../metallbimport/testdata/metallb-v0.15.2/"
	run := func(args ...string) (string, error) {
		var out strings.Builder
		cmd := newCommand(&out)
		cmd.SetArgs(append([]string{"import", "metallb"}, args...))
		cmd.SetErr(&strings.Builder{})
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := run("-f", samples+"deployment_bgp.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kind: IPPool", "name: example", "kind: BGPPeer", "name: peerv6", "# skipped: Deployment nginx"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, err = run("-f", samples+"bgppeer_with_vrf.yaml")
	if err == nil || !strings.Contains(err.Error(), "spec.vrf") || out != "" {
		t.Errorf("a peer in a VRF: error %v, output %q; want a refusal naming spec.vrf and nothing printed", err, out)
	}
	// A directory: every sample at once, where several objects share a
	// name, which is refused.
	if _, err := run("-f", samples); err == nil || !strings.Contains(err.Error(), "BGPPeer metallb-system/peer: given more than once") {
		t.Errorf("all the samples at once: %v, want a refusal", err)
	}
}
