package speaker

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/vipcast/vipcast/api/v1alpha1"
	"github.com/vipcast/vipcast/bgp"
)

// fuzzPassword is the password lookup of FuzzPeersForNode: Secret
// "missing" does not exist, any other holds "pw-" and the key.
func fuzzPassword(ref *v1alpha1.SecretKeyReference) (string, error) {
	if ref.Name == "missing" {
		return "", errors.New(`secrets "missing" not found`)
	}
	return "pw-" + ref.KeyOrDefault(), nil
}

// FuzzPeersForNode decodes up to five BGPPeers (addresses, ASNs, ports,
// TTLs, families, source addresses, nodeSelectors with any operator,
// password references; no two peers share an address) and a node from
// the fuzzer's bytes. PeersForNode never panics, does not modify the
// peers and is deterministic; its sessions are sorted by name; every
// input peer ends in exactly one of: an error with Check's reason and
// message when Check refuses it (on any node), nothing when its
// nodeSelector does not select the node, a SecretNotFound error naming
// spec.passwordSecretRef when its password cannot be read, else a session
// whose fields are the spec's with defaults applied (address unmapped and
// neither unspecified nor zoned, the node's local ASN override, no
// multihop on iBGP, the password read, sorted families). Every error names
// a spec field and has a known reason.
func FuzzPeersForNode(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{1})
	f.Add([]byte{3, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 3, 3, 0, 0, 1})
	for i := range 12 { // each spelling of the address
		f.Add([]byte{1, 0, 0, byte(i)})
	}
	f.Add([]byte{1, 0, 0, 10, 4}) // peerAddress ::ffff:0.0.0.0, the unspecified IPv4 address
	fuzzRandomSeeds(f, 0x9ee7)
	f.Fuzz(func(t *testing.T, data []byte) {
		g := &fuzzGen{b: data}
		peers := g.peers()
		node := g.node()
		password := fuzzPassword
		if g.maybe(8) {
			password = nil
		}
		before := deepCopyPeers(peers)
		out, errs := PeersForNode(peers, node, password)
		if !reflect.DeepEqual(peers, before) {
			t.Fatal("PeersForNode modified its peers")
		}
		if out2, errs2 := PeersForNode(peers, node, password); !reflect.DeepEqual(out, out2) || !reflect.DeepEqual(errs, errs2) {
			t.Fatalf("PeersForNode is not deterministic: %v %v, then %v %v", out, errs, out2, errs2)
		}
		if !slices.IsSortedFunc(out, func(a, b bgp.Peer) int { return strings.Compare(a.Name, b.Name) }) {
			t.Fatalf("sessions not sorted by name: %v", out)
		}

		sessions := map[string]bgp.Peer{}
		for _, s := range out {
			if _, dup := sessions[s.Name]; dup {
				t.Fatalf("peer %s has two sessions", s.Name)
			}
			sessions[s.Name] = s
		}
		failures := map[string]PeerError{}
		for _, e := range errs {
			if _, dup := sessions[e.Peer]; dup {
				t.Fatalf("peer %s has a session and an error %v", e.Peer, e)
			}
			if _, dup := failures[e.Peer]; dup {
				t.Fatalf("peer %s has two errors", e.Peer)
			}
			failures[e.Peer] = e
			switch e.Reason {
			case v1alpha1.ReasonInvalidConfig, v1alpha1.ReasonInvalidSelector, v1alpha1.ReasonSecretNotFound:
			default:
				t.Fatalf("%v: unknown reason %q", e, e.Reason)
			}
			if !strings.Contains(e.Message, "spec.") {
				t.Fatalf("%v: names no spec field", e)
			}
		}
		if len(sessions)+len(failures) > len(peers) {
			t.Fatalf("%d sessions and %d errors for %d peers", len(sessions), len(failures), len(peers))
		}

		for _, p := range peers {
			s, hasSession := sessions[p.Name]
			e, hasError := failures[p.Name]
			prob := p.Spec.Check()
			switch {
			case prob != nil:
				if !hasError || e.Reason != prob.Reason || e.Message != prob.Message {
					t.Fatalf("peer %s refused by Check (%v): session %v, error %v", p.Name, prob, hasSession, e)
				}
			case !fuzzSelects(p.Spec.NodeSelector, node.Labels):
				if hasSession || hasError {
					t.Fatalf("peer %s does not select node %v: session %v, error %v", p.Name, node.Labels, s, e)
				}
			case p.Spec.PasswordSecretRef != nil && (password == nil || p.Spec.PasswordSecretRef.Name == "missing"):
				if !hasError || e.Reason != v1alpha1.ReasonSecretNotFound || !strings.HasPrefix(e.Message, "spec.passwordSecretRef: ") {
					t.Fatalf("peer %s's password cannot be read: session %v, error %v", p.Name, hasSession, e)
				}
			default:
				if !hasSession {
					t.Fatalf("peer %s is usable on node %v but has no session (error %v)", p.Name, node.Labels, e)
				}
				checkSession(t, p, node, s)
			}
		}
	})
}

