package nodereport

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vipcastv1alpha1 "github.com/vipcast/vipcast/api/v1alpha1"
)

const localWhy = "externalTrafficPolicy Local and no ready endpoint on this node"

func status(node string, st vipcastv1alpha1.SpeakerStatusStatus) vipcastv1alpha1.SpeakerStatus {
	return vipcastv1alpha1.SpeakerStatus{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: st}
}

func node(name string, addrs ...string) v1.Node {
	n := v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: v1.NodeInternalIP, Address: a})
	}
	return n
}

func lb(ns, name string, policy v1.ServiceExternalTrafficPolicy, vips ...string) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: policy}}
	for _, v := range vips {
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: v})
	}
	return s
}

func TestWhy(t *testing.T) {
	statuses := []vipcastv1alpha1.SpeakerStatus{
		status("node-b", vipcastv1alpha1.SpeakerStatusStatus{
			AnnouncedCount: 1, Announced: []string{"198.51.100.0/24"},
			NotAnnouncedCount: 1, NotAnnounced: []vipcastv1alpha1.NotAnnounced{{Reason: localWhy, Services: []string{"web/local"}}},
		}),
		status("node-a", vipcastv1alpha1.SpeakerStatusStatus{
			AnnouncedCount: 3, Announced: []string{"198.51.100.0/24", "198.51.100.7/32", "2001:db8::7/128"},
		}),
		status("node-c", vipcastv1alpha1.SpeakerStatusStatus{
			SessionsConfigured: 1,
			Sessions:           []vipcastv1alpha1.SpeakerSession{{Peer: "tor", State: "Idle", LastError: "vipcast-speaker stopped"}},
		}),
		status("node-d", vipcastv1alpha1.SpeakerStatusStatus{AnnouncedCount: 20000, Announced: []string{"10.0.0.1/32"}}),
	}
	nodes := []v1.Node{node("node-a", "10.0.0.2", "fd00::2"), node("node-b", "10.0.0.3"), node("node-c"), node("node-d"), node("node-e")}

	local := lb("web", "local", v1.ServiceExternalTrafficPolicyLocal, "198.51.100.7", "2001:db8::7")
	want := []NodeAnswer{
		// The longest covering prefix; one next hop per family.
		{Node: "node-a", Announced: []string{"198.51.100.7/32", "2001:db8::7/128"}, NextHops: []string{"10.0.0.2", "fd00::2"}},
		// Listed with a reason; the /24 it announces for other Services
		// covers the IPv4 VIP and is shown as it is.
		{Node: "node-b", Announced: []string{"198.51.100.0/24"}, NextHops: []string{"10.0.0.3"}, Why: localWhy},
		{Node: "node-c", Why: "vipcast-speaker stopped"},
		{Node: "node-d", Why: "not in the node's list of announced prefixes, which stops at 1 of 20000"},
		{Node: "node-e", Why: "no SpeakerStatus: no vipcast-speaker has run on this node"},
	}
	if got := Why(local, statuses, nodes); !reflect.DeepEqual(got, want) {
		t.Errorf("Why =\n%+v\nwant\n%+v", got, want)
	}

	pending := lb("web", "pending", v1.ServiceExternalTrafficPolicyCluster)
	for _, a := range Why(pending, statuses[:1], nil) {
		if a.Why != "the Service has no VIP in its status" {
			t.Errorf("a Service without a VIP: %+v", a)
		}
	}
	other := lb("web", "other", "", "203.0.113.9")
	if got := Why(other, statuses[1:2], nil); len(got) != 1 || !strings.HasPrefix(got[0].Why, "no route for 203.0.113.9") {
		t.Errorf("a VIP no node lists: %+v", got)
	}
}

func TestPrint(t *testing.T) {
	var buf bytes.Buffer
	svc := lb("web", "local", v1.ServiceExternalTrafficPolicyLocal, "198.51.100.7")
	if err := PrintWhy(&buf, svc, []NodeAnswer{
		{Node: "node-a", Announced: []string{"198.51.100.7/32"}, NextHops: []string{"10.0.0.2"}},
		{Node: "node-b", Why: localWhy},
	}); err != nil {
		t.Fatal(err)
	}
	want := `Service web/local: VIPs 198.51.100.7, externalTrafficPolicy Local
NODE    ANNOUNCED        NEXT HOP  WHY NOT
node-a  198.51.100.7/32  10.0.0.2  -
node-b  -                -         ` + localWhy + `
`
	if buf.String() != want {
		t.Errorf("PrintWhy:\n%s\nwant\n%s", buf.String(), want)
	}

	buf.Reset()
	if err := PrintPeers(&buf, []vipcastv1alpha1.SpeakerStatus{
		status("node-b", vipcastv1alpha1.SpeakerStatusStatus{Sessions: []vipcastv1alpha1.SpeakerSession{{Peer: "tor-a", State: "Active", LastError: "connection refused",
			BFD: "Down", BFDDiagnostic: "control detection time expired"}}}),
		status("node-a", vipcastv1alpha1.SpeakerStatusStatus{Sessions: []vipcastv1alpha1.SpeakerSession{
			{Peer: "tor-b", State: "Established", LastError: "old"}, {Peer: "tor-a", State: "Established", BFD: "Up"}}}),
	}); err != nil {
		t.Fatal(err)
	}
	want = `NODE    tor-a                                                                  tor-b
node-a  Established, BFD Up                                                    Established
node-b  Active (connection refused), BFD Down: control detection time expired  -
`
	if buf.String() != want {
		t.Errorf("PrintPeers:\n%q\nwant\n%q", buf.String(), want)
	}
}
