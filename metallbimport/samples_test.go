package metallbimport

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the current output")

// decodeFiles decodes the files, relative to testdata.
func decodeFiles(t *testing.T, files ...string) *Objects {
	t.Helper()
	o := &Objects{}
	for _, f := range files {
		r, err := os.Open(filepath.Join("testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		err = o.Decode(r, f)
		_ = r.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return o
}

// render is what the plugin prints for objs: the YAML, or the refusal.
func render(t *testing.T, objs *Objects) (string, *Result, *RefusedError) {
	t.Helper()
	res, err := Translate(objs, Options{})
	var refused *RefusedError
	if errors.As(err, &refused) {
		return err.Error() + "\n", nil, refused
	}
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := res.Write(&b, objs.Skipped); err != nil {
		t.Fatal(err)
	}
	return b.String(), res, nil
}

// TestMetalLBSamples translates MetalLB's own example configurations
// (testdata/metallb-v0.15.2), each alone or with the pools and peers it
// refers to, checks what each must give, and compares the whole output
// with testdata/golden (go test -update rewrites it; read the diff).
func TestMetalLBSamples(t *testing.T) {
	const s = "metallb-v0.15.2/"
	cases := []struct {
		name  string
		files []string
		check func(t *testing.T, res *Result, refused *RefusedError, out string)
	}{
		{"deployment_bgp", []string{s + "deployment_bgp.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, out string) {
			wantPools(t, res, "example")
			wantPeers(t, res, "peer", "peerv6")
			if p := res.Peers[0]; len(p.Spec.Families) != 1 || p.Spec.Families[0] != "ipv4-unicast" {
				t.Errorf("peer families %v, want ipv4-unicast alone (MetalLB 0.15 without dualStackAddressFamily)", p.Spec.Families)
			}
			if res.Pools[0].Spec.BGP != nil {
				t.Errorf("an advertisement with nothing set gave spec.bgp %+v, want none", res.Pools[0].Spec.BGP)
			}
			wantIn(t, out, "skipped: Deployment nginx", "skipped: Service nginx")
		}},
		{"deployment_l2", []string{s + "deployment_l2.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, out string) {
			wantPools(t, res)
			wantIn(t, out, "IPAddressPool metallb-system/example: not translated: no BGPAdvertisement selects it, MetalLB announces it by L2 only (L2Advertisement empty)",
				"L2Advertisement metallb-system/empty: not carried over: vipcast announces over BGP only")
		}},
		{"simple_pool_adv_bgp", []string{s + "simple_pool_adv_bgp.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, _ string) {
			wantPools(t, res, "example")
			if got := strings.Join(res.Pools[0].Spec.Addresses, " "); got != "192.168.10.0/24 192.168.9.1-192.168.9.5 fc00:f853:ccd:e799::/124" {
				t.Errorf("addresses %q", got)
			}
		}},
		{"simple_pool_adv_l2", []string{s + "simple_pool_adv_l2.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, _ string) { wantPools(t, res) }},
		{"ipaddresspool_simple", []string{s + "ipaddresspool_simple.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, out string) {
			wantPools(t, res)
			wantIn(t, out, "MetalLB announces it nowhere")
		}},
		{"ipaddresspool_with_selector", []string{s + "ipaddresspool_with_selector.yaml", "extra/adv-all.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, _ string) {
			wantPools(t, res, "ippool-ns-service-alloc-sample")
			a := res.Pools[0].Spec.Allocation
			if a == nil || a.Priority == nil || *a.Priority != 50 || len(a.Namespaces) != 2 || len(a.NamespaceSelectors) != 1 || len(a.ServiceSelectors) != 1 || !res.Pools[0].Spec.AvoidBuggyIPs {
				t.Errorf("allocation %+v, avoidBuggyIPs %v", a, res.Pools[0].Spec.AvoidBuggyIPs)
			}
		}},
		{"bgppeer_simple", []string{s + "bgppeer_simple.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, _ string) {
			wantPeers(t, res, "peer")
			p := res.Peers[0]
			if p.Spec.LocalASN != 64512 || p.Spec.PeerASN != 64512 || p.Spec.PeerAddress != "172.30.0.3" || p.Labels[PeerLabel] != "peer" {
				t.Errorf("peer %+v, labels %v", p.Spec, p.Labels)
			}
		}},
		{"bgppeer_with_bfdprofile", []string{s + "bgppeer_with_bfdprofile.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, _ string) {
			b := res.Peers[0].Spec.BFD
			if b == nil || b.MinTx.Duration.String() != "270ms" || b.MinRx.Duration.String() != "380ms" || *b.Multiplier != 3 {
				t.Errorf("bfd %+v, want minTx 270ms, minRx 380ms, multiplier 3 (MetalLB's default)", b)
			}
		}},
		{"bgppeer_with_session_options", []string{s + "bgppeer_with_session_options.yaml"}, func(t *testing.T, _ *Result, _ *RefusedError, out string) {
			wantIn(t, out, "BGPPeer metallb-system/peer: spec.connectTime: not carried over")
		}},
		{"bgppeer_with_vrf", []string{s + "bgppeer_with_vrf.yaml"}, func(t *testing.T, _ *Result, refused *RefusedError, out string) {
			if refused == nil {
				t.Fatal("a peer in a VRF was translated")
			}
			wantIn(t, out, "BGPPeer metallb-system/peer: spec.vrf: vipcast's sessions are in the node's main routing table")
		}},
		{"bgppeer_withsecret", []string{s + "bgppeer_withsecret.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, out string) {
			p := res.Peers[0]
			if r := p.Spec.PasswordSecretRef; r == nil || r.Namespace != "metallb-system" || r.Name != "secretname" || r.Key != "password" {
				t.Errorf("passwordSecretRef %+v", r)
			}
			if p.Spec.HoldTime.Duration.String() != "9m0s" || p.Spec.KeepaliveTime != nil || *p.Spec.Port != 179 {
				t.Errorf("timers %v %v, port %v", p.Spec.HoldTime, p.Spec.KeepaliveTime, p.Spec.Port)
			}
			wantIn(t, out, "spec.keepaliveTime: 0s not carried over", "speaker.bgpPasswordSecrets.secrets: [metallb-system/secretname]")
		}},
		{"community_alias", []string{s + "bgpadvertisement_community_alias.yaml", "extra/pools.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, _ string) {
			wantPools(t, res, "bgp-with-advertisement")
			b := res.Pools[0].Spec.BGP
			if b == nil || strings.Join(b.Communities, ",") != "65535:65282" || b.LocalPref == nil || *b.LocalPref != 150 {
				t.Errorf("bgp %+v, want the alias NO_ADVERTISE as 65535:65282 and localPref 150", b)
			}
		}},
		{"communities_localpref", []string{s + "bgpadvertisement_communities_localpref.yaml", "extra/pools.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, _ string) {
			wantPools(t, res, "bgp-with-advertisement")
		}},
		{"with_node_selector", []string{s + "bgpadvertisement_with_node_selector.yaml", "extra/pools.yaml"}, func(t *testing.T, _ *Result, refused *RefusedError, out string) {
			if refused == nil {
				t.Fatal("two node selectors were translated")
			}
			wantIn(t, out, "BGPAdvertisement metallb-system/advertisement: spec.nodeSelectors: 2 selectors")
		}},
		{"selects_by_label", []string{s + "bgpadv_selectspool_by_label.yaml", "extra/pools.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, _ string) {
			wantPools(t, res, "bgp-with-advertisement")
		}},
		{"selects_by_list", []string{s + "bgpadv_selectspool_by_list.yaml", "extra/pools.yaml", "extra/peers.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, _ string) {
			wantPools(t, res, "test-addresspool")
			ps := res.Pools[0].Spec.BGP.PeerSelector
			if ps == nil || len(ps.MatchExpressions) != 1 || ps.MatchExpressions[0].Key != PeerLabel || strings.Join(ps.MatchExpressions[0].Values, ",") != "ebgp-single-hop0" {
				t.Errorf("peerSelector %+v", ps)
			}
		}},
		{"l2adv_selects_pools_by_list", []string{s + "l2adv_selects_pools_by_list.yaml", "extra/pools.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, out string) {
			wantPools(t, res)
			wantIn(t, out, "IPAddressPool metallb-system/first-pool: not translated: no BGPAdvertisement selects it, MetalLB announces it by L2 only (L2Advertisement example)")
		}},
		{"l2adv_with_node_selector", []string{s + "l2adv_with_node_selector.yaml", "extra/pools.yaml"}, func(t *testing.T, res *Result, _ *RefusedError, _ string) {
			wantPools(t, res)
		}},
	}
	seen := map[string]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, f := range c.files {
				seen[f] = true
			}
			out, res, refused := render(t, decodeFiles(t, c.files...))
			c.check(t, res, refused, out)
			golden := filepath.Join("testdata/golden", c.name+".txt")
			if *update {
				if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test -update writes it)", err)
			}
			if string(want) != out {
				t.Errorf("output differs from %s (go test -update rewrites it):\n%s", golden, out)
			}
		})
	}
	samples, err := filepath.Glob("testdata/" + s + "*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range samples {
		if rel := strings.TrimPrefix(f, "testdata/"); !seen[rel] {
			t.Errorf("%s: MetalLB's sample is in no case", rel)
		}
	}
}

func wantPools(t *testing.T, res *Result, names ...string) {
	t.Helper()
	if res == nil {
		t.Fatalf("refused, want pools %v", names)
	}
	var got []string
	for _, p := range res.Pools {
		got = append(got, p.Name)
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("pools %v, want %v", got, names)
	}
}

func wantPeers(t *testing.T, res *Result, names ...string) {
	t.Helper()
	var got []string
	for _, p := range res.Peers {
		got = append(got, p.Name)
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("peers %v, want %v", got, names)
	}
}

func wantIn(t *testing.T, out string, subs ...string) {
	t.Helper()
	for _, s := range subs {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q:\n%s", s, out)
		}
	}
}
