package speaker

import (
	"context"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
)

// TestTunnelPublisherWrites: the publisher writes the node's NodeTunnel
// only when what it says changes: nothing without the Node's uid, a create
// the first time, nothing again for the same spec, nothing at a restart
// (a new publisher) that finds it already saying so, an update for a new
// address, and nothing sent at all (not even a read) when the cache's copy
// already says what is wanted.
func TestTunnelPublisherWrites(t *testing.T) {
	ctx := context.Background()
	dyn := fakePool(t)
	var cached *vipcastv1alpha1.NodeTunnel // what the informer's cache holds
	newPub := func() *tunnelPublisher {
		return newTunnelPublisher(dyn, "n1", func() (*vipcastv1alpha1.NodeTunnel, bool) { return cached, cached != nil })
	}
	writes := func() string {
		var out []string
		for _, a := range dyn.Actions() {
			if a.GetResource() == vipcastv1alpha1.NodeTunnelsResource {
				out = append(out, a.GetVerb())
			}
		}
		dyn.ClearActions()
		return fmt.Sprint(out)
	}
	spec := vipcastv1alpha1.NodeTunnelSpec{IPv4: "10.0.0.2", Announces: true}
	p := newPub()
	for _, step := range []struct {
		name  string
		do    func()
		want  string
		ipv4  string
		owner string
	}{
		{"no Node uid yet", func() { p.set("", spec) }, "[]", "", ""},
		{"first time", func() { p.set("uid-n1", spec) }, "[get create]", "10.0.0.2", "uid-n1"},
		{"the same again, the cache behind", func() { p.set("uid-n1", spec) }, "[get]", "10.0.0.2", "uid-n1"},
		{"a restart, the cache up to date", func() {
			u, err := dyn.Resource(vipcastv1alpha1.NodeTunnelsResource).Get(ctx, "n1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cached = &vipcastv1alpha1.NodeTunnel{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cached); err != nil {
				t.Fatal(err)
			}
			dyn.ClearActions()
			p = newPub()
			p.set("uid-n1", spec)
		}, "[]", "10.0.0.2", "uid-n1"},
		{"a new address", func() { p.set("uid-n1", vipcastv1alpha1.NodeTunnelSpec{IPv4: "10.0.0.12", Announces: true}) }, "[get update]", "10.0.0.12", "uid-n1"},
		{"the Node recreated (a new uid)", func() { p.set("uid-n1b", vipcastv1alpha1.NodeTunnelSpec{IPv4: "10.0.0.12", Announces: true}) }, "[get update]", "10.0.0.12", "uid-n1b"},
	} {
		step.do()
		if err := p.write(ctx); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := writes(); got != step.want {
			t.Errorf("%s: requests %s, want %s", step.name, got, step.want)
		}
		got, owner, ok := publishedTunnel(ctx, dyn, "n1")
		dyn.ClearActions()
		if step.ipv4 == "" {
			if ok {
				t.Errorf("%s: NodeTunnel %+v written", step.name, got)
			}
			continue
		}
		if got.IPv4 != step.ipv4 || owner != "Node/n1/"+step.owner {
			t.Errorf("%s: NodeTunnel %+v owned by %s, want ipv4 %s owned by Node/n1/%s", step.name, got, owner, step.ipv4, step.owner)
		}
	}
}

// TestTunnelNodeFrom: a NodeTunnel decodes to its addresses; an address
// of the wrong family, or none at all, is left out with an error naming the
// object and the field.
func TestTunnelNodeFrom(t *testing.T) {
	for _, tc := range []struct {
		ipv4, ipv6 string
		want       string
		errs       string
	}{
		{"10.0.0.1", "fd00::1", "{n 10.0.0.1 fd00::1 true}", "[]"},
		{"", "fd00::1", "{n invalid IP fd00::1 true}", "[]"},
		{"fd00::1", "", "{n invalid IP invalid IP true}", `[NodeTunnel n: spec.ipv4 "fd00::1" is not an IPv4 address; the node's tunnel address of that family is left out until its speaker rewrites the object]`},
		{"10.0.0.1", "::ffff:10.0.0.1", "{n 10.0.0.1 invalid IP true}", `[NodeTunnel n: spec.ipv6 "::ffff:10.0.0.1" is not an IPv6 address; the node's tunnel address of that family is left out until its speaker rewrites the object]`},
		{"node-1", "", "{n invalid IP invalid IP true}", `[NodeTunnel n: spec.ipv4 "node-1" is not an IPv4 address; the node's tunnel address of that family is left out until its speaker rewrites the object]`},
	} {
		n, errs := tunnelNodeFrom(&vipcastv1alpha1.NodeTunnel{ObjectMeta: metav1.ObjectMeta{Name: "n"},
			Spec: vipcastv1alpha1.NodeTunnelSpec{IPv4: tc.ipv4, IPv6: tc.ipv6, Announces: true}})
		if got := fmt.Sprint(n); got != tc.want {
			t.Errorf("%q %q: %s, want %s", tc.ipv4, tc.ipv6, got, tc.want)
		}
		if got := fmt.Sprint(errs); got != tc.errs {
			t.Errorf("%q %q: errors %s, want %s", tc.ipv4, tc.ipv6, got, tc.errs)
		}
	}
}
