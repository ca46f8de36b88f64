package metallbimport

import (
	"errors"
	"strings"
	"testing"
)

const pool = `apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: public, namespace: metallb-system}
spec: {addresses: [192.0.2.0/24]}
`

const peer = `apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: tor, namespace: metallb-system}
spec: {myASN: 64501, peerASN: 64500, peerAddress: 10.0.0.1}
`

func ad(name, spec string) string {
	return "apiVersion: metallb.io/v1beta1\nkind: BGPAdvertisement\nmetadata: {name: " + name + ", namespace: metallb-system}\nspec: " + spec + "\n"
}

func docs(d ...string) string { return strings.Join(d, "---\n") }

func translateYAML(t *testing.T, in string) (*Result, error) {
	t.Helper()
	o := &Objects{}
	if err := o.Decode(strings.NewReader(in), "in.yaml"); err != nil {
		return nil, err
	}
	return Translate(o, Options{})
}

// TestTranslateCases covers what the samples do not: each refusal, the
// merging of a pool's advertisements, the timers and passwords, and
// vipcast's own admission of the pools.
func TestTranslateCases(t *testing.T) {
	cases := []struct {
		name string
		in   string
		// refused: every text the refusal must hold; else check.
		refused []string
		check   func(t *testing.T, r *Result)
	}{
		{name: "dynamic ASN", in: docs(`apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: tor, namespace: metallb-system}
spec: {myASN: 64501, dynamicASN: external, peerAddress: 10.0.0.1}
`), refused: []string{"BGPPeer metallb-system/tor: spec.dynamicASN: vipcast needs the router's ASN"}},
		{name: "unnumbered", in: `apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: tor, namespace: metallb-system}
spec: {myASN: 64501, peerASN: 64500, interface: eth1}
`, refused: []string{"spec.interface: vipcast peers with an address"}},
		{name: "two node selectors on a peer", in: `apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: tor, namespace: metallb-system}
spec: {myASN: 64501, peerASN: 64500, peerAddress: 10.0.0.1, nodeSelectors: [{matchLabels: {a: b}}, {matchLabels: {c: d}}]}
`, refused: []string{"BGPPeer metallb-system/tor: spec.nodeSelectors: 2 selectors"}},
		{name: "hold time 0", in: `apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: tor, namespace: metallb-system}
spec: {myASN: 64501, peerASN: 64500, peerAddress: 10.0.0.1, holdTime: 0s}
`, refused: []string{"spec.holdTime: 0s (no keepalives"}},
		{name: "keepalive not below hold", in: `apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: tor, namespace: metallb-system}
spec: {myASN: 64501, peerASN: 64500, peerAddress: 10.0.0.1, holdTime: 9s, keepaliveTime: 9s}
`, refused: []string{"spec.keepaliveTime: 9s is not shorter than holdTime 9s"}},
		{name: "iBGP multihop", in: `apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: tor, namespace: metallb-system}
spec: {myASN: 64500, peerASN: 64500, peerAddress: 10.0.0.1, ebgpMultiHop: true}
`, refused: []string{"spec.ebgpMultiHop: set for an iBGP peer"}},
		{name: "vipcast's own check of the peer", in: `apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: tor, namespace: metallb-system}
spec: {myASN: 64501, peerASN: 64500, peerAddress: 10.0.0.1, sourceAddress: '2001:db8::1'}
`, refused: []string{"vipcast-ccm would refuse the translated BGPPeer (InvalidConfig): spec.sourceAddress 2001:db8::1 and spec.peerAddress 10.0.0.1 are of different IP families"}},
		{name: "missing BFD profile", in: `apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: tor, namespace: metallb-system}
spec: {myASN: 64501, peerASN: 64500, peerAddress: 10.0.0.1, bfdProfile: fast}
`, refused: []string{`spec.bfdProfile: no BFDProfile "fast" in metallb-system`}},
		{name: "plain-text password into a Secret", in: `apiVersion: metallb.io/v1beta2
kind: BGPPeer
metadata: {name: tor, namespace: metallb-system}
spec: {myASN: 64501, peerASN: 64500, peerAddress: 10.0.0.1, password: s3cret, ebgpMultiHop: true, bfdProfile: fast, enableGracefulRestart: true, dualStackAddressFamily: true}
---
apiVersion: metallb.io/v1beta1
kind: BFDProfile
metadata: {name: fast, namespace: metallb-system}
spec: {detectMultiplier: 5, minimumTtl: 250, echoMode: true, passiveMode: true}
`, check: func(t *testing.T, r *Result) {
			if len(r.Secrets) != 1 || r.Secrets[0].Namespace != DefaultPasswordNamespace || r.Secrets[0].StringData["password"] != "s3cret" {
				t.Fatalf("secrets %+v", r.Secrets)
			}
			p := r.Peers[0].Spec
			if p.PasswordSecretRef.Name != r.Secrets[0].Name || strings.Join(r.PasswordSecrets, ",") != DefaultPasswordNamespace+"/tor-bgp-password" {
				t.Errorf("passwordSecretRef %+v, PasswordSecrets %v", p.PasswordSecretRef, r.PasswordSecrets)
			}
			if *p.EBGPMultiHop != 255 || !p.BFD.Multihop || *p.BFD.MinimumTTL != 250 || *p.BFD.Multiplier != 5 || p.BFD.MinTx.Milliseconds() != 300 || !p.GracefulRestart.Enabled || len(p.Families) != 2 {
				t.Errorf("peer %+v, bfd %+v", p, p.BFD)
			}
			notes := notesOf(r)
			for _, want := range []string{"spec.echoMode: not carried over", "spec.passiveMode: not carried over", "spec.password: moved into Secret"} {
				if !strings.Contains(notes, want) {
					t.Errorf("notes lack %q:\n%s", want, notes)
				}
			}
		}},
		{name: "two advertisements agreeing: peers joined", in: docs(pool, peer, ad("a", "{peers: [tor], communities: ['64500:1']}"), ad("b", "{peers: [tor2], communities: ['64500:1']}")), check: func(t *testing.T, r *Result) {
			ps := r.Pools[0].Spec.BGP.PeerSelector
			if got := strings.Join(ps.MatchExpressions[0].Values, ","); got != "tor,tor2" {
				t.Errorf("peers %q, want tor,tor2", got)
			}
			if !strings.Contains(notesOf(r), `names BGPPeer "tor2", which does not exist`) {
				t.Errorf("no note for the missing peer: %s", notesOf(r))
			}
		}},
		{name: "one advertisement for every peer wins", in: docs(pool, peer, ad("a", "{peers: [tor]}"), ad("b", "{}")), check: func(t *testing.T, r *Result) {
			if b := r.Pools[0].Spec.BGP; b != nil {
				t.Errorf("bgp %+v, want none: b announces to every peer", b)
			}
		}},
		{name: "two advertisements disagreeing", in: docs(pool, ad("a", "{localPref: 100}"), ad("b", "{aggregationLength: 24, communities: ['1:1']}")),
			refused: []string{"IPAddressPool metallb-system/public: BGPAdvertisements a and b both announce it, with different aggregationLength, localPref, communities"}},
		{name: "large community and alias", in: docs(pool, ad("a", "{communities: ['large:64500:1:2', 'NOEXP']}"), `apiVersion: metallb.io/v1beta1
kind: Community
metadata: {name: c, namespace: metallb-system}
spec: {communities: [{name: NOEXP, value: '65535:65281'}]}
`), check: func(t *testing.T, r *Result) {
			b := r.Pools[0].Spec.BGP
			if strings.Join(b.LargeCommunities, ",") != "64500:1:2" || strings.Join(b.Communities, ",") != "65535:65281" {
				t.Errorf("bgp %+v", b)
			}
		}},
		{name: "unknown community", in: docs(pool, ad("a", "{communities: ['NOPE']}")), refused: []string{`spec.communities[0]: "NOPE" is neither ASN:VALUE`}},
		{name: "aggregation shorter than the pool's CIDR: vipcast-ccm's own refusal", in: docs(pool, ad("a", "{aggregationLength: 16}")),
			refused: []string{"IPAddressPool metallb-system/public: vipcast-ccm would refuse the translated IPPool", "aggregationLength"}},
		{name: "overlapping pools: vipcast-ccm's own refusal", in: docs(pool, strings.Replace(pool, "public", "other", 1), ad("a", "{}")),
			refused: []string{"vipcast-ccm would refuse the translated IPPool", "Overlap"}},
		{name: "host bits and a spaced range", in: docs(`apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata: {name: public, namespace: metallb-system}
spec: {addresses: [192.0.2.7/24, '198.51.100.1 - 198.51.100.9'], serviceAllocation: {priority: 0, namespaces: [a]}}
`, ad("a", "{}")), check: func(t *testing.T, r *Result) {
			s := r.Pools[0].Spec
			if strings.Join(s.Addresses, " ") != "192.0.2.0/24 198.51.100.1-198.51.100.9" || s.Allocation.Priority != nil {
				t.Errorf("addresses %v, allocation %+v (MetalLB's priority 0 is none)", s.Addresses, s.Allocation)
			}
		}},
		{name: "another namespace is MetalLB's to ignore", in: docs(strings.Replace(pool, "metallb-system", "tenant", 1), ad("a", "{}")), check: func(t *testing.T, r *Result) {
			if len(r.Pools) != 0 {
				t.Errorf("pools %v from namespace tenant", r.Pools)
			}
		}},
		{name: "a kubectl List", in: "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: metallb.io/v1beta1, kind: IPAddressPool, metadata: {name: public, namespace: metallb-system}, spec: {addresses: [192.0.2.0/24]}}\n- {apiVersion: metallb.io/v1beta1, kind: BGPAdvertisement, metadata: {name: a, namespace: metallb-system}}\n",
			check: func(t *testing.T, r *Result) {
				if len(r.Pools) != 1 {
					t.Errorf("pools %v", r.Pools)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := translateYAML(t, c.in)
			var refused *RefusedError
			if c.refused != nil {
				if !errors.As(err, &refused) {
					t.Fatalf("translated (%v), want a refusal holding %q", err, c.refused)
				}
				for _, w := range c.refused {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("refusal lacks %q:\n%v", w, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.check(t, r)
		})
	}
}

// TestDecodeErrors: a malformed MetalLB object is refused with its name
// and the field.
func TestDecodeErrors(t *testing.T) {
	cases := []struct{ in, want string }{
		{strings.Replace(pool, "addresses", "adresses", 1), `in.yaml, document 1): field "adresses": MetalLB has no such field`},
		{strings.Replace(pool, "spec: {", "spec: {autoAssign: 'yes', ", 1), "IPAddressPool metallb-system/public (in.yaml, document 1): field spec.autoAssign: a string where MetalLB takes a bool"},
		{strings.Replace(pool, "v1beta1", "v1alpha9", 1), "apiVersion metallb.io/v1alpha9: MetalLB 0.14–0.15 serve IPAddressPool at v1beta1"},
		{docs(pool, "apiVersion: metallb.io/v1beta1\nkind: IPAddressPool\nmetadata: {namespace: metallb-system}\n"), "document 2): metadata.name is empty"},
		{"a: [b\n", "in.yaml, document 1"},
	}
	for _, c := range cases {
		_, err := translateYAML(t, c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want it to hold %q", c.in, err, c.want)
		}
	}
}

func notesOf(r *Result) string {
	var b strings.Builder
	for _, n := range r.Notes {
		b.WriteString(n.String() + "\n")
	}
	return b.String()
}

// FuzzTranslate: no input makes Decode or Translate panic.
func FuzzTranslate(f *testing.F) {
	f.Add(docs(pool, peer, ad("a", "{peers: [tor], communities: ['1:2', 'large:1:2:3'], aggregationLength: 28}")))
	f.Add("apiVersion: v1\nkind: List\nitems: [{apiVersion: metallb.io/v1beta2, kind: BGPPeer, metadata: {name: x}, spec: {holdTime: 1ms}}]\n")
	f.Fuzz(func(_ *testing.T, in string) {
		o := &Objects{}
		if o.Decode(strings.NewReader(in), "fuzz") != nil {
			return
		}
		_, _ = Translate(o, Options{})
	})
}