// fuzzSelects reports whether a nodeSelector that Check accepted selects
// labels: every node when it is nil.
func fuzzSelects(s *metav1.LabelSelector, l labels.Set) bool {
	if s == nil {
		return true
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	return err == nil && sel.Matches(l)
}

// checkSession checks the session PeersForNode opened for p on node.
func checkSession(t *testing.T, p *v1alpha1.BGPPeer, node Node, s bgp.Peer) {
	t.Helper()
	spec := &p.Spec
	addr, err := netip.ParseAddr(strings.TrimSpace(spec.PeerAddress))
	if err != nil || s.Address != addr.Unmap() {
		t.Fatalf("peer %s: address %v for peerAddress %q", p.Name, s.Address, spec.PeerAddress)
	}
	if !s.Address.IsValid() || s.Address.IsUnspecified() || s.Address.Zone() != "" || s.Address.Is4In6() {
		t.Fatalf("peer %s: session to unusable address %v (peerAddress %q)", p.Name, s.Address, spec.PeerAddress)
	}
	localASN := spec.LocalASN
	if node.LocalASN != 0 {
		localASN = node.LocalASN
	}
	if s.ASN != spec.PeerASN || s.LocalASN != localASN {
		t.Fatalf("peer %s: ASN %d local %d, want %d local %d", p.Name, s.ASN, s.LocalASN, spec.PeerASN, localASN)
	}
	if int32(s.Port) != spec.PortOrDefault() || s.Port == 0 {
		t.Fatalf("peer %s: port %d, spec %v", p.Name, s.Port, spec.Port)
	}
	switch {
	case s.IBGP() && s.EBGPMultiHop != 0:
		t.Fatalf("peer %s: iBGP session with multihop %d", p.Name, s.EBGPMultiHop)
	case !s.IBGP() && int32(s.EBGPMultiHop) != spec.EBGPMultiHopOrDefault():
		t.Fatalf("peer %s: multihop %d, spec %v", p.Name, s.EBGPMultiHop, spec.EBGPMultiHop)
	}
	if s.HoldTime != spec.HoldTimeOrDefault() || s.KeepaliveTime != spec.KeepaliveTimeOrDefault() {
		t.Fatalf("peer %s: hold %v keepalive %v", p.Name, s.HoldTime, s.KeepaliveTime)
	}
	wantPW := ""
	if ref := spec.PasswordSecretRef; ref != nil {
		wantPW, _ = fuzzPassword(ref)
	}
	if s.Password != wantPW {
		t.Fatalf("peer %s: password %q, want %q", p.Name, s.Password, wantPW)
	}
	if spec.SourceAddress != "" {
		src, err := netip.ParseAddr(strings.TrimSpace(spec.SourceAddress))
		if err != nil || s.SourceAddress != src.Unmap() || s.SourceAddress.Is4() != s.Address.Is4() {
			t.Fatalf("peer %s: source %v for sourceAddress %q", p.Name, s.SourceAddress, spec.SourceAddress)
		}
	} else if s.SourceAddress.IsValid() {
		t.Fatalf("peer %s: source %v without sourceAddress", p.Name, s.SourceAddress)
	}
	if gr := spec.GracefulRestart; s.GracefulRestart != (gr != nil && gr.Enabled) {
		t.Fatalf("peer %s: graceful restart %v, spec %+v", p.Name, s.GracefulRestart, gr)
	}
	var want []bgp.Family
	for _, f := range spec.FamiliesOrDefault() {
		fam := bgp.IPv4Unicast
		if f == v1alpha1.AddressFamilyIPv6Unicast {
			fam = bgp.IPv6Unicast
		}
		if !slices.Contains(want, fam) {
			want = append(want, fam)
		}
	}
	slices.Sort(want)
	if !slices.Equal(s.Families, want) {
		t.Fatalf("peer %s: families %v, want %v (spec %v)", p.Name, s.Families, want, spec.Families)
	}
}
